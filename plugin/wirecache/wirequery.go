package wirecache

import (
	"encoding/binary"
	"unsafe"

	"github.com/coredns/coredns/plugin/pkg/edns"

	"github.com/miekg/dns"
)

// maxFastQuery is the longest datagram the fast path reads a query from: miekg/dns's UDP server reads into
// buffers of dns.MinMsgSize bytes (Server.UDPSize, which CoreDNS leaves unset), so a longer datagram reaches
// CoreDNS cut short, and only the plugin chain may answer it.
const maxFastQuery = dns.MinMsgSize

// wireQuery is the presentation-format question name parseWireQuery builds, kept with the query so that
// query.name can point into it without an allocation.
type wireQuery struct {
	q    query
	name [maxKeyName]byte
	// badVersion says that parseWireQuery refused the query only for its EDNS version, above 0, which
	// CoreDNS's server answers with BADVERS before any plugin (badVersionReply); questionEnd is where its
	// question ends.
	badVersion  bool
	questionEnd int
}

// parseWireQuery reads a query from its wire format, as parseQuery reads it from the dns.Msg that
// miekg/dns unpacks from the same bytes, and writes its key into key. It also checks what CoreDNS's server
// checks before any plugin sees a query (class IN, EDNS version 0, one question, nothing but an OPT in the
// additional section). ok is false for anything it does not read exactly as miekg/dns and parseQuery would:
// such a query goes to CoreDNS's server, whose answer is then the right one by definition.
//
// wq.q.name points into wq.name: it is valid until wq is reused.
func parseWireQuery(b []byte, wq *wireQuery, key *[keyLen]byte) (n int, ok bool) {
	wq.badVersion = false
	if len(b) < headerLen || len(b) > maxFastQuery {
		return 0, false
	}
	// QR clear, opcode QUERY: the third byte's top five bits; the other header bits are kept or ignored as
	// miekg/dns and parseQuery keep or ignore them.
	if b[2]&0xf8 != 0 {
		return 0, false
	}
	h := wireHeader(b)
	if h.Qdcount != 1 || h.Ancount != 0 || h.Nscount != 0 || h.Arcount > 1 {
		return 0, false
	}
	q := &wq.q
	*q = query{id: h.Id, rd: b[2]&flagRD != 0}
	if b[3]&flagCD != 0 {
		q.flags |= keyCD
	}
	if b[3]&flagAD != 0 {
		q.flags |= keyAD
	}

	// The question name, uncompressed, in labels of letters, digits, hyphens and underscores only: miekg/dns
	// writes those bytes as they are, and escapes others in the presentation format parseQuery keys on.
	off, l := headerLen, 0
	for {
		if off >= len(b) {
			return 0, false
		}
		labelLen := int(b[off])
		off++
		if labelLen == 0 {
			break
		}
		if labelLen > 63 || off+labelLen > len(b) || l+labelLen+1 > maxKeyName {
			return 0, false
		}
		for _, c := range b[off : off+labelLen] {
			lower := c
			switch {
			case 'a' <= c && c <= 'z', '0' <= c && c <= '9', c == '-', c == '_':
			case 'A' <= c && c <= 'Z':
				lower = c + 'a' - 'A'
			default:
				return 0, false
			}
			wq.name[l] = c
			key[l] = lower
			l++
		}
		wq.name[l] = '.'
		key[l] = '.'
		l++
		off += labelLen
	}
	if l == 0 {
		wq.name[0], key[0] = '.', '.'
		l = 1
	}
	// miekg/dns refuses names longer than 255 bytes in wire format.
	if off-headerLen > 255 || off+4 > len(b) {
		return 0, false
	}
	q.qtype, q.qclass = binary.BigEndian.Uint16(b[off:]), binary.BigEndian.Uint16(b[off+2:])
	off += 4
	// CoreDNS's server refuses other classes (unless a chaos plugin is loaded), and parseQuery leaves zone
	// transfers and DS (which the server routes to the parent zone) to the chain.
	if q.qclass != dns.ClassINET || q.qtype == dns.TypeAXFR || q.qtype == dns.TypeIXFR || q.qtype == dns.TypeDS {
		return 0, false
	}
	q.name = unsafe.String(&wq.name[0], l)
	questionEnd := off

	if h.Arcount == 1 {
		// The OPT record: root owner, type OPT, class the payload size, TTL the extended RCODE, version
		// and flags, then the options.
		if off+11 > len(b) || b[off] != 0 || binary.BigEndian.Uint16(b[off+1:]) != dns.TypeOPT {
			return 0, false
		}
		udpSize := binary.BigEndian.Uint16(b[off+3:])
		ttl := binary.BigEndian.Uint32(b[off+5:])
		rdlen := int(binary.BigEndian.Uint16(b[off+9:]))
		off += 11
		if off+rdlen != len(b) {
			return 0, false
		}
		if !wireOptionsDropped(b[off:]) {
			return 0, false
		}
		off += rdlen
		// A version above 0 gets BADVERS from the server before any plugin (edns.Version), whatever the
		// question asks: a query miekg/dns unpacks whole (the record ends the datagram, its options are
		// well formed) is answered as the server answers it.
		if uint8(ttl>>16) != 0 {
			wq.badVersion, wq.questionEnd = true, questionEnd
			return 0, false
		}
		q.edns = true
		q.flags |= keyEDNS
		q.udpSize = udpSize
		q.optTTL = ttl & 0xff00
		if ttl&0x8000 != 0 {
			q.flags |= keyDO
		}
	}
	if off != len(b) {
		// Bytes after the last record: miekg/dns may ignore them, but nothing here promises it.
		return 0, false
	}

	n = l
	binary.BigEndian.PutUint16(key[n:], q.qtype)
	binary.BigEndian.PutUint16(key[n+2:], q.qclass)
	key[n+4] = q.flags
	return n + 5, true
}

