package wirecache

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/coredns/coredns/plugin/pkg/edns"

	"github.com/miekg/dns"
)

// agreesWithParseQuery checks parseWireQuery against what CoreDNS would do with the same bytes: wherever the
// wire parser accepts a query, miekg/dns unpacks it, CoreDNS's server would pass it to a plugin, and
// parseQuery reads the same query and key from it.
func agreesWithParseQuery(t *testing.T, b []byte) (accepted bool) {
	t.Helper()
	var wq wireQuery
	var wkey [keyLen]byte
	wn, ok := parseWireQuery(b, &wq, &wkey)
	if !ok {
		if wq.badVersion {
			repliesAsTheServer(t, b, &wq)
		}
		return false
	}
	m := new(dns.Msg)
	if err := m.Unpack(b); err != nil {
		t.Fatalf("parseWireQuery accepted %x, which miekg/dns does not unpack: %v", b, err)
	}
	if m.Question[0].Qclass != dns.ClassINET {
		t.Fatalf("parseWireQuery accepted class %d in %x", m.Question[0].Qclass, b)
	}
	if _, err := edns.Version(m); err != nil {
		t.Fatalf("parseWireQuery accepted %x, which the server answers with BADVERS", b)
	}
	if dns.DefaultMsgAcceptFunc(wireHeader(b)) != dns.MsgAccept {
		t.Fatalf("parseWireQuery accepted %x, which miekg/dns's server rejects", b)
	}
	var key [keyLen]byte
	q, n, ok := parseQuery(m, &key)
	if !ok {
		t.Fatalf("parseWireQuery accepted %x, which parseQuery refuses (%v)", b, m)
	}
	if q != wq.q {
		t.Fatalf("%x: parseWireQuery read %+v, parseQuery %+v", b, wq.q, q)
	}
	if !bytes.Equal(key[:n], wkey[:wn]) {
		t.Fatalf("%x: parseWireQuery keyed %q, parseQuery %q", b, wkey[:wn], key[:n])
	}
	return true
}

// repliesAsTheServer checks badVersionReply against the reply CoreDNS's server writes for b, which
// parseWireQuery refused for its EDNS version: b is a query miekg/dns's server accepts and unpacks, of class
// IN, and the reply is edns.Version's message as miekg/dns packs it, byte for byte.
func repliesAsTheServer(t *testing.T, b []byte, wq *wireQuery) {
	t.Helper()
	m := new(dns.Msg)
	if err := m.Unpack(b); err != nil {
		t.Fatalf("parseWireQuery answers %x with BADVERS, which miekg/dns does not unpack: %v", b, err)
	}
	if dns.DefaultMsgAcceptFunc(wireHeader(b)) != dns.MsgAccept || m.Question[0].Qclass != dns.ClassINET {
		t.Fatalf("parseWireQuery answers %x with BADVERS, which the server refuses first", b)
	}
	want, err := edns.Version(m)
	if err == nil {
		t.Fatalf("parseWireQuery answers %x with BADVERS, which the server passes on", b)
	}
	wire, err := want.Pack()
	if err != nil {
		t.Fatal(err)
	}
	if got := badVersionReply(nil, b, wq); !bytes.Equal(got, wire) {
		t.Fatalf("%x: BADVERS reply %x, the server's %x", b, got, wire)
	}
	if len(wire) > badVersionReplyLen {
		t.Fatalf("%x: BADVERS reply of %d bytes, above badVersionReplyLen", b, len(wire))
	}
}

