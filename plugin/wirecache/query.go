package wirecache

import (
	"encoding/binary"

	"github.com/coredns/coredns/plugin/pkg/edns"

	"github.com/miekg/dns"
)

// Key flags: the parts of a query, besides its question, that change the answer the plugin chain writes.
const (
	keyDO   = 1 << iota // DNSSEC records wanted (the cache plugin keys on it too)
	keyCD               // checking disabled (the cache plugin keys on it too)
	keyAD               // the cache plugin keeps the AD bit of a non-DO answer only for a query with AD set
	keyEDNS             // an OPT record in the query, so one in the reply
)

// maxKeyName bounds the question names wirecache keys, in presentation format. Longer names (possible only
// with many escaped bytes) are left to the plugin chain.
const maxKeyName = 256

// keyLen is the longest key: the lowered name, type, class and the key flags.
const keyLen = maxKeyName + 5

// query is what wirecache reads from a query: what it keys on and what it patches into a hit.
type query struct {
	name          string // question name as the client spelled it
	qtype, qclass uint16
	flags         uint8
	id            uint16
	rd            bool
	edns          bool
	udpSize       uint16 // payload size the client advertised, as sent (the server echoes it unchanged)
	optTTL        uint32 // the client's OPT TTL as the server echoes it: flags kept, RCODE and version cleared
}

func (q *query) do() bool { return q.flags&keyDO != 0 }
func (q *query) cd() bool { return q.flags&keyCD != 0 }

// parseQuery reads r and writes its key into key, returning the key's length. ok is false for a query
// whose reply wirecache cannot reproduce exactly: not a plain QUERY with one question, signed, a zone
// transfer, or carrying EDNS options the server would echo or that may change the answer.
func parseQuery(r *dns.Msg, key *[keyLen]byte) (q query, n int, ok bool) {
	if r.Response || r.Opcode != dns.OpcodeQuery || len(r.Question) != 1 {
		return q, 0, false
	}
	question := r.Question[0]
	if question.Qtype == dns.TypeAXFR || question.Qtype == dns.TypeIXFR || len(question.Name) > maxKeyName {
		return q, 0, false
	}
	q = query{name: question.Name, qtype: question.Qtype, qclass: question.Qclass, id: r.Id, rd: r.RecursionDesired}
	if r.CheckingDisabled {
		q.flags |= keyCD
	}
	if r.AuthenticatedData {
		q.flags |= keyAD
	}
	for _, rr := range r.Extra {
		opt, isOPT := rr.(*dns.OPT)
		if !isOPT || q.edns || !optionsDropped(opt) {
			// TSIG, SIG(0), a second OPT, or anything else the chain might act on.
			return q, 0, false
		}
		q.edns = true
		q.flags |= keyEDNS
		q.udpSize = opt.Hdr.Class
		q.optTTL = opt.Hdr.Ttl & 0xff00
		if opt.Hdr.Ttl&0x8000 != 0 {
			q.flags |= keyDO
		}
	}

	for i := range len(q.name) {
		c := q.name[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		key[i] = c
	}
	n = len(q.name)
	binary.BigEndian.PutUint16(key[n:], q.qtype)
	binary.BigEndian.PutUint16(key[n+2:], q.qclass)
	key[n+4] = q.flags
	return q, n + 5, true
}

// optionsDropped reports whether the server drops every option of the client's OPT from a reply built from
// the cache: request.Request.SizeAndDo keeps only the options a plugin registered (edns.SupportedOption), and
// *cache* answers a query whatever else it carries (NSID, client subnet, an unknown code), from the entry of
// the same question. A registered option goes through the plugin chain, whose reply keeps it. The plugins
// that act on an option without registering it (nsid, geoip) run ahead of wirecache, so they have seen the
// query, and the fast path, which skips them, does not run in their blocks (fastPathReasons).
func optionsDropped(opt *dns.OPT) bool {
	for _, o := range opt.Option {
		if edns.SupportedOption(o.Option()) {
			return false
		}
	}
	return true
}
