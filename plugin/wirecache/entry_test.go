package wirecache

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/coredns/coredns/request"

	"github.com/miekg/dns"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// mustEntry builds the entry wirecache stores when the chain answers req with reply.
func mustEntry(t *testing.T, req, reply *dns.Msg, minTTL, maxTTL time.Duration) (*entry, query) {
	t.Helper()
	var key [keyLen]byte
	q, n, ok := parseQuery(req, &key)
	if !ok {
		t.Fatalf("query %v is not eligible", req.Question)
	}
	e, err := newEntry(reply, &q, string(key[:n]), t0, lifetimes{min: minTTL, max: maxTTL}, nil)
	if err != nil {
		t.Fatalf("newEntry: %v", err)
	}
	return e, q
}

func render(t *testing.T, e *entry, req *dns.Msg, c client, now time.Time) ([]byte, bool) {
	t.Helper()
	var key [keyLen]byte
	q, n, ok := parseQuery(req, &key)
	if !ok {
		t.Fatalf("query %v is not eligible", req.Question)
	}
	if string(key[:n]) != string(e.key()) {
		t.Fatalf("query key %q differs from entry key %q", key[:n], e.key())
	}
	out, ok := e.render(make([]byte, len(e.wire(e.plain))+optLen), &q, c, now)
	return bytes.Clone(out), ok
}

// scrubbed returns what CoreDNS's server writes when the chain answers req with reply: ScrubWriter adds or
// adjusts the OPT record, truncates and compresses.
func scrubbed(t *testing.T, req, reply *dns.Msg, remote net.Addr) []byte {
	t.Helper()
	w := newWireWriter(remote)
	if err := request.NewScrubWriter(req.Copy(), w).WriteMsg(reply.Copy()); err != nil {
		t.Fatalf("ScrubWriter: %v", err)
	}
	return w.last(t)
}

func TestTTLOffsets(t *testing.T) {
	m := new(dns.Msg)
	m.SetQuestion("www.example.org.", dns.TypeA)
	m.Response = true
	m.Answer = rrs(t, "www.example.org. 11 IN CNAME web.example.org.", "web.example.org. 12 IN A 192.0.2.1")
	m.Ns = rrs(t, "example.org. 13 IN NS ns.example.org.")
	m.Extra = rrs(t, "ns.example.org. 14 IN A 192.0.2.53")
	m.SetEdns0(1232, true)
	m.Extra = append(m.Extra, rr(t, "ns.example.org. 15 IN AAAA 2001:db8::53"))
	for _, compress := range []bool{false, true} {
		m.Compress = compress
		wire, err := m.Pack()
		if err != nil {
			t.Fatal(err)
		}
		offsets, err := ttlOffsetList(wire)
		if err != nil {
			t.Fatalf("compress=%v: %v", compress, err)
		}
		var got []uint32
		for _, off := range offsets {
			got = append(got, binary.BigEndian.Uint32(wire[off:]))
		}
		if want := []uint32{11, 12, 13, 14, 15}; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("compress=%v: TTLs at the offsets are %v, want %v (OPT skipped)", compress, got, want)
		}
	}
	if _, err := appendTTLOffsets(nil, []byte{1, 2, 3}); err == nil {
		t.Error("a 3-byte message was walked")
	}
	wire, _ := m.Pack()
	if _, err := appendTTLOffsets(nil, wire[:len(wire)-1]); err == nil {
		t.Error("a message one byte short was walked")
	}
}