// wireQueries returns queries of the shapes clients send, each packed by miekg/dns, and whether the fast path
// must read each.
func wireQueries(t *testing.T) (queries [][]byte, plain []bool) {
	t.Helper()
	add := func(m *dns.Msg, fast bool) {
		b, err := m.Pack()
		if err != nil {
			t.Fatal(err)
		}
		queries, plain = append(queries, b), append(plain, fast)
	}
	names := []string{"www.example.org.", "WwW.ExAmple.ORG.", "svc-1.default.svc.cluster.local.", "_sip._udp.example.org.", ".", "x."}
	for _, name := range names {
		for _, qtype := range []uint16{dns.TypeA, dns.TypeAAAA, dns.TypeSRV, dns.TypePTR, dns.TypeHTTPS, dns.TypeANY} {
			for _, size := range []uint16{0, 512, 1232, 4096} {
				for _, do := range []bool{false, true} {
					if size == 0 && do {
						continue
					}
					m := newQuery(name, qtype, size, do)
					m.Id = uint16(len(queries))
					m.CheckingDisabled = qtype == dns.TypeSRV
					m.AuthenticatedData = qtype == dns.TypeHTTPS
					m.RecursionDesired = qtype != dns.TypePTR
					add(m, true)
				}
			}
		}
	}
	withOptions := func(options ...dns.EDNS0) *dns.Msg {
		m := newQuery("www.example.org.", dns.TypeA, 1232, false)
		m.IsEdns0().Option = options
		return m
	}
	add(withOptions(&dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "0123456789abcdef"}), true)
	add(withOptions(&dns.EDNS0_PADDING{Padding: make([]byte, 40)}), true)
	add(withOptions(&dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: 1, SourceNetmask: 24, Address: []byte{192, 0, 2, 0}}), true)
	add(withOptions(&dns.EDNS0_NSID{Code: dns.EDNS0NSID}), true)
	add(withOptions(&dns.EDNS0_LOCAL{Code: 65001, Data: []byte("any")}, &dns.EDNS0_EXPIRE{Code: dns.EDNS0EXPIRE, Empty: true}), true)
	add(withOptions(&dns.EDNS0_TCP_KEEPALIVE{Code: dns.EDNS0TCPKEEPALIVE}, &dns.EDNS0_EDE{InfoCode: dns.ExtendedErrorCodeOther}), true)

	// Shapes only CoreDNS's server or its plugin chain may answer.
	other := func(edit func(m *dns.Msg)) {
		m := newQuery("www.example.org.", dns.TypeA, 1232, false)
		edit(m)
		add(m, false)
	}
	other(func(m *dns.Msg) { m.IsEdns0().SetVersion(1) })
	for _, name := range names {
		other(func(m *dns.Msg) {
			m.Question[0].Name = name
			m.IsEdns0().SetVersion(uint8(len(name)))
			m.IsEdns0().SetDo()
			m.CheckingDisabled, m.AuthenticatedData, m.Zero, m.RecursionDesired = len(name)%2 == 0, true, len(name)%3 == 0, len(name)%2 == 1
		})
	}
	other(func(m *dns.Msg) { m.Question[0].Qclass = dns.ClassCHAOS })
	other(func(m *dns.Msg) { m.Question[0].Qtype = dns.TypeDS })
	other(func(m *dns.Msg) { m.Question[0].Qtype = dns.TypeAXFR })
	other(func(m *dns.Msg) { m.Opcode = dns.OpcodeNotify })
	other(func(m *dns.Msg) { m.Response = true })
	other(func(m *dns.Msg) { m.Question = append(m.Question, m.Question[0]) })
	other(func(m *dns.Msg) { m.Question[0].Name = "we\\.ird.example.org." })
	other(func(m *dns.Msg) { m.Question[0].Name = "sp\\032ace.example.org." })
	other(func(m *dns.Msg) { m.Ns = rrs(t, "example.org. 300 IN NS ns.example.org.") })
	other(func(m *dns.Msg) { m.Extra = append(m.Extra, rr(t, "x.example.org. 300 IN A 192.0.2.1")) })
	other(func(m *dns.Msg) { m.SetTsig("key.", dns.HmacSHA256, 300, 0) })
	big := newQuery("www.example.org.", dns.TypeA, 1232, false)
	big.IsEdns0().Option = []dns.EDNS0{&dns.EDNS0_PADDING{Padding: make([]byte, 600)}}
	add(big, false)
	return queries, plain
}

func TestParseWireQueryAgreesWithParseQuery(t *testing.T) {
	queries, plain := wireQueries(t)
	for i, b := range queries {
		if got := agreesWithParseQuery(t, b); got != plain[i] {
			m := new(dns.Msg)
			_ = m.Unpack(b)
			t.Errorf("query %d (%v): fast path reads it: %v, want %v", i, m.Question, got, plain[i])
		}
	}
}

