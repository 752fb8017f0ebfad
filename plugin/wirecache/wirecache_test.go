package wirecache

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/coredns/coredns/request"
	"github.com/nodelocaldns/nodelocaldns/plugin/clamp"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// fixture is a WireCache in front of a chain answering from testZone, with a clock the test moves.
type fixture struct {
	t     *testing.T
	wc    *WireCache
	chain *chain
	now   time.Time
}

func newFixture(t *testing.T) *fixture {
	f := &fixture{t: t, chain: &chain{zone: testZone(t)}, now: t0}
	f.wc = New()
	f.wc.Next = f.chain
	f.wc.now = func() time.Time { return f.now }
	return f
}

// ask sends req as the server would (through a ScrubWriter) and returns the reply's bytes and whether the
// chain was called.
func (f *fixture) ask(req *dns.Msg, remote net.Addr) (reply []byte, chainCalled bool) {
	f.t.Helper()
	before := f.chain.count()
	w := newWireWriter(remote)
	if _, err := f.wc.ServeDNS(context.Background(), request.NewScrubWriter(req, w), req); err != nil {
		f.t.Fatalf("ServeDNS: %v", err)
	}
	if len(w.out) != 1 {
		f.t.Fatalf("%d replies written, want 1", len(w.out))
	}
	return w.out[0], f.chain.count() != before
}

// value reads a counter or gauge.
func value(m prometheus.Metric) float64 {
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		panic(err)
	}
	if d.Counter != nil {
		return d.Counter.GetValue()
	}
	return d.Gauge.GetValue()
}

func counters() (hits, misses float64) {
	return value(hitsTotal.WithLabelValues("")), value(missesTotal.WithLabelValues(""))
}

func TestMissThenHit(t *testing.T) {
	f := newFixture(t)
	hits0, misses0 := counters()
	first, called := f.ask(newQuery("www.example.org.", dns.TypeA, 1232, false), udp4Client)
	if !called {
		t.Fatal("first query did not reach the chain")
	}
	second, called := f.ask(newQuery("www.example.org.", dns.TypeA, 1232, false), udp4Client)
	if called {
		t.Fatal("second query reached the chain")
	}
	if !bytes.Equal(first, second) {
		t.Errorf("hit differs from the chain's reply at the same instant:\n got %x\nwant %x", second, first)
	}
	if hits, misses := counters(); hits-hits0 != 1 || misses-misses0 != 1 {
		t.Errorf("hits +%v misses +%v, want +1 +1", hits-hits0, misses-misses0)
	}
	if got := value(entriesGauge.WithLabelValues("")); got != 1 {
		t.Errorf("entries gauge %v, want 1", got)
	}
}

func TestSeparateEntries(t *testing.T) {
	f := newFixture(t)
	cd := newQuery("www.example.org.", dns.TypeA, 1232, false)
	cd.CheckingDisabled = true
	queries := map[string]*dns.Msg{
		"plain":   newQuery("www.example.org.", dns.TypeA, 1232, false),
		"DO":      newQuery("www.example.org.", dns.TypeA, 1232, true),
		"CD":      cd,
		"no EDNS": newQuery("www.example.org.", dns.TypeA, 0, false),
		"AAAA":    newQuery("www.example.org.", dns.TypeAAAA, 1232, false),
	}
	for name, q := range queries {
		if _, called := f.ask(q.Copy(), udp4Client); !called {
			t.Errorf("%s: first query answered from another entry", name)
		}
	}
	for name, q := range queries {
		reply, called := f.ask(q.Copy(), udp4Client)
		if called {
			t.Errorf("%s: second query missed", name)
		}
		m := new(dns.Msg)
		if err := m.Unpack(reply); err != nil {
			t.Fatal(err)
		}
		if (m.IsEdns0() != nil) != (q.IsEdns0() != nil) || m.CheckingDisabled != q.CheckingDisabled ||
			(q.IsEdns0() != nil && m.IsEdns0().Do() != q.IsEdns0().Do()) || m.Question[0].Qtype != q.Question[0].Qtype {
			t.Errorf("%s: reply %v does not match the query", name, m)
		}
	}
}