// TestRenderMatchesCoreDNS checks render against CoreDNS's own server code: for every stored answer, query
// and client, a hit must be byte for byte what ScrubWriter makes of the chain's answer to that query, or
// render must decline (and then only because the reply needs truncation or case-dependent compression).
func TestRenderMatchesCoreDNS(t *testing.T) {
	z := testZone(t)
	questions := []struct {
		name  string
		qtype uint16
	}{
		{"www.example.org.", dns.TypeA},
		{"www.example.org.", dns.TypeAAAA},
		{"alias.example.org.", dns.TypeA},
		{"www.example.org.", dns.TypeMX},
		{"nope.example.org.", dns.TypeA},
		{"mid.example.org.", dns.TypeTXT},
		{"big.example.org.", dns.TypeTXT},
		{"huge.example.org.", dns.TypeTXT},
	}
	type variant struct {
		size   uint16
		do, cd bool
		cookie bool
		zbits  bool
	}
	variants := []variant{
		{}, {size: 100}, {size: 512}, {size: 1232}, {size: 1232, do: true}, {size: 1232, cd: true},
		{size: 1400}, {size: 4096, do: true, cd: true}, {size: 65535}, {size: 1232, cookie: true}, {size: 4096, zbits: true},
	}
	clients := map[string]net.Addr{"udp4": udp4Client, "udp6": udp6Client, "tcp4": tcp4Client}
	build := func(name string, qtype uint16, v variant, id uint16, rd bool) *dns.Msg {
		req := newQuery(name, qtype, v.size, v.do)
		req.Id, req.RecursionDesired, req.CheckingDisabled = id, rd, v.cd
		if o := req.IsEdns0(); o != nil {
			if v.cookie {
				o.Option = append(o.Option, &dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "0123456789abcdef"})
			}
			if v.zbits {
				o.Hdr.Ttl |= 0x0100
			}
		}
		return req
	}
	served, declined := 0, 0
	for _, qu := range questions {
		for _, v := range variants {
			// The entry comes from the first client's query: lower case, its own ID and RD bit.
			first := build(qu.name, qu.qtype, v, 1, true)
			e, _ := mustEntry(t, first, z.reply(first), 0, time.Hour)
			for _, spelled := range []string{qu.name, mixCase(qu.name)} {
				for cname, remote := range clients {
					_, isTCP := remote.(*net.TCPAddr)
					c := client{tcp: isTCP, v6: cname == "udp6"}
					for _, rd := range []bool{true, false} {
						req := build(spelled, qu.qtype, v, 777, rd)
						want := scrubbed(t, req, z.reply(req), remote)
						got, ok := render(t, e, req, c, t0)
						label := fmt.Sprintf("%s %s %+v %s rd=%v", spelled, dns.TypeToString[qu.qtype], v, cname, rd)
						if !ok {
							wantMsg := new(dns.Msg)
							if err := wantMsg.Unpack(want); err != nil {
								t.Fatalf("%s: %v", label, err)
							}
							if !wantMsg.Truncated && spelled == qu.name {
								t.Errorf("%s: render declined an answer CoreDNS writes untruncated (%d bytes)", label, len(want))
							}
							declined++
							continue
						}
						served++
						if !bytes.Equal(got, want) {
							t.Errorf("%s:\n got %x\nwant %x", label, got, want)
						}
					}
				}
			}
		}
	}
	if served == 0 || declined == 0 {
		t.Errorf("served %d, declined %d: the corpus must exercise both", served, declined)
	}
}

// mixCase upper-cases every other letter.
func mixCase(s string) string {
	b := []byte(s)
	for i := 0; i < len(b); i += 2 {
		if 'a' <= b[i] && b[i] <= 'z' {
			b[i] -= 'a' - 'A'
		}
	}
	return string(b)
}