// TestParseWireQueryMutations flips, cuts and extends the queries the fast path reads and checks that
// whatever it still accepts, CoreDNS reads the same way.
func TestParseWireQueryMutations(t *testing.T) {
	queries, _ := wireQueries(t)
	rng := rand.New(rand.NewPCG(1, 2))
	accepted := 0
	for _, b := range queries {
		for range 300 {
			m := bytes.Clone(b)
			switch rng.IntN(4) {
			case 0:
				m[rng.IntN(len(m))] ^= byte(1 << rng.IntN(8))
			case 1:
				m[rng.IntN(len(m))] = byte(rng.IntN(256))
			case 2:
				m = m[:rng.IntN(len(m))]
			case 3:
				m = append(m, byte(rng.IntN(256)))
			}
			if agreesWithParseQuery(t, m) {
				accepted++
			}
		}
	}
	if accepted == 0 {
		t.Fatal("no mutated query was accepted: the mutations test nothing")
	}
	t.Logf("%d mutated queries accepted, each read as parseQuery reads it", accepted)
}

func FuzzParseWireQuery(f *testing.F) {
	f.Add(mustPack(f, newQuery("www.example.org.", dns.TypeA, 1232, true)))
	f.Add(mustPack(f, newQuery("Svc.Cluster.Local.", dns.TypeAAAA, 0, false)))
	f.Fuzz(func(t *testing.T, b []byte) { agreesWithParseQuery(t, b) })
}

func mustPack(tb testing.TB, m *dns.Msg) []byte {
	b, err := m.Pack()
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// registeredOption is an EDNS option code a plugin registered (as rewrite registers the options it sets):
// the server keeps it in replies, so a query carrying it goes to the chain.
const registeredOption = 65100

func init() { edns.SetSupportedOption(registeredOption) }

// TestOptionUnpacksAsMiekg gives the fast path a query with each EDNS option code, with data of the lengths
// and values miekg/dns's option types check, and requires that it read exactly those miekg/dns unpacks (and
// parseQuery reads alike), except the reporting channel's and registered options, which it leaves to the
// chain.
func TestOptionUnpacksAsMiekg(t *testing.T) {
	base := mustPack(t, newQuery("www.example.org.", dns.TypeA, 1232, false))
	withOption := func(code uint16, data []byte) []byte {
		b := append(bytes.Clone(base), 0, 0, 0, 0)
		binary.BigEndian.PutUint16(b[len(base):], code)
		binary.BigEndian.PutUint16(b[len(base)+2:], uint16(len(data)))
		b = append(b, data...)
		binary.BigEndian.PutUint16(b[len(base)-2:], uint16(4+len(data))) // the OPT record's RDLENGTH
		return b
	}
	var shapes [][]byte
	for l := range 20 {
		shapes = append(shapes, make([]byte, l), bytes.Repeat([]byte{0xff}, l))
	}
	for _, family := range []uint16{0, 1, 2, 3} {
		for _, mask := range []byte{0, 24, 32, 33, 128, 129} {
			for _, scope := range []byte{0, 32, 33, 128, 129} {
				shapes = append(shapes, []byte{byte(family >> 8), byte(family), mask, scope, 10, 0, 0, 0})
			}
		}
	}
	shapes = append(shapes, []byte{3, 'n', 'e', 't', 0}, []byte{0xc0, 0})
	read := 0
	for code := range 1 << 16 {
		tried := shapes
		if code > 32 && code != registeredOption {
			tried = shapes[:6] // every other code is miekg/dns's EDNS0_LOCAL: any data
		}
		for _, data := range tried {
			b := withOption(uint16(code), data)
			accepted := agreesWithParseQuery(t, b)
			if accepted {
				read++
				continue
			}
			if code == dns.EDNS0REPORTING || code == registeredOption {
				continue
			}
			if err := new(dns.Msg).Unpack(b); err == nil {
				t.Fatalf("option %d with data %x: miekg/dns unpacks it, the fast path does not read it", code, data)
			}
		}
	}
	if read == 0 {
		t.Fatal("no query with an option was read")
	}
}
