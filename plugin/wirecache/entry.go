package wirecache

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/coredns/coredns/plugin/pkg/response"
	"github.com/nodelocaldns/nodelocaldns/plugin/internal/answer"

	"github.com/miekg/dns"
)

const (
	headerLen = 12
	// optLen is the length of the OPT record a hit appends: root owner, type, class (payload size), TTL
	// (extended RCODE, version, flags) and an empty RDATA. Queries whose OPT carries an option that would
	// be echoed are not served from wirecache, so the OPT written on a hit never has options.
	optLen = 11
	// maxEntryWire bounds the packed size of a stored answer. Larger answers are left to the plugin chain.
	maxEntryWire = 4096
	// udpMinSize is the payload size a UDP client without EDNS gets (RFC 1035), and the least any
	// client gets (RFC 6891 section 6.2.5).
	udpMinSize = dns.MinMsgSize
	// CoreDNS compresses UDP replies above these sizes, even when they fit the client's buffer, to
	// avoid fragmentation (request.Request.Scrub).
	udpCompressAboveV4 = 1480
	udpCompressAboveV6 = 1220
)

// Header bits a hit takes from the query rather than from the stored answer.
const (
	flagRD = 0x01 // in the third header byte
	flagCD = 0x10 // in the fourth header byte
)

// form is one packed rendering of a stored answer, without an OPT record.
type form struct {
	wire []byte
	// ttlAt holds the offset of the TTL field of every record in wire.
	ttlAt []uint16
}

// entry is an answer packed once by the plugin chain's rules and replayed to every matching query until
// it expires. Its answer is never modified after it is built, so hits read it without locking; only its
// atomic marks change.
type entry struct {
	// key is the lowered question name, type, class and key flags the entry answers (see queryKey).
	key string
	// qname is the question name as the stored answer spells it; qnameEnd is the offset just past it.
	qname    string
	qnameEnd int

	plain form
	// compressed is set when an answer of this size can need compression (it is then plain's bytes
	// when compression saves nothing); nil otherwise.
	compressed *form
	// ttls holds the TTL of every record as stored, in the order of ttlAt.
	ttls []uint32
	// ttlFloor is the least TTL a hit serves: the MIN of the clamp window the answer belongs to when the
	// block's clamp applies to it, 0 otherwise. Set before the entry is stored.
	ttlFloor uint32
	// rcode is the answer's (NOERROR or NXDOMAIN); metricsZone is the index of the zone the block's
	// prometheus plugin labels its query with (see metricsZone), set before the entry is stored when hits
	// are counted in CoreDNS's series.
	rcode       int
	metricsZone int
	// chainLen is the length of the chain's reply as the prometheus plugin measures it (dns.Msg.Len before
	// the server adds the client's OPT, truncates or compresses it), set with metricsZone.
	chainLen int

	// optFromChain is set when the chain's answer carried its own OPT record; CoreDNS then keeps that
	// record's flags (optTTL) instead of echoing the client's.
	optFromChain bool
	optTTL       uint32

	stored  time.Time
	expires time.Time

	// bytes is the memory the entry holds, as the store counts it against its budget (see footprint).
	bytes int64

	// asked counts the lookups that found the entry, up to maxAsked, less one for each time every protected
	// entry of its shard lost one (see shard.victim); refreshing is held while a query of the expired entry asks the chain in the
	// background (serve_stale's WAIT), so that one refresh at a time runs for it.
	asked      atomic.Uint32
	refreshing atomic.Bool
}

// Reasons an answer is not stored. They are never shown to clients; tests check them.
var (
	errNotResponse   = errors.New("not a response to the query")
	errTruncated     = errors.New("truncated")
	errRcode         = errors.New("rcode is neither NOERROR nor NXDOMAIN")
	errResponseType  = errors.New("response type is not cacheable")
	errNoSOA         = errors.New("negative answer without SOA")
	errNotAnswer     = errors.New("NOERROR answer that neither answers the question nor carries an SOA")
	errEmptyNoError  = errors.New("NOERROR without records")
	errTSIG          = errors.New("signed with TSIG or SIG(0)")
	errOPT           = errors.New("OPT record that CoreDNS would not reproduce byte for byte")
	errZeroLifetime  = errors.New("lifetime of zero seconds")
	errTooLarge      = errors.New("larger than the entry size limit")
	errMalformedWire = errors.New("malformed wire format")
)

