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

// form locates one packed rendering of a stored answer, without an OPT record, in its entry's data: the
// answer's bytes in [at, ttlAt), then up to end the offset of the TTL field of each of its records, two bytes
// each, big-endian. The zero form is no form.
type form struct{ at, ttlAt, end uint16 }

// entry is an answer packed once by the plugin chain's rules and replayed to every matching query until
// it expires. Its answer is never modified after it is built, so hits read it without locking; only its
// atomic marks change. Everything of variable size is in one allocation (data), and the fields are packed,
// so that an entry costs two allocations besides the store's map slot.
type entry struct {
	// data holds, one after another: the key (the lowered question name, type, class and key flags the
	// entry answers, see queryKey), the question name as the stored answer spells it when that differs from
	// the key's name, the plain form and the compressed form when it is not the plain one.
	data []byte

	// stored is when the entry was stored, as the time since clockBase (a time.Time would take 24 bytes,
	// one of them a pointer); lifetime is how long after that it is fresh.
	stored   time.Duration
	lifetime time.Duration

	// refresh is set while a query of the expired entry asks the chain in the background (serve_stale's
	// WAIT), so that one refresh at a time runs for it, and its channel is closed when that refresh ends, for
	// the queries that wait on it; asked counts the lookups that found the entry, up to maxAsked, less one
	// for each time every protected entry of its shard lost one (see shard.victim).
	refresh atomic.Pointer[chan struct{}]
	asked   atomic.Uint32

	// ttlFloor is the least TTL a hit serves: the MIN of the clamp window the answer belongs to when the
	// block's clamp applies to it, 0 otherwise. Set before the entry is stored.
	ttlFloor uint32
	// optTTL holds the flags of the chain's own OPT record when it carried one (optFromChain): CoreDNS then
	// keeps those instead of echoing the client's.
	optTTL uint32
	// bytes is the memory the entry holds, as the store counts it against its budget (see footprint).
	bytes uint32
	// metricsZone is the index of the zone the block's prometheus plugin labels its query with (see
	// metricsZone), set before the entry is stored when hits are counted in CoreDNS's series; chainLen is the
	// length of the chain's reply as the prometheus plugin measures it (dns.Msg.Len before the server adds
	// the client's OPT, truncates or compresses it), set with metricsZone.
	metricsZone int32
	chainLen    int32

	// keyEnd ends the key in data; the question name as stored is data[nameAt:nameEnd] (within the key when
	// it is spelled as the key's lowered name), and qnameEnd is the offset just past it in the packed answer.
	keyEnd, nameAt, nameEnd, qnameEnd uint16
	plain                             form
	// compressed is set when an answer of this size can need compression (it is then plain when compression
	// saves nothing); the zero form otherwise.
	compressed form

	optFromChain bool
	// rcode is the answer's (NOERROR or NXDOMAIN).
	rcode uint8
}

// key returns the key e answers.
func (e *entry) key() []byte { return e.data[:e.keyEnd:e.keyEnd] }

// qname returns the question name as the stored answer spells it.
func (e *entry) qname() []byte { return e.data[e.nameAt:e.nameEnd:e.nameEnd] }

// wire returns the packed answer of the form f.
func (e *entry) wire(f form) []byte { return e.data[f.at:f.ttlAt:f.ttlAt] }

// ttlOffsets returns the offsets of the TTL fields of the form f, two bytes each.
func (e *entry) ttlOffsets(f form) []byte { return e.data[f.ttlAt:f.end:f.end] }

// hasCompressed reports whether e keeps a compressed form.
func (e *entry) hasCompressed() bool { return e.compressed.end != 0 }

// clockBase is the instant entries count their time from (entry.stored), read once; with both readings
// taken from time.Now the differences use the monotonic clock.
var clockBase = time.Now()

// age returns how long before now e was stored.
func (e *entry) age(now time.Time) time.Duration { return now.Sub(clockBase) - e.stored }

// expired reports whether e's lifetime has run out at now.
func (e *entry) expired(now time.Time) bool { return e.age(now) >= e.lifetime }

// answers reports whether e answers with data or its denial, not a failure held (SERVFAIL, REFUSED): only
// those are served stale.
func (e *entry) answers() bool { return isAnswer(int(e.rcode)) }

// isAnswer reports whether rcode gives data or its denial (NOERROR or NXDOMAIN), as opposed to a failure.
func isAnswer(rcode int) bool { return rcode == dns.RcodeSuccess || rcode == dns.RcodeNameError }

// staleBeyond reports whether e expired more than d before now.
func (e *entry) staleBeyond(now time.Time, d time.Duration) bool { return e.age(now) >= e.lifetime+d }

