//go:build linux

package hostile

import (
	"encoding/binary"
	"net"
	"strings"
	"time"

	"github.com/miekg/dns"
)

// oddCase is a sequence of queries asked of the cache and of the reference alike, the same bytes to both.
type oddCase struct {
	name    string
	queries []func(id uint16) []byte
	// timeout is how long an ask waits for its reply; default askTimeout.
	timeout time.Duration
	// transports are those the case is asked over; default udp, tcp and tcpSplit.
	transports []transport
}

// askTimeout is how long an ask waits for a reply that may not come: glibc's timeout, far above a reply's
// time on the simulated node (a miss takes a few milliseconds), however busy the machine.
const askTimeout = 5 * time.Second

// w is a name of its own for a case, under the zone's wildcard.
func w(label string) string { return label + ".w.default.svc.cluster.local." }

// header patches the query's header: its flag bytes (2 and 3) or counts.
func header(fn func(h []byte)) func([]byte) []byte {
	return func(b []byte) []byte {
		fn(b[:12])
		return b
	}
}

// optRR is an OPT record with a payload size of 1232 and no options, as bytes.
var optRR = []byte{0, 0, 41, 0x04, 0xd0, 0, 0, 0, 0, 0, 0}

// oddCases are the queries a misbehaving or hostile Pod sends, one case per oddity.
func oddCases() []oddCase {
	one := func(name string, q func(uint16) []byte) oddCase {
		return oddCase{name: name, queries: []func(uint16) []byte{q}}
	}
	in := uint16(dns.ClassINET)
	cases := []oddCase{
		// Ordinary queries, for the comparison to start from.
		one("A", msg(w("plain"), dns.TypeA, in)),
		one("A with EDNS", msg(w("plain-edns"), dns.TypeA, in, edns(1232))),
		one("hot name", msg("kubernetes.default.svc.cluster.local.", dns.TypeA, in)),
		one("NODATA", msg(w("nodata"), dns.TypeAAAA, in)),
		one("NXDOMAIN", msg("gone-hostile.default.svc.cluster.local.", dns.TypeA, in, edns(1232))),
		one("external name", msg("hostile.example.", dns.TypeA, in)),
		one("reverse zone", msg("7.2.244.10.in-addr.arpa.", dns.TypePTR, in)),
		one("root NS", msg(".", dns.TypeNS, in)),

		// The header.
		one("QDCOUNT 0", raw([]byte{0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0})),
		one("QDCOUNT 0 with OPT", raw(append([]byte{0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1}, optRR...))),
		one("QDCOUNT 2", msg(w("qd2"), dns.TypeA, in, func(m *dns.Msg) {
			m.Question = append(m.Question, dns.Question{Name: w("qd2-other"), Qtype: dns.TypeA, Qclass: in})
		})),
		one("QDCOUNT 2 of one question", msg(w("qd2-same"), dns.TypeA, in, func(m *dns.Msg) {
			m.Question = append(m.Question, m.Question[0])
		})),
		one("QDCOUNT 2 with one question", packed(msg(w("qd2-lie"), dns.TypeA, in), header(func(h []byte) { h[5] = 2 }))),
		one("ANCOUNT 1 with no answer", packed(msg(w("an1"), dns.TypeA, in), header(func(h []byte) { h[7] = 1 }))),
		one("QR set", packed(msg(w("qr"), dns.TypeA, in), header(func(h []byte) { h[2] |= 0x80 }))),
		one("opcode STATUS", packed(msg(w("op2"), dns.TypeA, in), header(func(h []byte) { h[2] = h[2]&^0x78 | 2<<3 }))),
		one("opcode NOTIFY", packed(msg(w("op4"), dns.TypeSOA, in), header(func(h []byte) { h[2] = h[2]&^0x78 | 4<<3 }))),
		one("opcode UPDATE", packed(msg(w("op5"), dns.TypeSOA, in), header(func(h []byte) { h[2] = h[2]&^0x78 | 5<<3 }))),
		one("opcode 15", packed(msg(w("op15"), dns.TypeA, in), header(func(h []byte) { h[2] = h[2]&^0x78 | 15<<3 }))),
		one("RD clear", packed(msg(w("rd0"), dns.TypeA, in), header(func(h []byte) { h[2] &^= 0x01 }))),
		one("TC set in a query", packed(msg(w("tc"), dns.TypeA, in), header(func(h []byte) { h[2] |= 0x02 }))),
		one("AA set in a query", packed(msg(w("aa"), dns.TypeA, in), header(func(h []byte) { h[2] |= 0x04 }))),
		one("Z bit", packed(msg(w("z"), dns.TypeA, in), header(func(h []byte) { h[3] |= 0x40 }))),
		one("AD and CD", packed(msg(w("adcd"), dns.TypeA, in), header(func(h []byte) { h[3] |= 0x30 }))),
		one("RCODE in a query", packed(msg(w("rcode"), dns.TypeA, in), header(func(h []byte) { h[3] |= 0x05 }))),

		// Classes and types.
		one("class CH", msg(w("ch"), dns.TypeA, dns.ClassCHAOS)),
		one("version.bind CH TXT", msg("version.bind.", dns.TypeTXT, dns.ClassCHAOS)),
		one("class 42", msg(w("class42"), dns.TypeA, 42)),
		one("class ANY", msg(w("classany"), dns.TypeA, dns.ClassANY)),
		one("class NONE", msg(w("classnone"), dns.TypeA, dns.ClassNONE)),
		one("class 65535", msg(w("class65535"), dns.TypeA, 65535)),
		one("type 0", msg(w("type0"), 0, in)),
		one("type 65280 (private use)", msg(w("type65280"), 65280, in)),
		one("type 65535", msg(w("type65535"), 65535, in)),
		one("type ANY", msg(w("any"), dns.TypeANY, in)),
		one("type AXFR", msg("cluster.local.", dns.TypeAXFR, in)),
		one("type IXFR", msg("cluster.local.", dns.TypeIXFR, in)),
		one("type OPT", msg(w("opt"), dns.TypeOPT, in)),
		one("type DS", msg(w("ds"), dns.TypeDS, in)),
		one("type TXT", msg(w("txt"), dns.TypeTXT, in, edns(1232))),
		one("type SRV under underscores", msg("_dns._udp.w.default.svc.cluster.local.", dns.TypeSRV, in)),
		one("type NULL", msg(w("null"), dns.TypeNULL, in)),

		// EDNS.
		one("EDNS version 1", msg(w("v1"), dns.TypeA, in, edns(1232, func(o *dns.OPT) { o.SetVersion(1) }))),
		one("EDNS version 1 with DO", msg(w("v1do"), dns.TypeA, in, edns(4096, func(o *dns.OPT) { o.SetVersion(1); o.SetDo() }))),
		one("EDNS version 255", msg("kubernetes.default.svc.cluster.local.", dns.TypeA, in, edns(1232, func(o *dns.OPT) { o.SetVersion(255) }))),
		one("EDNS unknown option", msg(w("opt65001"), dns.TypeA, in, edns(1232, option(&dns.EDNS0_LOCAL{Code: 65001, Data: []byte("hostile")})))),
		one("EDNS unknown option on a hot name", msg("kubernetes.default.svc.cluster.local.", dns.TypeA, in, edns(1232, option(&dns.EDNS0_LOCAL{Code: 65001, Data: []byte("x")})))),
		one("EDNS NSID", msg(w("nsid"), dns.TypeA, in, edns(1232, option(&dns.EDNS0_NSID{Code: dns.EDNS0NSID})))),
		one("EDNS cookie", msg(w("cookie"), dns.TypeA, in, edns(1232, option(&dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "0102030405060708"})))),
		one("EDNS cookie of 5 bytes", msg(w("cookie5"), dns.TypeA, in, edns(1232, option(&dns.EDNS0_LOCAL{Code: dns.EDNS0COOKIE, Data: []byte{1, 2, 3, 4, 5}})))),
		one("EDNS padding", msg(w("padding"), dns.TypeA, in, edns(1232, option(&dns.EDNS0_PADDING{Padding: make([]byte, 64)})))),
		one("EDNS client subnet", msg(w("ecs"), dns.TypeA, in, edns(1232, option(&dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: 1, SourceNetmask: 24, Address: net.IPv4(10, 244, 0, 0).To4()})))),
		one("EDNS expire and keepalive", msg(w("expire"), dns.TypeA, in, edns(1232, option(&dns.EDNS0_EXPIRE{Code: dns.EDNS0EXPIRE, Empty: true}), option(&dns.EDNS0_TCP_KEEPALIVE{Code: dns.EDNS0TCPKEEPALIVE})))),
		one("EDNS extended error in a query", msg(w("ede"), dns.TypeA, in, edns(1232, option(&dns.EDNS0_EDE{InfoCode: dns.ExtendedErrorCodeOther, ExtraText: "hostile"})))),
		one("EDNS unknown flag", msg(w("flag"), dns.TypeA, in, edns(1232, func(o *dns.OPT) { o.SetZ(0x4000) }))),
		one("EDNS every unknown flag and DO", msg(w("flags"), dns.TypeA, in, edns(1232, func(o *dns.OPT) { o.SetZ(0x7fff); o.SetDo() }))),
		one("EDNS unknown flag on a hot name", msg("kubernetes.default.svc.cluster.local.", dns.TypeA, in, edns(1232, func(o *dns.OPT) { o.SetZ(0x0001) }))),
		one("EDNS DO", msg(w("do"), dns.TypeA, in, edns(1232, func(o *dns.OPT) { o.SetDo() }))),
		one("EDNS payload 0", msg(w("size0"), dns.TypeA, in, edns(0))),
		one("EDNS payload 511", msg(bigName, dns.TypeA, in, edns(511))),
		one("EDNS payload 65535", msg(w("size65535"), dns.TypeA, in, edns(65535))),
		one("two OPT records", msg(w("twoopt"), dns.TypeA, in, edns(1232), edns(4096))),
		one("OPT with an owner name", msg(w("optname"), dns.TypeA, in, edns(1232), func(m *dns.Msg) { m.Extra[0].Header().Name = "hostile." })),
		one("OPT option longer than its record", packed(msg(w("optlen"), dns.TypeA, in, edns(1232, option(&dns.EDNS0_LOCAL{Code: 65001, Data: []byte("abcd")}))), func(b []byte) []byte {
			binary.BigEndian.PutUint16(b[len(b)-6:], 200) // the option's length
			return b
		})),
		one("EDNS extended RCODE in a query", msg(w("extrcode"), dns.TypeA, in, edns(1232, func(o *dns.OPT) { o.SetExtendedRcode(dns.RcodeBadVers) }))),

		// Sizes.
		one("600-byte query", msg(w("size600"), dns.TypeA, in, padTo(600))),
		one("1400-byte query", msg(w("size1400"), dns.TypeA, in, padTo(1400))),
		one("4000-byte query", msg(w("size4000"), dns.TypeA, in, padTo(4000))),
		one("60000-byte query", msg(w("size60000"), dns.TypeA, in, padTo(60000))),
		one("600-byte query of a hot name", msg("kubernetes.default.svc.cluster.local.", dns.TypeA, in, padTo(600))),
		one("976-byte answer without EDNS", msg(bigName, dns.TypeA, in)),
		one("976-byte answer with EDNS 1232", msg(bigName, dns.TypeA, in, edns(1232))),
		one("976-byte answer with EDNS 4096 and DO", msg(bigName, dns.TypeA, in, edns(4096, func(o *dns.OPT) { o.SetDo() }))),

		// Names.
		{name: "0x20 mixed case", queries: []func(uint16) []byte{
			msg("HoStIlE-0x20.W.DeFaUlT.SvC.ClUsTeR.LoCaL.", dns.TypeA, in),
			msg("hostile-0x20.w.default.svc.cluster.local.", dns.TypeA, in),
			msg("HOSTILE-0X20.W.DEFAULT.SVC.CLUSTER.LOCAL.", dns.TypeA, in, edns(1232)),
		}},
		{name: "0x20 mixed case, lower case first", queries: []func(uint16) []byte{
			msg("lower-0x20.w.default.svc.cluster.local.", dns.TypeA, in),
			msg("LoWeR-0x20.w.DeFaUlT.sVc.ClUsTeR.lOcAl.", dns.TypeA, in),
		}},
		{name: "0x20 mixed case of an external name", queries: []func(uint16) []byte{
			msg("HoStIlE-0x20.ExAmPlE.", dns.TypeA, in),
			msg("hostile-0x20.example.", dns.TypeA, in),
		}},
		{name: "0x20 mixed case of NXDOMAIN", queries: []func(uint16) []byte{
			msg("GoNe-0x20.DeFaUlT.sVc.ClUsTeR.lOcAl.", dns.TypeA, in),
			msg("gone-0x20.default.svc.cluster.local.", dns.TypeA, in),
		}},
		one("escaped dot in a label", msg(`a\.b.w.default.svc.cluster.local.`, dns.TypeA, in)),
		one("space and bytes above 127 in a label", msg(`a\032b\255.w.default.svc.cluster.local.`, dns.TypeA, in)),
		one("longest labels", msg(strings.Repeat("a", 63)+"."+strings.Repeat("b", 63)+"."+strings.Repeat("c", 63)+".w.default.svc.cluster.local.", dns.TypeA, in)),
		one("compression pointer to itself", raw([]byte{0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 12, 0, 1, 0, 1})),
		one("compression pointer forward into the question", raw(append([]byte{0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0},
			0xc0, 14, 1, 'w', 7, 'd', 'e', 'f', 'a', 'u', 'l', 't', 3, 's', 'v', 'c', 7, 'c', 'l', 'u', 's', 't', 'e', 'r', 5, 'l', 'o', 'c', 'a', 'l', 0, 0, 1, 0, 1))),

		// Not DNS.
		one("5 bytes", raw([]byte{0, 0, 1, 2, 3})),
		one("a header and noise", raw([]byte{0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xff, 0xfe, 0xfd, 0xfc, 0x3f, 0x01})),
		one("trailing bytes", packed(msg(w("trailing"), dns.TypeA, in), func(b []byte) []byte { return append(b, 1, 2, 3, 4, 5, 6, 7) })),
		one("empty", raw([]byte{})),
	}
	// The same oddities on a name every Pod asks, whose answer the cache holds from the first ask on: the
	// cache's hits (on the fast path, over UDP) must keep to what CoreDNS's server does with each.
	hot := "kubernetes.default.svc.cluster.local."
	hotA := msg(hot, dns.TypeA, in)
	cases = append(cases,
		oddCase{name: "hot name in mixed case", queries: []func(uint16) []byte{
			msg("KuBeRnEtEs.DeFaUlT.sVc.ClUsTeR.lOcAl.", dns.TypeA, in),
			msg("KUBERNETES.DEFAULT.SVC.CLUSTER.LOCAL.", dns.TypeA, in, edns(1232)),
			msg("kubernetes.default.svc.cluster.LOCAL.", dns.TypeAAAA, in),
		}},
		one("hot name, QR set", packed(hotA, header(func(h []byte) { h[2] |= 0x80 }))),
		one("hot name, opcode NOTIFY", packed(hotA, header(func(h []byte) { h[2] = h[2]&^0x78 | 4<<3 }))),
		one("hot name, opcode STATUS", packed(hotA, header(func(h []byte) { h[2] = h[2]&^0x78 | 2<<3 }))),
		one("hot name, RD clear", packed(hotA, header(func(h []byte) { h[2] &^= 0x01 }))),
		one("hot name, TC set", packed(hotA, header(func(h []byte) { h[2] |= 0x02 }))),
		one("hot name, AA set", packed(hotA, header(func(h []byte) { h[2] |= 0x04 }))),
		one("hot name, Z bit", packed(hotA, header(func(h []byte) { h[3] |= 0x40 }))),
		one("hot name, AD", packed(hotA, header(func(h []byte) { h[3] |= 0x20 }))),
		one("hot name, CD", packed(hotA, header(func(h []byte) { h[3] |= 0x10 }))),
		one("hot name, RCODE in a query", packed(hotA, header(func(h []byte) { h[3] |= 0x03 }))),
		one("hot name, ANCOUNT 1", packed(hotA, header(func(h []byte) { h[7] = 1 }))),
		one("hot name, ANCOUNT 2", packed(hotA, header(func(h []byte) { h[7] = 2 }))),
		one("hot name, NSCOUNT 1", packed(hotA, header(func(h []byte) { h[9] = 1 }))),
		one("hot name, NSCOUNT 2", packed(hotA, header(func(h []byte) { h[9] = 2 }))),
		one("hot name, ARCOUNT 1 and no record", packed(hotA, header(func(h []byte) { h[11] = 1 }))),
		one("hot name, ARCOUNT 3", msg(hot, dns.TypeA, in, edns(1232), edns(1232), edns(1232))),
		one("hot name, QDCOUNT 2", msg(hot, dns.TypeA, in, func(m *dns.Msg) { m.Question = append(m.Question, m.Question[0]) })),
		one("hot name, class CH", msg(hot, dns.TypeA, dns.ClassCHAOS)),
		one("hot name, class ANY", msg(hot, dns.TypeA, dns.ClassANY)),
		one("hot name, type ANY", msg(hot, dns.TypeANY, in)),
		one("hot name, type DS", msg(hot, dns.TypeDS, in)),
		one("hot name, trailing bytes", packed(hotA, func(b []byte) []byte { return append(b, 0, 0, 0) })),
		one("hot name, EDNS cookie", msg(hot, dns.TypeA, in, edns(1232, option(&dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "0102030405060708"})))),
		one("hot name, EDNS server cookie", msg(hot, dns.TypeA, in, edns(1232, option(&dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "0102030405060708" + "1112131415161718"})))),
		one("hot name, EDNS padding", msg(hot, dns.TypeA, in, edns(1232, option(&dns.EDNS0_PADDING{Padding: make([]byte, 100)})))),
		one("hot name, EDNS cookie and padding", msg(hot, dns.TypeA, in, edns(1232, option(&dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "0102030405060708"}), option(&dns.EDNS0_PADDING{Padding: make([]byte, 8)})))),
		one("hot name, EDNS DO", msg(hot, dns.TypeA, in, edns(1232, func(o *dns.OPT) { o.SetDo() }))),
		one("hot name, EDNS payload 0", msg(hot, dns.TypeA, in, edns(0))),
		one("hot name, EDNS version 1", msg(hot, dns.TypeA, in, edns(1232, func(o *dns.OPT) { o.SetVersion(1) }))),
		one("hot name, EDNS extended RCODE", msg(hot, dns.TypeA, in, edns(1232, func(o *dns.OPT) { o.SetExtendedRcode(dns.RcodeBadVers) }))),
		one("hot name, two OPT records", msg(hot, dns.TypeA, in, edns(1232), edns(512))),
		one("hot name, OPT with an owner name", msg(hot, dns.TypeA, in, edns(1232), func(m *dns.Msg) { m.Extra[0].Header().Name = "hostile." })),
		one("hot name, OPT with a TTL's worth of flags", msg(hot, dns.TypeA, in, edns(1232, func(o *dns.OPT) { o.Hdr.Ttl = 0xffffffff }))),
		one("hot name, 511-byte query", msg(hot, dns.TypeA, in, padTo(511))),
		one("hot name, 512-byte query", msg(hot, dns.TypeA, in, padTo(512))),
		one("hot name, 513-byte query", msg(hot, dns.TypeA, in, padTo(513))),
		one("hot name, 1232-byte query", msg(hot, dns.TypeA, in, padTo(1232))),
	)

	for _, kind := range brokenKinds {
		// The upstream takes up to its read timeout (2 s) to give up on a reply it cannot match, and
		// forward then asks again.
		cases = append(cases, oddCase{
			name:       "upstream reply " + kind,
			queries:    []func(uint16) []byte{msg(kind+brokenZone, dns.TypeA, in, edns(1232))},
			timeout:    12 * time.Second,
			transports: []transport{udp, tcp},
		})
	}
	return cases
}