// newEntry packs m, the answer the plugin chain wrote for q, as CoreDNS's server would before fitting it to a
// client, and bounds its lifetime by the smallest TTL it carries, moved into [minTTL, maxTTL].
func newEntry(m *dns.Msg, q *query, key string, now time.Time, minTTL, maxTTL time.Duration) (*entry, error) {
	if !m.Response || m.Opcode != dns.OpcodeQuery || len(m.Question) != 1 {
		return nil, errNotResponse
	}
	mq := m.Question[0]
	if mq.Qtype != q.qtype || mq.Qclass != q.qclass || !strings.EqualFold(mq.Name, q.name) {
		return nil, errNotResponse
	}
	if m.Truncated {
		return nil, errTruncated
	}
	if m.Rcode != dns.RcodeSuccess && m.Rcode != dns.RcodeNameError {
		return nil, errRcode
	}

	extra, opt, err := splitOPT(m.Extra)
	if err != nil {
		return nil, err
	}
	e := &entry{key: key, qname: mq.Name, stored: now, rcode: m.Rcode}
	if opt != nil {
		// The server keeps an OPT the chain wrote, sets the client's payload size, clears the extended
		// RCODE and version, keeps the flags and adds DO when the client set it. Options would be kept
		// too; the cache plugin never writes them on its hits, so such answers are simply not stored.
		if !q.edns || len(opt.Option) > 0 {
			return nil, errOPT
		}
		e.optFromChain = true
		e.optTTL = opt.Hdr.Ttl & 0xff00
		if q.do() {
			e.optTTL |= 0x8000
		}
	}

	lifetime, err := lifetimeOf(m, extra, minTTL, maxTTL)
	if err != nil {
		return nil, err
	}
	e.expires = now.Add(lifetime)

	// Pack a shallow copy without the OPT record: the records are shared with the writer of m and only read.
	bare := *m
	bare.Extra = extra
	bare.Compress = false
	plain, err := packForm(&bare)
	if err != nil {
		return nil, err
	}
	if len(plain.wire) > maxEntryWire {
		return nil, errTooLarge
	}
	if want := len(m.Answer) + len(m.Ns) + len(extra); len(plain.ttlAt) != want {
		return nil, fmt.Errorf("%w: %d records packed, %d expected", errMalformedWire, len(plain.ttlAt), want)
	}
	e.plain = plain
	e.ttls = make([]uint32, len(plain.ttlAt))
	for i, off := range plain.ttlAt {
		e.ttls[i] = binary.BigEndian.Uint32(plain.wire[off:])
	}
	if e.qnameEnd, err = skipName(plain.wire, headerLen); err != nil {
		return nil, err
	}

	// Every reason CoreDNS compresses a reply (it does not fit, or a UDP reply above 1220 or 1480 bytes)
	// needs a reply longer than the smallest buffer, so smaller answers never need the compressed form.
	if len(plain.wire)+optLen > udpMinSize {
		bare.Compress = true
		compressed, err := packForm(&bare)
		if err != nil {
			return nil, err
		}
		if len(compressed.ttlAt) != len(plain.ttlAt) {
			return nil, fmt.Errorf("%w: compressed form has %d records, plain %d", errMalformedWire, len(compressed.ttlAt), len(plain.ttlAt))
		}
		if string(compressed.wire) == string(plain.wire) {
			compressed = plain
		}
		e.compressed = &compressed
	}
	e.bytes = e.footprint()
	return e, nil
}

// Bounds on what one entry holds, for the store's byte budget: a record takes at least 11 bytes (root owner,
// type, class, TTL, RDLENGTH), and a packed form's buffer is one byte longer than the uncompressed answer.
const (
	maxEntryRecords = (maxEntryWire - headerLen) / 11
	// entryOverhead is what an entry holds besides its variable parts: the entry itself, the compressed
	// form's header, the store's map slot and the allocator's rounding of the five to eight allocations.
	// BenchmarkEntryMemory: counted 560, 583 and 6717 bytes where the heap grew by 423, 454 and 6654.
	entryOverhead = int64(unsafe.Sizeof(entry{})+unsafe.Sizeof(form{})) + 96
	// maxEntryBytes is the largest footprint an entry can have.
	maxEntryBytes = entryOverhead + keyLen + maxKeyName + 2*(maxEntryWire+1+2*maxEntryRecords) + 4*maxEntryRecords
)

// footprint returns the heap bytes e holds: what the store counts against its budget.
func (e *entry) footprint() int64 {
	n := entryOverhead + int64(len(e.key)+len(e.qname)+4*cap(e.ttls)) + e.plain.footprint()
	if e.compressed != nil && &e.compressed.wire[0] != &e.plain.wire[0] {
		n += e.compressed.footprint()
	}
	return n
}

func (f *form) footprint() int64 { return int64(cap(f.wire) + 2*cap(f.ttlAt)) }