// Reasons an answer is not stored. They are never shown to clients; tests check them.
var (
	errNotResponse   = errors.New("not a response to the query")
	errTruncated     = errors.New("truncated")
	errRcode         = errors.New("rcode is neither NOERROR nor NXDOMAIN, nor a failure to hold")
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

// lifetimes bound how long an answer is held: a NOERROR or NXDOMAIN answer by the smallest TTL it carries,
// moved into [min, max]; a REFUSED or SERVFAIL one, which carries none, for refused or servfail (never when
// zero).
type lifetimes struct {
	min, max, refused, servfail time.Duration
}

// failure returns how long an answer with rcode, a failure, is held: 0 for one never held.
func (lt lifetimes) failure(rcode int) time.Duration {
	switch rcode {
	case dns.RcodeRefused:
		return lt.refused
	case dns.RcodeServerFailure:
		return lt.servfail
	}
	return 0
}

// newEntry packs m, the answer the plugin chain wrote for q, as CoreDNS's server would before fitting it to a
// client, and bounds its lifetime by lt. It packs m into buf when it fits (dns.Msg.PackBuffer), and copies
// what it keeps into the entry.
func newEntry(m *dns.Msg, q *query, key string, now time.Time, lt lifetimes, buf []byte) (*entry, error) {
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
	var heldFailure time.Duration
	if !isAnswer(m.Rcode) {
		if heldFailure = lt.failure(m.Rcode); heldFailure == 0 {
			return nil, errRcode
		}
	}

	extra, opt, err := splitOPT(m.Extra)
	if err != nil {
		return nil, err
	}
	e := &entry{stored: now.Sub(clockBase), rcode: uint8(m.Rcode)} // #nosec G115 -- NOERROR, NXDOMAIN, SERVFAIL or REFUSED
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

	if heldFailure > 0 {
		e.lifetime = heldFailure
	} else if e.lifetime, err = lifetimeOf(m, extra, lt.min, lt.max); err != nil {
		return nil, err
	}

	// Pack a shallow copy without the OPT record: the records are shared with the writer of m and only read.
	bare := *m
	bare.Extra = extra
	bare.Compress = false
	plain, err := bare.PackBuffer(buf)
	if err != nil {
		return nil, fmt.Errorf("packing the answer: %w", err)
	}
	if len(plain) > maxEntryWire {
		return nil, errTooLarge
	}
	records := len(m.Answer) + len(m.Ns) + len(extra)
	qnameEnd, err := skipName(plain, headerLen)
	if err != nil {
		return nil, err
	}

	// Every reason CoreDNS compresses a reply (it does not fit, or a UDP reply above 1220 or 1480 bytes)
	// needs a reply longer than the smallest buffer, so smaller answers never need the compressed form.
	var compressed []byte
	if len(plain)+optLen > udpMinSize {
		bare.Compress = true
		if compressed, err = bare.Pack(); err != nil {
			return nil, fmt.Errorf("packing the answer compressed: %w", err)
		}
		if string(compressed) == string(plain) {
			compressed = plain
		}
	}

	// One allocation of exactly the size needed: the key, the name when the key does not start with it as
	// the answer spells it (a client that asked in other case than the answer's), the forms.
	name := mq.Name
	if len(key) == len(name)+5 && strings.HasPrefix(key, name) { // the name, type, class and flags
		name = ""
	}
	size := len(key) + len(name) + len(plain) + 2*records
	if compressed != nil && &compressed[0] != &plain[0] {
		size += len(compressed) + 2*records
	}
	e.data = make([]byte, 0, size)
	e.data = append(e.data, key...)
	e.data = append(e.data, name...)
	// #nosec G115 -- the key and the name are at most keyLen and maxKeyName long
	e.keyEnd, e.nameAt, e.nameEnd = uint16(len(key)), 0, uint16(len(mq.Name))
	if name != "" {
		e.nameAt, e.nameEnd = e.keyEnd, uint16(len(e.data)) // #nosec G115 -- as above
	}
	if e.plain, err = e.appendForm(plain, records); err != nil {
		return nil, err
	}
	e.qnameEnd = uint16(qnameEnd) // #nosec G115 -- within plain, at most maxEntryWire long
	switch {
	case compressed == nil:
	case &compressed[0] == &plain[0]:
		e.compressed = e.plain
	default:
		if e.compressed, err = e.appendForm(compressed, records); err != nil {
			return nil, fmt.Errorf("compressed form: %w", err)
		}
	}
	e.bytes = e.footprint()
	return e, nil
}

// appendForm appends wire, a packed answer of records records besides an OPT, and the offsets of its
// TTL fields to e.data, and returns where they are.
func (e *entry) appendForm(wire []byte, records int) (form, error) {
	f := form{at: uint16(len(e.data))} // #nosec G115 -- data is at most maxEntryBytes long
	e.data = append(e.data, wire...)
	f.ttlAt = uint16(len(e.data)) // #nosec G115 -- as above
	var err error
	if e.data, err = appendTTLOffsets(e.data, wire); err != nil {
		return form{}, err
	}
	f.end = uint16(len(e.data)) // #nosec G115 -- as above
	if got := int(f.end-f.ttlAt) / 2; got != records {
		return form{}, fmt.Errorf("%w: %d records packed, %d expected", errMalformedWire, got, records)
	}
	return f, nil
}

// Bounds on what one entry holds, for the store's byte budget: a record takes at least 11 bytes (root owner,
// type, class, TTL, RDLENGTH), and its TTL's offset two more in each form.
const (
	maxEntryRecords = (maxEntryWire - headerLen) / 11
	// entryOverhead is what an entry holds besides its data: the entry itself, the store's map slot and the
	// allocator's rounding of the two allocations. BenchmarkEntryMemory: counted 318, 341 and 5518 bytes
	// where the heap grew by 302, 334 and 5502.
	entryOverhead = int64(unsafe.Sizeof(entry{})) + 48
	// maxEntryBytes is the largest footprint an entry can have.
	maxEntryBytes = entryOverhead + keyLen + maxKeyName + 2*(maxEntryWire+2*maxEntryRecords)
)

// footprint returns the heap bytes e holds: what the store counts against its budget.
func (e *entry) footprint() uint32 {
	return uint32(entryOverhead) + uint32(cap(e.data)) // #nosec G115 -- at most maxEntryBytes
}

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

// appendTTLOffsets appends to dst the offset of the TTL field of every record in the packed message msg,
// two bytes each, big-endian, except OPT records, whose TTL field holds the extended RCODE, the EDNS version
// and flags.
func appendTTLOffsets(dst, msg []byte) ([]byte, error) {
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
	for range rrs {
		if off, err = skipName(msg, off); err != nil {
			return nil, err
		}
		if off+10 > len(msg) {
			return nil, errMalformedWire
		}
		if binary.BigEndian.Uint16(msg[off:]) != dns.TypeOPT {
			dst = binary.BigEndian.AppendUint16(dst, uint16(off+4)) // #nosec G115 -- off < len(msg) <= 65535
		}
		off += 10 + int(binary.BigEndian.Uint16(msg[off+8:]))
	}
	if off != len(msg) {
		return nil, errMalformedWire
	}
	return dst, nil
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
// least len(e.wire(e.plain))+optLen long.
func (e *entry) render(buf []byte, q *query, c client, now time.Time) (out []byte, ok bool) {
	age := e.age(now)
	if age >= e.lifetime {
		return nil, false
	}
	elapsed := uint32(age / time.Second) // #nosec G115 -- bounded by the lifetime, at most maxTTL
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
	plain := e.wire(e.plain)
	l := len(plain) + extra
	compress := l > size
	if !compress && !c.tcp {
		compress = (!c.v6 && l > udpCompressAboveV4) || (c.v6 && l > udpCompressAboveV6)
	}

	wire, ttlAt := plain, e.ttlOffsets(e.plain)
	sameCase := q.name == string(e.qname())
	if compress {
		// Name compression matches names case-sensitively, so the pointers CoreDNS would write depend on
		// how the client spelled the question. Only a client that spelled it as stored gets these bytes.
		if !e.hasCompressed() || !sameCase || int(e.compressed.ttlAt-e.compressed.at)+extra > size {
			return nil, false
		}
		wire, ttlAt = e.wire(e.compressed), e.ttlOffsets(e.compressed)
	}

	n := len(wire)
	out = buf[:n+extra]
	copy(out, wire)
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
		if err != nil || end != int(e.qnameEnd) {
			return nil, false
		}
	}

	for ; len(ttlAt) >= 2; ttlAt = ttlAt[2:] {
		// Both forms carry every record's TTL as stored; out has it from the copy.
		off := int(ttlAt[0])<<8 | int(ttlAt[1])
		at := out[off : off+4]
		ttl := binary.BigEndian.Uint32(at)
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
		binary.BigEndian.PutUint32(at, max(ttl, e.ttlFloor))
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

// positive reports whether e is a NOERROR answer with records in its answer section (ANCOUNT, bytes 6-7
// of the header).
func (e *entry) positive() bool {
	plain := e.wire(e.plain)
	return e.rcode == dns.RcodeSuccess && len(plain) >= headerLen && binary.BigEndian.Uint16(plain[6:8]) > 0
}