func TestRenderPatches(t *testing.T) {
	z := testZone(t)
	first := newQuery("www.example.org.", dns.TypeA, 1232, false)
	first.Id, first.RecursionDesired = 1, true
	e, _ := mustEntry(t, first, z.reply(first), 0, time.Hour)

	req := newQuery("WwW.eXample.ORG.", dns.TypeA, 1400, false)
	req.Id, req.RecursionDesired = 0xBEEF, false
	req.IsEdns0().Hdr.Ttl |= 0x0100 // a Z flag the server echoes
	out, ok := render(t, e, req, client{}, t0.Add(7*time.Second+900*time.Millisecond))
	if !ok {
		t.Fatal("render declined")
	}
	got := new(dns.Msg)
	if err := got.Unpack(out); err != nil {
		t.Fatal(err)
	}

	t.Run("ID", func(t *testing.T) {
		if got.Id != 0xBEEF {
			t.Errorf("ID %#x, want 0xbeef", got.Id)
		}
	})
	t.Run("case", func(t *testing.T) {
		if got.Question[0].Name != "WwW.eXample.ORG." {
			t.Errorf("question %q, want the client's spelling", got.Question[0].Name)
		}
	})
	t.Run("flags", func(t *testing.T) {
		if got.RecursionDesired || !got.Response || !got.Authoritative || got.CheckingDisabled {
			t.Errorf("flags %s, want RD from the query (clear), QR and AA from the answer", got.MsgHdr.String())
		}
		req2 := req.Copy()
		req2.RecursionDesired = true
		out, _ := render(t, e, req2, client{}, t0)
		if out[2]&flagRD == 0 {
			t.Error("RD not set for a query with RD")
		}
		cd := newQuery("www.example.org.", dns.TypeA, 1232, false)
		cd.CheckingDisabled = true
		ce, _ := mustEntry(t, cd, z.reply(cd), 0, time.Hour)
		cdq := cd.Copy()
		cdq.CheckingDisabled = true
		out, _ = render(t, ce, cdq, client{}, t0)
		if out[3]&flagCD == 0 {
			t.Error("CD not set for a query with CD")
		}
	})
	t.Run("TTL countdown", func(t *testing.T) {
		// 7.9 s after storing: TTLs 120 and 100 count down by 7 whole seconds, as the cache plugin does.
		if a, b := got.Answer[0].Header().Ttl, got.Answer[1].Header().Ttl; a != 113 || b != 93 {
			t.Errorf("TTLs %d %d, want 113 93", a, b)
		}
		// With a lifetime raised above the smallest TTL, a record past its TTL shows 0, never wraps.
		long, _ := mustEntry(t, first, z.reply(first), 200*time.Second, time.Hour)
		out, ok := render(t, long, first, client{}, t0.Add(150*time.Second))
		if !ok {
			t.Fatal("render declined inside the lifetime")
		}
		m := new(dns.Msg)
		if err := m.Unpack(out); err != nil {
			t.Fatal(err)
		}
		if a, b := m.Answer[0].Header().Ttl, m.Answer[1].Header().Ttl; a != 0 || b != 0 {
			t.Errorf("TTLs %d %d past their end, want 0 0", a, b)
		}
	})
	t.Run("OPT", func(t *testing.T) {
		opt := got.IsEdns0()
		if opt == nil {
			t.Fatal("no OPT for an EDNS query")
		}
		if opt.UDPSize() != 1400 || opt.Hdr.Ttl != 0x0100 || len(opt.Option) != 0 {
			t.Errorf("OPT size %d TTL %#x options %v, want the client's size 1400 and flags 0x100, no TTL countdown",
				opt.UDPSize(), opt.Hdr.Ttl, opt.Option)
		}
		if n := binary.BigEndian.Uint16(out[10:]); n != 1 {
			t.Errorf("ARCOUNT %d, want 1", n)
		}
		plain := newQuery("www.example.org.", dns.TypeA, 0, false)
		pe, _ := mustEntry(t, plain, z.reply(plain), 0, time.Hour)
		out, _ := render(t, pe, plain, client{}, t0)
		m := new(dns.Msg)
		if err := m.Unpack(out); err != nil {
			t.Fatal(err)
		}
		if m.IsEdns0() != nil {
			t.Error("OPT in the reply to a query without one")
		}
	})
	t.Run("OPT from the chain", func(t *testing.T) {
		reply := z.reply(first)
		reply.SetEdns0(4096, false)
		reply.IsEdns0().Hdr.Ttl = 0x01000200 // extended RCODE and Z bits the server clears, one it keeps
		ce, _ := mustEntry(t, first, reply, 0, time.Hour)
		req := first.Copy()
		req.IsEdns0().Hdr.Ttl |= 0x0100
		out, _ := render(t, ce, req, client{}, t0)
		want := scrubbed(t, req, reply, udp4Client)
		if !bytes.Equal(out, want) {
			t.Errorf("\n got %x\nwant %x", out, want)
		}
	})
}

func TestRenderExpiry(t *testing.T) {
	z := testZone(t)
	req := newQuery("www.example.org.", dns.TypeA, 0, false)
	e, _ := mustEntry(t, req, z.reply(req), 0, time.Hour)
	if _, ok := render(t, e, req, client{}, t0.Add(99*time.Second)); !ok {
		t.Error("declined before the smallest TTL (100 s) passed")
	}
	if _, ok := render(t, e, req, client{}, t0.Add(100*time.Second)); ok {
		t.Error("served after the smallest TTL (100 s) passed")
	}
}

// TestRenderTTLFloor counts TTLs down to the floor clamp's window sets, and only with a floor.
func TestRenderTTLFloor(t *testing.T) {
	req := newQuery("www.example.org.", dns.TypeA, 0, false)
	reply := new(dns.Msg)
	reply.SetReply(req)
	reply.Answer = rrs(t, "www.example.org. 30 IN A 192.0.2.1", "www.example.org. 40 IN A 192.0.2.2")

	tests := []struct {
		name    string
		floor   uint32
		elapsed time.Duration
		want    []uint32
	}{
		{"no clamp in the block", 0, 28 * time.Second, []uint32{2, 12}},
		{"clamp's MIN", 5, 28 * time.Second, []uint32{5, 12}},
		{"clamp's MIN, last second", 5, 29*time.Second + 999*time.Millisecond, []uint32{5, 11}},
		{"above the count", 5, 10 * time.Second, []uint32{20, 30}},
		// What clamp does to a TTL under its MIN, which cannot reach wirecache from behind clamp.
		{"stored under the floor", 35, 0, []uint32{35, 40}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e, _ := mustEntry(t, req, reply, 0, time.Hour)
			e.ttlFloor = tc.floor
			out, ok := render(t, e, req, client{}, t0.Add(tc.elapsed))
			if !ok {
				t.Fatal("render declined")
			}
			m := new(dns.Msg)
			if err := m.Unpack(out); err != nil {
				t.Fatal(err)
			}
			var got []uint32
			for _, a := range m.Answer {
				got = append(got, a.Header().Ttl)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("TTLs %v, want %v", got, tc.want)
			}
		})
	}
}