// splitOPT returns the additional section without its OPT record, and that record. An OPT that is not the
// last record, a second OPT, or a TSIG or SIG(0) record makes the answer unfit for storing.
func splitOPT(extra []dns.RR) ([]dns.RR, *dns.OPT, error) {
	var opt *dns.OPT
	for i, rr := range extra {
		switch rr.Header().Rrtype {
		case dns.TypeTSIG, dns.TypeSIG:
			return nil, nil, errTSIG
		case dns.TypeOPT:
			o, ok := rr.(*dns.OPT)
			// Truncation moves the OPT record to the end; an OPT elsewhere would be written in place
			// on an answer that fits, so the stored bytes and CoreDNS's would differ.
			if !ok || opt != nil || i != len(extra)-1 {
				return nil, nil, errOPT
			}
			opt = o
		}
	}
	if opt == nil {
		return extra, nil, nil
	}
	return extra[:len(extra)-1], opt, nil
}

// lifetimeOf returns how long m may be served: its smallest TTL (for a denial also the SOA's MINIMUM, RFC
// 2308 section 5) moved into [minTTL, maxTTL]. It refuses the answers the cache plugin refuses to cache.
func lifetimeOf(m *dns.Msg, extra []dns.RR, minTTL, maxTTL time.Duration) (time.Duration, error) {
	mt, _ := response.Typify(m, time.Now().UTC())
	switch mt {
	case response.NoError, response.NameError, response.NoData, response.Delegation:
	default:
		return 0, errResponseType
	}
	soa := findSOA(m.Ns)
	switch {
	case mt == response.NameError && soa == nil:
		return 0, errNoSOA
	case len(m.Answer) == 0 && len(m.Ns) == 0 && len(extra) == 0:
		return 0, errEmptyNoError
	case mt == response.NoError && len(m.Answer) > 0 && soa == nil && !answer.AnswersQuestion(m):
		return 0, errNotAnswer
	}
	// NXDOMAIN and NODATA, also at the end of a CNAME chain (RFC 2308 section 2.2), as clamp and the cache
	// plugin classify them.
	denial := answer.Classify(m) == answer.Denial

	smallest := uint32(maxTTL / time.Second)
	for _, section := range [][]dns.RR{m.Answer, m.Ns, extra} {
		for _, rr := range section {
			smallest = min(smallest, rr.Header().Ttl)
		}
	}
	if denial && soa != nil {
		smallest = min(smallest, soa.Minttl)
	}
	lifetime := min(max(time.Duration(smallest)*time.Second, minTTL), maxTTL)
	if lifetime < time.Second {
		return 0, errZeroLifetime
	}
	return lifetime, nil
}

func findSOA(ns []dns.RR) *dns.SOA {
	for _, rr := range ns {
		if soa, ok := rr.(*dns.SOA); ok {
			return soa
		}
	}
	return nil
}

// packForm packs m and finds the TTL field of each of its records.
func packForm(m *dns.Msg) (form, error) {
	wire, err := m.Pack()
	if err != nil {
		return form{}, fmt.Errorf("packing the answer: %w", err)
	}
	ttlAt, err := ttlOffsets(wire)
	if err != nil {
		return form{}, err
	}
	return form{wire: wire, ttlAt: ttlAt}, nil
}

// ttlOffsets returns the offset of the TTL field of every record in the packed message msg, except OPT
// records, whose TTL field holds the extended RCODE, the EDNS version and flags.
func ttlOffsets(msg []byte) ([]uint16, error) {
	if len(msg) < headerLen || len(msg) > dns.MaxMsgSize {
		return nil, errMalformedWire
	}
	qd := int(binary.BigEndian.Uint16(msg[4:]))
	rrs := int(binary.BigEndian.Uint16(msg[6:])) + int(binary.BigEndian.Uint16(msg[8:])) + int(binary.BigEndian.Uint16(msg[10:]))
	off := headerLen
	var err error
	for range qd {
		if off, err = skipName(msg, off); err != nil {
			return nil, err
		}
		off += 4 // type, class
	}
	offsets := make([]uint16, 0, rrs)
	for range rrs {
		if off, err = skipName(msg, off); err != nil {
			return nil, err
		}
		if off+10 > len(msg) {
			return nil, errMalformedWire
		}
		if binary.BigEndian.Uint16(msg[off:]) != dns.TypeOPT {
			offsets = append(offsets, uint16(off+4)) // #nosec G115 -- off < len(msg) <= 65535
		}
		off += 10 + int(binary.BigEndian.Uint16(msg[off+8:]))
	}
	if off != len(msg) {
		return nil, errMalformedWire
	}
	return offsets, nil
}

