package wirecache

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/coredns/coredns/plugin"

	"github.com/miekg/dns"
)

// wireWriter is a dns.ResponseWriter that keeps every reply in wire format, as the client would get it.
type wireWriter struct {
	remote net.Addr
	out    [][]byte
}

var (
	udp4Client = &net.UDPAddr{IP: net.IPv4(10, 0, 0, 7), Port: 40212}
	udp6Client = &net.UDPAddr{IP: net.ParseIP("fd00::7"), Port: 40212}
	tcp4Client = &net.TCPAddr{IP: net.IPv4(10, 0, 0, 7), Port: 40212}
)

func newWireWriter(remote net.Addr) *wireWriter { return &wireWriter{remote: remote} }

func (w *wireWriter) WriteMsg(m *dns.Msg) error {
	b, err := m.Pack()
	if err != nil {
		return err
	}
	w.out = append(w.out, b)
	return nil
}

func (w *wireWriter) Write(b []byte) (int, error) {
	w.out = append(w.out, append([]byte(nil), b...))
	return len(b), nil
}

func (w *wireWriter) LocalAddr() net.Addr {
	if _, ok := w.remote.(*net.TCPAddr); ok {
		return &net.TCPAddr{IP: net.IPv4(10, 0, 0, 10), Port: 53}
	}
	return &net.UDPAddr{IP: net.IPv4(10, 0, 0, 10), Port: 53}
}
func (w *wireWriter) RemoteAddr() net.Addr { return w.remote }
func (w *wireWriter) Close() error         { return nil }
func (w *wireWriter) TsigStatus() error    { return nil }
func (w *wireWriter) TsigTimersOnly(bool)  {}
func (w *wireWriter) Hijack()              {}
func (w *wireWriter) last(t *testing.T) []byte {
	t.Helper()
	if len(w.out) == 0 {
		t.Fatal("nothing was written")
	}
	return w.out[len(w.out)-1]
}

func rr(t testing.TB, s string) dns.RR {
	t.Helper()
	r, err := dns.NewRR(s)
	if err != nil {
		t.Fatalf("parsing %q: %v", s, err)
	}
	return r
}

func rrs(t testing.TB, ss ...string) []dns.RR {
	t.Helper()
	out := make([]dns.RR, len(ss))
	for i, s := range ss {
		out[i] = rr(t, s)
	}
	return out
}

// zone is a tiny authoritative stand-in: the answer sections for each lowered name and type.
type zone struct {
	answer, ns, extra map[string][]dns.RR
	rcode             map[string]int
	soa               dns.RR
}

func key2(name string, qtype uint16) string {
	return strings.ToLower(name) + "/" + dns.TypeToString[qtype]
}

// reply builds the answer a chain would write for req: the records for its question, and an NXDOMAIN with
// the SOA for names the zone does not have.
func (z *zone) reply(req *dns.Msg) *dns.Msg {
	m := new(dns.Msg)
	m.SetReply(req)
	m.Authoritative = true
	k := key2(req.Question[0].Name, req.Question[0].Qtype)
	if rc, ok := z.rcode[k]; ok {
		m.Rcode = rc
		return m
	}
	a, ok := z.answer[k]
	if !ok {
		m.Rcode = dns.RcodeNameError
		m.Ns = []dns.RR{dns.Copy(z.soa)}
		return m
	}
	m.Answer = copyRRs(a)
	m.Ns = copyRRs(z.ns[k])
	m.Extra = copyRRs(z.extra[k])
	return m
}

func copyRRs(in []dns.RR) []dns.RR {
	out := make([]dns.RR, len(in))
	for i, r := range in {
		out[i] = dns.Copy(r)
	}
	return out
}

// chain is a plugin.Handler that answers from a zone through WriteMsg and counts its calls.
type chain struct {
	mu     sync.Mutex
	calls  int
	zone   *zone
	modify func(*dns.Msg)
}