func TestNewEntryRefuses(t *testing.T) {
	z := testZone(t)
	req := newQuery("www.example.org.", dns.TypeA, 1232, false)
	tests := []struct {
		name   string
		modify func(m *dns.Msg)
		min    time.Duration
		want   error
	}{
		{"SERVFAIL", func(m *dns.Msg) { m.Rcode = dns.RcodeServerFailure }, 0, errRcode},
		{"REFUSED", func(m *dns.Msg) { m.Rcode = dns.RcodeRefused }, 0, errRcode},
		{"FORMERR", func(m *dns.Msg) { m.Rcode = dns.RcodeFormatError }, 0, errRcode},
		{"truncated", func(m *dns.Msg) { m.Truncated = true }, 0, errTruncated},
		{"not a response", func(m *dns.Msg) { m.Response = false }, 0, errNotResponse},
		{"other question", func(m *dns.Msg) { m.Question[0].Name = "xyz.example.org." }, 0, errNotResponse},
		{"other type", func(m *dns.Msg) { m.Question[0].Qtype = dns.TypeAAAA }, 0, errNotResponse},
		{"NXDOMAIN without SOA", func(m *dns.Msg) { m.Rcode, m.Answer = dns.RcodeNameError, nil }, 0, errNoSOA},
		{"empty NOERROR", func(m *dns.Msg) { m.Answer = nil }, 0, errEmptyNoError},
		{"incomplete CNAME chain", func(m *dns.Msg) {
			m.Answer = rrs(t, "www.example.org. 60 IN CNAME elsewhere.example.net.")
		}, 0, errNotAnswer},
		{"zero TTL", func(m *dns.Msg) { m.Answer[1].Header().Ttl = 0 }, 0, errZeroLifetime},
		{"OPT with an option", func(m *dns.Msg) {
			m.SetEdns0(1232, false)
			m.IsEdns0().Option = []dns.EDNS0{&dns.EDNS0_EDE{InfoCode: dns.ExtendedErrorCodeFiltered}}
		}, 0, errOPT},
		{"OPT not last", func(m *dns.Msg) {
			m.SetEdns0(1232, false)
			m.Extra = append(m.Extra, rr(t, "ns.example.org. 60 IN A 192.0.2.53"))
		}, 0, errOPT},
		{"TSIG", func(m *dns.Msg) { m.SetTsig("key.", dns.HmacSHA256, 300, 0) }, 0, errTSIG},
		{"too large", func(m *dns.Msg) { m.Answer = append(m.Answer, bigTXT(t, "www.example.org.", 40)...) }, 0, errTooLarge},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := z.reply(req)
			tc.modify(m)
			var key [keyLen]byte
			q, n, _ := parseQuery(req, &key)
			_, err := newEntry(m, &q, string(key[:n]), t0, lifetimes{min: tc.min, max: time.Hour}, nil)
			if !errors.Is(err, tc.want) {
				t.Errorf("error %v, want %v", err, tc.want)
			}
		})
	}
	// A zero TTL with a MIN above zero is stored, for MIN.
	m := z.reply(req)
	m.Answer[1].Header().Ttl = 0
	e, _ := mustEntry(t, req, m, 5*time.Second, time.Hour)
	if got := e.lifetime; got != 5*time.Second {
		t.Errorf("lifetime %v, want MIN 5s", got)
	}
}