// badVersionReply appends to out the reply CoreDNS's server gives query b, which parseWireQuery refused for
// its EDNS version alone (wq.badVersion): edns.Version's message as miekg/dns packs it. Its header is the
// query's ID, QR, opcode QUERY, the query's RD and CD (dns.Msg.SetReply) and rcode BADVERS's low bits, one
// question and one record; the question is the query's bytes (uncompressed, as parseWireQuery read it, which
// is how miekg/dns packs it again); the record is an OPT of version 0 with no payload size, flags or options
// and BADVERS's high bits as its extended rcode.
func badVersionReply(out, b []byte, wq *wireQuery) []byte {
	out = append(out, b[0], b[1], 0x80|b[2]&flagRD, b[3]&flagCD|dns.RcodeBadVers&0xf, 0, 1, 0, 0, 0, 0, 0, 1)
	out = append(out, b[headerLen:wq.questionEnd]...)
	return append(out, 0, byte(dns.TypeOPT>>8), byte(dns.TypeOPT), 0, 0, dns.RcodeBadVers>>4, 0, 0, 0, 0, 0)
}

// badVersionReplyLen bounds badVersionReply's length: a header, a question of the longest name and an OPT.
const badVersionReplyLen = headerLen + 255 + 4 + 11

// flagAD is the AD bit, in the fourth header byte.
const flagAD = 0x20

// wireHeader reads the header of the datagram b, at least headerLen bytes, as miekg/dns's server reads it
// before its accept function looks at it.
func wireHeader(b []byte) dns.Header {
	return dns.Header{
		Id: binary.BigEndian.Uint16(b), Bits: binary.BigEndian.Uint16(b[2:]),
		Qdcount: binary.BigEndian.Uint16(b[4:]), Ancount: binary.BigEndian.Uint16(b[6:]),
		Nscount: binary.BigEndian.Uint16(b[8:]), Arcount: binary.BigEndian.Uint16(b[10:]),
	}
}

// wireOptionsDropped is optionsDropped for the options of an OPT record in wire format: each one well formed,
// as miekg/dns unpacks it (optionUnpacks), and none registered by a plugin.
func wireOptionsDropped(rdata []byte) bool {
	for len(rdata) > 0 {
		if len(rdata) < 4 {
			return false
		}
		code, l := binary.BigEndian.Uint16(rdata), int(binary.BigEndian.Uint16(rdata[2:]))
		if 4+l > len(rdata) {
			return false
		}
		if !optionUnpacks(code, rdata[4:4+l]) || edns.SupportedOption(code) {
			return false
		}
		rdata = rdata[4+l:]
	}
	return true
}

// optionUnpacks reports whether miekg/dns unpacks data as the option code: most codes at any length, a few
// only at the lengths and values their type allows (its unpack methods), without which it refuses the whole
// query (FORMERR from the server). The reporting channel's agent domain, a name, is left to miekg/dns: such
// a query goes to the chain. TestOptionUnpacksAsMiekg holds this to miekg/dns for every code.
func optionUnpacks(code uint16, data []byte) bool {
	switch code {
	case dns.EDNS0LLQ:
		return len(data) >= 18
	case dns.EDNS0UL:
		return len(data) == 4 || len(data) == 8
	case dns.EDNS0SUBNET:
		if len(data) < 4 {
			return false
		}
		family, source, scope := binary.BigEndian.Uint16(data), data[2], data[3]
		switch family {
		case 0:
			return source == 0
		case 1:
			return source <= 32 && scope <= 32
		case 2:
			return source <= 128 && scope <= 128
		}
		return false
	case dns.EDNS0EXPIRE:
		return len(data) == 0 || len(data) >= 4
	case dns.EDNS0TCPKEEPALIVE:
		return len(data) == 0 || len(data) == 2
	case dns.EDNS0EDE, dns.EDNS0ZONEVERSION:
		return len(data) >= 2
	case dns.EDNS0REPORTING:
		return false
	}
	return true
}