func TestNeverCached(t *testing.T) {
	for name, req := range map[string]*dns.Msg{
		"SERVFAIL, servfail 0s": newQuery("fail.example.org.", dns.TypeA, 1232, false),
		"REFUSED, refused 0s":   newQuery("refused.example.org.", dns.TypeA, 1232, false),
	} {
		f := newFixture(t)
		f.wc.RefusedFor, f.wc.ServfailFor = 0, 0
		for i := range 3 {
			if _, called := f.ask(req.Copy(), udp4Client); !called {
				t.Errorf("%s: query %d answered by wirecache", name, i+1)
			}
		}
	}
	f := newFixture(t)
	f.chain.modify = func(m *dns.Msg) { m.Truncated = true }
	for i := range 3 {
		if _, called := f.ask(newQuery("www.example.org.", dns.TypeA, 1232, false), udp4Client); !called {
			t.Errorf("truncated: query %d answered by wirecache", i+1)
		}
	}
	if f.wc.store.len() != 0 {
		t.Errorf("%d entries after uncacheable answers", f.wc.store.len())
	}
}

// bytesChain writes its answers with Write, as a plugin that packs its own replies would.
type bytesChain struct{ chain }

func (c *bytesChain) ServeDNS(_ context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
	c.mu.Lock()
	c.calls++
	c.mu.Unlock()
	b, err := c.zone.reply(r).Pack()
	if err != nil {
		return dns.RcodeServerFailure, err
	}
	_, err = w.Write(b)
	return dns.RcodeSuccess, err
}

func TestBytesWrittenByTheChainAreNotStored(t *testing.T) {
	f := newFixture(t)
	bc := &bytesChain{chain{zone: testZone(t)}}
	f.wc.Next = bc
	for range 2 {
		f.ask(newQuery("www.example.org.", dns.TypeA, 1232, false), udp4Client)
	}
	if bc.count() != 2 || f.wc.store.len() != 0 {
		t.Errorf("chain called %d times, %d entries; want 2 and 0", bc.count(), f.wc.store.len())
	}
}

func TestExpiresWithSmallestTTL(t *testing.T) {
	f := newFixture(t)
	req := newQuery("www.example.org.", dns.TypeA, 1232, false) // TTLs 120 and 100
	f.ask(req.Copy(), udp4Client)
	f.now = t0.Add(99 * time.Second)
	reply, called := f.ask(req.Copy(), udp4Client)
	if called {
		t.Fatal("missed before the smallest TTL passed")
	}
	m := new(dns.Msg)
	if err := m.Unpack(reply); err != nil {
		t.Fatal(err)
	}
	if m.Answer[0].Header().Ttl != 21 || m.Answer[1].Header().Ttl != 1 {
		t.Errorf("TTLs %d %d after 99 s, want 21 1", m.Answer[0].Header().Ttl, m.Answer[1].Header().Ttl)
	}
	f.now = t0.Add(100 * time.Second)
	if _, called := f.ask(req.Copy(), udp4Client); !called {
		t.Error("hit after the smallest TTL passed")
	}
	if _, called := f.ask(req.Copy(), udp4Client); called {
		t.Error("the refreshed answer was not stored")
	}
}

func TestZones(t *testing.T) {
	f := newFixture(t)
	f.wc.Zones = []string{"example.net."}
	f.wc.prepare()
	hits0, misses0 := counters()
	for range 2 {
		if _, called := f.ask(newQuery("www.example.org.", dns.TypeA, 1232, false), udp4Client); !called {
			t.Error("query outside ZONES answered by wirecache")
		}
	}
	if hits, misses := counters(); hits != hits0 || misses != misses0 {
		t.Error("queries outside ZONES were counted")
	}
	f.wc.Zones = []string{"example.org."}
	f.wc.prepare()
	f.ask(newQuery("www.example.org.", dns.TypeA, 1232, false), udp4Client)
	if _, called := f.ask(newQuery("WWW.EXAMPLE.ORG.", dns.TypeA, 1232, false), udp4Client); called {
		t.Error("query inside ZONES missed")
	}
}