// skipName returns the offset just past the domain name that starts at off in msg.
func skipName(msg []byte, off int) (int, error) {
	for {
		if off >= len(msg) {
			return 0, errMalformedWire
		}
		c := int(msg[off])
		switch c & 0xC0 {
		case 0x00:
			if c == 0 {
				return off + 1, nil
			}
			off += 1 + c
		case 0xC0: // a compression pointer ends the name
			if off+2 > len(msg) {
				return 0, errMalformedWire
			}
			return off + 2, nil
		default:
			return 0, errMalformedWire
		}
	}
}

// client is what the server knows about where a reply goes, and which decides its size budget.
type client struct {
	tcp bool
	v6  bool
}

// render writes into buf the reply CoreDNS's server would write for q from this entry at time now, and
// returns it. ok is false when the entry cannot give that reply: it has expired, the reply would need
// truncation, or compression would depend on the case of the question name (see below). buf must be at
// least len(plain.wire)+optLen long.
func (e *entry) render(buf []byte, q *query, c client, now time.Time) (out []byte, ok bool) {
	if !now.Before(e.expires) {
		return nil, false
	}
	elapsed := uint32(now.Sub(e.stored) / time.Second) // #nosec G115 -- bounded by the lifetime, at most maxTTL
	return e.write(buf, q, c, elapsed, false, 0)
}

// renderStale is render for an entry that has expired: every TTL is ttl (but not below ttlFloor), the
// TTL a stale answer carries (RFC 8767 section 4).
func (e *entry) renderStale(buf []byte, q *query, c client, ttl uint32) (out []byte, ok bool) {
	return e.write(buf, q, c, 0, true, ttl)
}

// write builds the reply for q into buf. Every TTL counts down by elapsed seconds or, when fixed is set,
// is fixedTTL; either way not below ttlFloor.
func (e *entry) write(buf []byte, q *query, c client, elapsed uint32, fixed bool, fixedTTL uint32) (out []byte, ok bool) {
	extra := 0
	if q.edns {
		extra = optLen
	}
	// The budget and the compression rules of request.Request.Size, Scrub and dns.Msg.Truncate.
	size := dns.MaxMsgSize
	if !c.tcp {
		size = max(int(q.udpSize), udpMinSize)
	}
	l := len(e.plain.wire) + extra
	compress := l > size
	if !compress && !c.tcp {
		compress = (!c.v6 && l > udpCompressAboveV4) || (c.v6 && l > udpCompressAboveV6)
	}

	f := &e.plain
	sameCase := q.name == e.qname
	if compress {
		// Name compression matches names case-sensitively, so the pointers CoreDNS would write depend on
		// how the client spelled the question. Only a client that spelled it as stored gets these bytes.
		if e.compressed == nil || !sameCase || len(e.compressed.wire)+extra > size {
			return nil, false
		}
		f = e.compressed
	}

	n := len(f.wire)
	out = buf[:n+extra]
	copy(out, f.wire)
	binary.BigEndian.PutUint16(out[0:], q.id)
	out[2] &^= flagRD
	if q.rd {
		out[2] |= flagRD
	}
	out[3] &^= flagCD
	if q.cd() {
		out[3] |= flagCD
	}
	if !sameCase {
		// The same name in other case packs to the same length without compression.
		end, err := dns.PackDomainName(q.name, out, headerLen, nil, false)
		if err != nil || end != e.qnameEnd {
			return nil, false
		}
	}

	for i, at := range f.ttlAt {
		ttl := e.ttls[i]
		switch {
		case fixed:
			ttl = fixedTTL
		case ttl > elapsed:
			ttl -= elapsed
		default:
			ttl = 0
		}
		// clamp, behind wirecache, raises the TTLs of a cache hit to its MIN; a wirecache hit must not
		// count below what the chain would serve.
		binary.BigEndian.PutUint32(out[at:], max(ttl, e.ttlFloor))
	}

	if q.edns {
		opt := out[n:]
		opt[0] = 0 // root owner
		binary.BigEndian.PutUint16(opt[1:], dns.TypeOPT)
		binary.BigEndian.PutUint16(opt[3:], q.udpSize)
		optTTL := q.optTTL
		if e.optFromChain {
			optTTL = e.optTTL
		}
		binary.BigEndian.PutUint32(opt[5:], optTTL)
		binary.BigEndian.PutUint16(opt[9:], 0)
		binary.BigEndian.PutUint16(out[10:], binary.BigEndian.Uint16(out[10:])+1) // ARCOUNT
	}
	return out, true
}