func (c *chain) ServeDNS(_ context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
	c.mu.Lock()
	c.calls++
	modify := c.modify
	c.mu.Unlock()
	m := c.zone.reply(r)
	if modify != nil {
		modify(m)
	}
	if err := w.WriteMsg(m); err != nil {
		return dns.RcodeServerFailure, err
	}
	return m.Rcode, nil
}

func (c *chain) Name() string { return "chain" }

func (c *chain) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls
}

var _ plugin.Handler = (*chain)(nil)

// testZone has the shapes the tests need: small answers, a CNAME chain, answers of about 700, 1300 and 2300
// bytes, a NODATA, an NXDOMAIN, and a SERVFAIL and REFUSED name.
func testZone(t testing.TB) *zone {
	z := &zone{
		answer: map[string][]dns.RR{}, ns: map[string][]dns.RR{}, extra: map[string][]dns.RR{}, rcode: map[string]int{},
		soa: rr(t, "example.org. 300 IN SOA ns.example.org. hostmaster.example.org. 1 7200 3600 1209600 60"),
	}
	z.answer[key2("www.example.org.", dns.TypeA)] = rrs(t, "www.example.org. 120 IN A 192.0.2.1", "www.example.org. 100 IN A 192.0.2.2")
	z.answer[key2("www.example.org.", dns.TypeAAAA)] = rrs(t, "www.example.org. 120 IN AAAA 2001:db8::1")
	z.ns[key2("www.example.org.", dns.TypeAAAA)] = rrs(t, "example.org. 3600 IN NS ns.example.org.")
	z.extra[key2("www.example.org.", dns.TypeAAAA)] = rrs(t, "ns.example.org. 3600 IN A 192.0.2.53")
	z.answer[key2("alias.example.org.", dns.TypeA)] = rrs(t,
		"alias.example.org. 300 IN CNAME mid.example.org.",
		"mid.example.org. 200 IN CNAME www.example.org.",
		"www.example.org. 120 IN A 192.0.2.1")
	z.answer[key2("www.example.org.", dns.TypeMX)] = nil // NODATA
	z.ns[key2("www.example.org.", dns.TypeMX)] = []dns.RR{z.soa}
	z.answer[key2("mid.example.org.", dns.TypeTXT)] = bigTXT(t, "mid.example.org.", 6)
	z.answer[key2("big.example.org.", dns.TypeTXT)] = bigTXT(t, "big.example.org.", 12)
	z.answer[key2("huge.example.org.", dns.TypeTXT)] = bigTXT(t, "huge.example.org.", 20)
	z.rcode[key2("fail.example.org.", dns.TypeA)] = dns.RcodeServerFailure
	z.rcode[key2("refused.example.org.", dns.TypeA)] = dns.RcodeRefused
	return z
}

// bigTXT returns n TXT records of about 110 bytes each.
func bigTXT(t testing.TB, owner string, n int) []dns.RR {
	out := make([]dns.RR, n)
	for i := range out {
		out[i] = rr(t, fmt.Sprintf("%s 600 IN TXT \"%02d-%s\"", owner, i, strings.Repeat("x", 90)))
	}
	return out
}

// newQuery returns a query; size 0 means no OPT record.
func newQuery(name string, qtype uint16, size uint16, do bool) *dns.Msg {
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	m.Id = 4242
	if size > 0 {
		m.SetEdns0(size, do)
	}
	return m
}

// ttlOffsetList returns the offsets of the TTL fields of the packed message msg (see appendTTLOffsets).
func ttlOffsetList(msg []byte) ([]int, error) {
	b, err := appendTTLOffsets(nil, msg)
	if err != nil {
		return nil, err
	}
	offsets := make([]int, 0, len(b)/2)
	for i := 0; i < len(b); i += 2 {
		offsets = append(offsets, int(binary.BigEndian.Uint16(b[i:])))
	}
	return offsets, nil
}