func TestNeverLargerThanTheClientBuffer(t *testing.T) {
	f := newFixture(t)
	big := newQuery("huge.example.org.", dns.TypeTXT, 4096, false) // about 2300 bytes
	f.ask(big.Copy(), udp4Client)
	if _, called := f.ask(big.Copy(), udp4Client); called {
		t.Fatal("4096-byte client missed")
	}
	// A client whose buffer the reply does not fit gets it truncated by the server from the entry, as a hit
	// of CoreDNS's cache would be, not by asking the chain again.
	small := newQuery("huge.example.org.", dns.TypeTXT, 1232, false)
	reply, called := f.ask(small, udp4Client)
	if called {
		t.Error("a reply needing truncation went to the chain again")
	}
	m := new(dns.Msg)
	if err := m.Unpack(reply); err != nil {
		t.Fatal(err)
	}
	if len(reply) > 1232 || !m.Truncated {
		t.Errorf("reply of %d bytes, TC=%v, for a 1232-byte client", len(reply), m.Truncated)
	}
	if _, called := f.ask(big.Copy(), udp4Client); called {
		t.Error("the truncated reply replaced the entry")
	}
	if _, called := f.ask(newQuery("huge.example.org.", dns.TypeTXT, 4096, false), tcp4Client); called {
		t.Error("TCP client missed")
	}
}

func TestStepAside(t *testing.T) {
	f := newFixture(t)
	f.wc.stepAside = true
	hits0, misses0 := counters()
	for range 3 {
		if _, called := f.ask(newQuery("www.example.org.", dns.TypeA, 1232, false), udp4Client); !called {
			t.Error("query answered by a wirecache that steps aside")
		}
	}
	if hits, misses := counters(); hits != hits0 || misses != misses0 || f.wc.store.len() != 0 {
		t.Error("a wirecache that steps aside counted or stored")
	}
}

func TestCapacity(t *testing.T) {
	f := newFixture(t)
	f.wc.Capacity = 2
	f.wc.prepare()
	for _, name := range []string{"www.example.org.", "alias.example.org.", "mid.example.org.", "big.example.org."} {
		f.ask(newQuery(name, dns.TypeA, 1232, false), udp4Client)
		f.ask(newQuery(name, dns.TypeTXT, 1232, false), udp4Client)
		if n := f.wc.store.len(); n > 2 {
			t.Fatalf("%d entries, capacity 2", n)
		}
	}
}

// TestMaxMemory fills a cache whose entry count would allow far more with large answers: the bytes held stay
// within max_memory, and the bytes gauge shows them.
func TestMaxMemory(t *testing.T) {
	f := newFixture(t)
	f.wc.MaxMemory = 4 * maxEntryBytes
	f.wc.prepare()
	f.chain.modify = func(m *dns.Msg) {
		// Every name has twenty TXT records, about 2300 bytes.
		m.Rcode, m.Ns = dns.RcodeSuccess, nil
		m.Answer = bigTXT(t, m.Question[0].Name, 20)
	}
	for i := range 200 {
		f.ask(newQuery(fmt.Sprintf("name-%d.example.org.", i), dns.TypeTXT, 4096, false), udp4Client)
		if got := f.wc.store.size(); got > f.wc.MaxMemory {
			t.Fatalf("after %d answers: %d bytes held, max_memory %d", i+1, got, f.wc.MaxMemory)
		}
	}
	if n := f.wc.store.len(); n < 4 || n >= 200 {
		t.Errorf("%d entries held, want some but not all 200", n)
	}
	if got := value(bytesGauge.WithLabelValues("")); got != float64(f.wc.store.size()) {
		t.Errorf("bytes gauge %.0f, store holds %d", got, f.wc.store.size())
	}
}

// clamp's handler is what wirecache finds in a block with clamp.
var _ ttlFloorer = (*clamp.Clamp)(nil)

// withClamp puts cl between wirecache and the chain, as plugin.cfg orders them, and tells wirecache about it
// as its OnStartup does.
func (f *fixture) withClamp(cl *clamp.Clamp) {
	cl.Next = f.chain
	f.wc.Next = cl
	f.wc.floorer = cl
}