func TestLifetime(t *testing.T) {
	z := testZone(t)
	tests := []struct {
		name     string
		qname    string
		qtype    uint16
		min, max time.Duration
		want     time.Duration
	}{
		{"smallest TTL of the answer", "www.example.org.", dns.TypeA, 0, time.Hour, 100 * time.Second},
		{"smallest TTL of all sections", "www.example.org.", dns.TypeAAAA, 0, time.Hour, 120 * time.Second},
		{"CNAME chain", "alias.example.org.", dns.TypeA, 0, time.Hour, 120 * time.Second},
		{"MAX bounds it", "www.example.org.", dns.TypeA, 0, 30 * time.Second, 30 * time.Second},
		{"MIN raises it", "www.example.org.", dns.TypeA, 600 * time.Second, time.Hour, 600 * time.Second},
		{"NXDOMAIN: SOA MINIMUM", "nope.example.org.", dns.TypeA, 0, time.Hour, 60 * time.Second},
		{"NODATA: SOA MINIMUM", "www.example.org.", dns.TypeMX, 0, time.Hour, 60 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := newQuery(tc.qname, tc.qtype, 0, false)
			e, _ := mustEntry(t, req, z.reply(req), tc.min, tc.max)
			if got := e.lifetime; got != tc.want {
				t.Errorf("lifetime %v, want %v", got, tc.want)
			}
		})
	}
}

func TestParseQuery(t *testing.T) {
	var key [keyLen]byte
	keyOf := func(m *dns.Msg) (string, bool) {
		_, n, ok := parseQuery(m, &key)
		return string(key[:n]), ok
	}
	base, _ := keyOf(newQuery("www.example.org.", dns.TypeA, 1232, false))
	mixed, _ := keyOf(newQuery("WWW.Example.org.", dns.TypeA, 4096, false))
	if base != mixed {
		t.Error("case or payload size changed the key")
	}
	differs := map[string]*dns.Msg{
		"DO":      newQuery("www.example.org.", dns.TypeA, 1232, true),
		"no EDNS": newQuery("www.example.org.", dns.TypeA, 0, false),
		"type":    newQuery("www.example.org.", dns.TypeAAAA, 1232, false),
	}
	cd := newQuery("www.example.org.", dns.TypeA, 1232, false)
	cd.CheckingDisabled = true
	differs["CD"] = cd
	ad := newQuery("www.example.org.", dns.TypeA, 1232, false)
	ad.AuthenticatedData = true
	differs["AD"] = ad
	for name, m := range differs {
		if k, _ := keyOf(m); k == base {
			t.Errorf("%s does not change the key", name)
		}
	}

	// Options no plugin registered are dropped from every reply, as *cache* drops them: the query is the
	// plain one's.
	nsid := newQuery("www.example.org.", dns.TypeA, 1232, false)
	nsid.IsEdns0().Option = []dns.EDNS0{&dns.EDNS0_NSID{Code: dns.EDNS0NSID}}
	ecs := newQuery("www.example.org.", dns.TypeA, 1232, false)
	ecs.IsEdns0().Option = []dns.EDNS0{&dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: 1, SourceNetmask: 24, Address: net.IPv4(192, 0, 2, 0)}}
	for name, m := range map[string]*dns.Msg{"NSID option": nsid, "client subnet": ecs} {
		if k, ok := keyOf(m); !ok || k != base {
			t.Errorf("%s query: eligible %t, same key %t; want the plain query's key", name, ok, k == base)
		}
	}

	ineligible := map[string]*dns.Msg{}
	registered := newQuery("www.example.org.", dns.TypeA, 1232, false)
	registered.IsEdns0().Option = []dns.EDNS0{&dns.EDNS0_LOCAL{Code: registeredOption, Data: []byte{1}}}
	ineligible["option a plugin registered"] = registered
	tsig := newQuery("www.example.org.", dns.TypeA, 0, false)
	tsig.SetTsig("key.", dns.HmacSHA256, 300, 0)
	ineligible["TSIG"] = tsig
	ineligible["AXFR"] = newQuery("example.org.", dns.TypeAXFR, 0, false)
	update := newQuery("example.org.", dns.TypeSOA, 0, false)
	update.Opcode = dns.OpcodeUpdate
	ineligible["UPDATE"] = update
	two := newQuery("www.example.org.", dns.TypeA, 0, false)
	two.Question = append(two.Question, two.Question[0])
	ineligible["two questions"] = two
	for name, m := range ineligible {
		if _, ok := keyOf(m); ok {
			t.Errorf("%s query is eligible", name)
		}
	}
	cookie := newQuery("www.example.org.", dns.TypeA, 1232, false)
	cookie.IsEdns0().Option = []dns.EDNS0{&dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "0123456789abcdef"}}
	if k, ok := keyOf(cookie); !ok || k != base {
		t.Error("a cookie, which the server drops from cached replies, changed eligibility or the key")
	}
}
