package clamp

import (
	"context"
	"testing"

	"github.com/coredns/coredns/plugin"
	"github.com/coredns/coredns/plugin/test"

	"github.com/miekg/dns"
)

// passthrough is the baseline: a plugin that only hands the query on, as every plugin does.
type passthrough struct{ Next plugin.Handler }

func (p passthrough) Name() string { return "passthrough" }
func (p passthrough) ServeDNS(ctx context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
	return plugin.NextOrFailure(p.Name(), p.Next, ctx, w, r)
}

// responses are typical answers as clamp sees them behind the cache.
func benchResponses(tb testing.TB) map[string][2]*dns.Msg {
	tb.Helper()
	build := func(qname string, qtype uint16, rcode int, answer, ns []string) [2]*dns.Msg {
		req := new(dns.Msg)
		req.SetQuestion(qname, qtype)
		resp := new(dns.Msg)
		resp.SetRcode(req, rcode)
		for _, s := range answer {
			rr, err := dns.NewRR(s)
			if err != nil {
				tb.Fatal(err)
			}
			resp.Answer = append(resp.Answer, rr)
		}
		for _, s := range ns {
			rr, err := dns.NewRR(s)
			if err != nil {
				tb.Fatal(err)
			}
			resp.Ns = append(resp.Ns, rr)
		}
		return [2]*dns.Msg{req, resp}
	}
	return map[string][2]*dns.Msg{
		// A cache whose caps match the window (the node-local setup) hands out TTLs that fit.
		"A inside window": build("svc.ns.svc.cluster.local.", dns.TypeA, dns.RcodeSuccess,
			[]string{"svc.ns.svc.cluster.local. 20 IN A 10.96.0.10"}, nil),
		"A lowered": build("example.org.", dns.TypeA, dns.RcodeSuccess,
			[]string{"example.org. 300 IN A 192.0.2.1"}, nil),
		"CNAME+2A lowered": build("www.example.org.", dns.TypeA, dns.RcodeSuccess,
			[]string{"www.example.org. 300 IN CNAME cdn.example.net.", "cdn.example.net. 60 IN A 192.0.2.1", "cdn.example.net. 60 IN A 192.0.2.2"}, nil),
		"NXDOMAIN SOA clamped": build("nope.example.org.", dns.TypeA, dns.RcodeNameError, nil,
			[]string{"example.org. 5 IN SOA ns.example.org. admin.example.org. 1 7200 3600 1209600 3600"}),
	}
}

var benchOrder = []string{"A inside window", "A lowered", "CNAME+2A lowered", "NXDOMAIN SOA clamped"}

func BenchmarkServeDNS(b *testing.B) {
	ctx := serverCtx("bench:53")
	responses := benchResponses(b)
	w := &test.ResponseWriter{}

	for _, name := range benchOrder {
		req, resp := responses[name][0], responses[name][1]
		next := writing(resp)

		b.Run(name+"/baseline", func(b *testing.B) {
			p := passthrough{Next: next}
			b.ReportAllocs()
			for b.Loop() {
				p.ServeDNS(ctx, w, req)
			}
		})
		b.Run(name+"/clamp", func(b *testing.B) {
			c := New()
			c.Next = next
			b.ReportAllocs()
			for b.Loop() {
				c.ServeDNS(ctx, w, req)
			}
		})
	}
}

// TestAllocations pins what clamping itself allocates: nothing when the TTLs fit, otherwise one
// allocation for the message copy plus one per changed record.
func TestAllocations(t *testing.T) {
	responses := benchResponses(t)
	want := map[string]float64{
		"A inside window":      0,
		"A lowered":            2,
		"CNAME+2A lowered":     4,
		"NXDOMAIN SOA clamped": 2,
	}
	c := New()
	for _, name := range benchOrder {
		resp := responses[name][1]
		got := testing.AllocsPerRun(100, func() { c.clampMsg(resp, "allocs:53") })
		if got != want[name] {
			t.Errorf("%s: %v allocations, want %v", name, got, want[name])
		}
	}
}