// answerTTLs returns the TTLs of the answer and authority sections of reply.
func answerTTLs(t *testing.T, reply []byte) []uint32 {
	t.Helper()
	m := new(dns.Msg)
	if err := m.Unpack(reply); err != nil {
		t.Fatal(err)
	}
	var ttls []uint32
	for _, section := range [][]dns.RR{m.Answer, m.Ns} {
		for _, r := range section {
			ttls = append(ttls, r.Header().Ttl)
		}
	}
	return ttls
}

// TestHitsKeepClampWindow serves hits through a block with clamp: they count down to the MIN of the window
// of their answer, never below, and only for names in clamp's zones.
func TestHitsKeepClampWindow(t *testing.T) {
	tests := []struct {
		name    string
		clamp   func() *clamp.Clamp // nil: no clamp in the block
		qname   string
		qtype   uint16
		elapsed time.Duration
		want    []uint32
	}{
		// testZone's TTLs 120 and 100 go through clamp's default success window, 5 to 30.
		{"no clamp", nil, "www.example.org.", dns.TypeA, 98 * time.Second, []uint32{22, 2}},
		{"success", clamp.New, "www.example.org.", dns.TypeA, 28 * time.Second, []uint32{5, 5}},
		{"success, above MIN", clamp.New, "www.example.org.", dns.TypeA, 20 * time.Second, []uint32{10, 10}},
		// The SOA's 300 goes through the default denial window, 5 to 5.
		{"nxdomain", clamp.New, "nope.example.org.", dns.TypeA, 4 * time.Second, []uint32{5}},
		{"nodata", clamp.New, "www.example.org.", dns.TypeMX, 4 * time.Second, []uint32{5}},
		{"denial window", func() *clamp.Clamp {
			cl := clamp.New()
			cl.Denial = clamp.Window{Min: 2, Max: 10}
			return cl
		}, "nope.example.org.", dns.TypeA, 9 * time.Second, []uint32{2}},
		{"name outside clamp's zones", func() *clamp.Clamp {
			cl := clamp.New()
			cl.Zones = []string{"example.net."}
			cl.Success = clamp.Window{Min: 200, Max: 300}
			return cl
		}, "www.example.org.", dns.TypeA, 98 * time.Second, []uint32{22, 2}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			if tc.clamp != nil {
				f.withClamp(tc.clamp())
			}
			req := newQuery(tc.qname, tc.qtype, 1232, false)
			if _, called := f.ask(req.Copy(), udp4Client); !called {
				t.Fatal("first query did not reach the chain")
			}
			f.now = t0.Add(tc.elapsed)
			reply, called := f.ask(req.Copy(), udp4Client)
			if called {
				t.Fatal("not a wirecache hit")
			}
			if got := answerTTLs(t, reply); !slices.Equal(got, tc.want) {
				t.Errorf("TTLs %v after %v, want %v", got, tc.elapsed, tc.want)
			}
		})
	}
}

// TestBypassZonesAreNotCached: a zone a handler of the block says no cache may hold (cache.ZoneBypasser, as
// dynupdate says of the zones it updates) is neither stored nor served, the rest of the block as usual.
func TestBypassZonesAreNotCached(t *testing.T) {
	port := freePort(t)
	startCoreDNS(t, fmt.Sprintf(`example.org:%d {
    bind 127.0.0.1
    wirecache {
        fastpath off
    }
    %s bypass dyn.example.org
    template IN A example.org {
        answer "{{ .Name }} 60 IN A 192.0.2.9"
    }
}
`, port, testOptionDirective))
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	server := "dns://" + addr
	before := counterValue(t, hitsTotal, server)
	for range 2 {
		askA(t, addr, "host.dyn.example.org.")
		askA(t, addr, "host.example.org.")
	}
	if got := counterValue(t, hitsTotal, server) - before; got != 1 {
		t.Errorf("%v hits, want 1: the second host.example.org, and never a name in dyn.example.org", got)
	}
}
