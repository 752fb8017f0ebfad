package answer

import (
	"context"
	"testing"

	"github.com/coredns/coredns/plugin/cache"
	"github.com/coredns/coredns/plugin/pkg/dnstest"
	"github.com/coredns/coredns/plugin/test"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
)

func rrs(t *testing.T, ss ...string) []dns.RR {
	t.Helper()
	out := make([]dns.RR, 0, len(ss))
	for _, s := range ss {
		rr, err := dns.NewRR(s)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, rr)
	}
	return out
}

// The TTLs are 2000 everywhere: CoreDNS's cache with its defaults keeps a positive answer up to 3600 seconds
// and a negative one up to 1800, so the TTL of a cache hit shows which window the cache put it in.
const soa = "example.org. 2000 IN SOA ns.example.org. hostmaster.example.org. 1 7200 3600 1209600 2000"

type cacheWindow int

const (
	notCached cacheWindow = iota
	positive
	negative
)

// responseCase is a response to a query for qname and qtype.
type responseCase struct {
	name   string
	qname  string
	qtype  uint16
	rcode  int
	answer []string
	ns     []string
	extra  []string
	want   Class
	cache  cacheWindow
}

var cases = []responseCase{
	{name: "data", qname: "www.example.org.", qtype: dns.TypeA, answer: []string{"www.example.org. 2000 IN A 192.0.2.1"},
		want: Success, cache: positive},
	{name: "data with an SOA in authority", qname: "www.example.org.", qtype: dns.TypeA,
		answer: []string{"www.example.org. 2000 IN A 192.0.2.1"}, ns: []string{soa}, want: Success, cache: positive},
	{name: "CNAME chain to data with an SOA", qname: "alias.example.org.", qtype: dns.TypeA,
		answer: []string{"alias.example.org. 2000 IN CNAME www.example.org.", "www.example.org. 2000 IN A 192.0.2.1"},
		ns:     []string{soa}, want: Success, cache: positive},
	{name: "NODATA", qname: "www.example.org.", qtype: dns.TypeMX, ns: []string{soa}, want: Denial, cache: negative},
	{name: "CNAME chain to NODATA", qname: "alias.example.org.", qtype: dns.TypeMX,
		answer: []string{"alias.example.org. 2000 IN CNAME www.example.org."}, ns: []string{soa}, want: Denial, cache: negative},
	{name: "CNAME loop with an SOA", qname: "a.example.org.", qtype: dns.TypeA,
		answer: []string{"a.example.org. 2000 IN CNAME b.example.org.", "b.example.org. 2000 IN CNAME a.example.org."},
		ns:     []string{soa}, want: Denial, cache: negative},
	{name: "data at another name with an SOA", qname: "www.example.org.", qtype: dns.TypeA,
		answer: []string{"other.example.org. 2000 IN A 192.0.2.1"}, ns: []string{soa}, want: Denial, cache: negative},
	{name: "CNAME query", qname: "alias.example.org.", qtype: dns.TypeCNAME,
		answer: []string{"alias.example.org. 2000 IN CNAME www.example.org."}, ns: []string{soa}, want: Success, cache: positive},
	{name: "ANY query", qname: "www.example.org.", qtype: dns.TypeANY,
		answer: []string{"www.example.org. 2000 IN TXT \"x\""}, ns: []string{soa}, want: Success, cache: positive},
	{name: "referral", qname: "www.sub.example.org.", qtype: dns.TypeA, ns: []string{"sub.example.org. 2000 IN NS ns.sub.example.org."},
		extra: []string{"ns.sub.example.org. 2000 IN A 192.0.2.53"}, want: Success, cache: positive},
	{name: "data in additional only (whoami)", qname: "www.example.org.", qtype: dns.TypeA,
		extra: []string{"www.example.org. 2000 IN A 192.0.2.1"}, want: Success, cache: positive},
	{name: "NXDOMAIN", qname: "nx.example.org.", qtype: dns.TypeA, rcode: dns.RcodeNameError, ns: []string{soa},
		want: Denial, cache: negative},
	// The cache does not store this one (Typify gives up on it), but what passes still gets a window.
	{name: "NXDOMAIN at the end of a CNAME chain", qname: "alias.example.org.", qtype: dns.TypeA, rcode: dns.RcodeNameError,
		answer: []string{"alias.example.org. 2000 IN CNAME nx.example.org."}, ns: []string{soa}, want: Denial, cache: notCached},
	// The cache keeps SERVFAIL for a few seconds of its own (serve_stale's failttl), in neither window.
	{name: "SERVFAIL", qname: "www.example.org.", qtype: dns.TypeA, rcode: dns.RcodeServerFailure, want: Other, cache: negative},
	{name: "REFUSED", qname: "www.example.org.", qtype: dns.TypeA, rcode: dns.RcodeRefused, want: Other, cache: notCached},
}

func (tc *responseCase) reply(t *testing.T, req *dns.Msg) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	m.SetReply(req)
	m.Rcode = tc.rcode
	m.Answer, m.Ns, m.Extra = rrs(t, tc.answer...), rrs(t, tc.ns...), rrs(t, tc.extra...)
	return m
}

func TestClassify(t *testing.T) {
	for i := range cases {
		tc := &cases[i]
		t.Run(tc.name, func(t *testing.T) {
			req := new(dns.Msg).SetQuestion(tc.qname, tc.qtype)
			if got := Classify(tc.reply(t, req)); got != tc.want {
				t.Errorf("Classify = %d, want %d", got, tc.want)
			}
		})
	}
}

// TestClassifyAgreesWithCache puts each response through CoreDNS's cache plugin and reads which of its caches
// took it from coredns_cache_entries.
func TestClassifyAgreesWithCache(t *testing.T) {
	for i := range cases {
		tc := &cases[i]
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			c := cache.New()
			c.Next = test.HandlerFunc(func(_ context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
				calls++
				m := tc.reply(t, r)
				return m.Rcode, w.WriteMsg(m)
			})
			for range 2 {
				req := new(dns.Msg).SetQuestion(tc.qname, tc.qtype)
				if _, err := c.ServeDNS(context.Background(), dnstest.NewRecorder(&test.ResponseWriter{}), req); err != nil {
					t.Fatal(err)
				}
			}
			got := notCached
			if calls == 1 {
				// Stored: this cache's write has just set the gauges.
				switch success, denial := cacheEntries(t, "success"), cacheEntries(t, "denial"); {
				case success == 1 && denial == 0:
					got = positive
				case success == 0 && denial == 1:
					got = negative
				default:
					t.Fatalf("the cache holds %v positive and %v negative entries", success, denial)
				}
			}
			if got != tc.cache {
				t.Errorf("the cache keeps it as %d, want %d", got, tc.cache)
			}
			if tc.cache != notCached && tc.want != Other && (tc.cache == positive) != (tc.want == Success) {
				t.Errorf("Classify says %d where the cache keeps it as %d", tc.want, tc.cache)
			}
		})
	}
}

// cacheEntries reads coredns_cache_entries{type=kind} of a cache.New() cache, which has empty labels otherwise.
func cacheEntries(t *testing.T, kind string) float64 {
	t.Helper()
	families, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "coredns_cache_entries" {
			continue
		}
		for _, m := range f.Metric {
			labels := map[string]string{}
			for _, l := range m.Label {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["type"] == kind && labels["server"] == "" && labels["zones"] == "" {
				return m.GetGauge().GetValue()
			}
		}
	}
	return 0
}
