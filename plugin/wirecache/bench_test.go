package wirecache

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"strings"
	"testing"

	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin"
	"github.com/coredns/coredns/plugin/cache"
	"github.com/coredns/coredns/plugin/metrics"
	"github.com/coredns/coredns/request"
	"github.com/nodelocaldns/nodelocaldns/plugin/clamp"

	"github.com/miekg/dns"
)

// discardWriter is the cheapest dns.ResponseWriter that still does what miekg/dns's does on a reply: WriteMsg
// packs, Write hands the bytes on (here to nowhere).
type discardWriter struct{ remote net.Addr }

func (w *discardWriter) WriteMsg(m *dns.Msg) error {
	_, err := m.Pack()
	return err
}
func (w *discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *discardWriter) LocalAddr() net.Addr         { return w.remote }
func (w *discardWriter) RemoteAddr() net.Addr        { return w.remote }
func (w *discardWriter) Close() error                { return nil }
func (w *discardWriter) TsigStatus() error           { return nil }
func (w *discardWriter) TsigTimersOnly(bool)         {}
func (w *discardWriter) Hijack()                     {}

// benchChain answers www.example.org A like an upstream would, for the first (missing) query.
func benchChain(b *testing.B) plugin.Handler { return &chain{zone: testZone(b)} }

// runHits warms h with one query and then measures the same query, which every handler answers from its cache.
// The server's per-request work (reading the packet, the ScrubWriter, the goroutine) is outside the loop.
func runHits(b *testing.B, h plugin.Handler) {
	ctx, r, base := warmHit(b, h)
	w := request.NewScrubWriter(r, base)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := h.ServeDNS(ctx, w, r); err != nil {
			b.Fatal(err)
		}
	}
}

// warmHit sends h the query the hit benchmarks ask, from a server on :53, so that h stores its answer; it
// returns what to ask again.
func warmHit(b *testing.B, h plugin.Handler) (context.Context, *dns.Msg, *discardWriter) {
	b.Helper()
	ctx := context.WithValue(context.Background(), dnsserver.Key{}, &dnsserver.Server{Addr: "dns://:53"})
	r := newQuery("www.example.org.", dns.TypeA, 1232, false)
	base := &discardWriter{remote: &net.UDPAddr{IP: net.IPv4(10, 0, 0, 7), Port: 40212}}
	if _, err := h.ServeDNS(ctx, request.NewScrubWriter(r, base), r); err != nil {
		b.Fatal(err)
	}
	return ctx, r, base
}

// BenchmarkHit is wirecache's hit path.
func BenchmarkHit(b *testing.B) {
	wc := New()
	wc.Next = benchChain(b)
	before := value(hitsTotal.WithLabelValues("dns://:53"))
	runHits(b, wc)
	if value(hitsTotal.WithLabelValues("dns://:53")) == before {
		b.Fatal("no wirecache hits")
	}
}

// BenchmarkHitClampFloor is wirecache's hit path in a block with clamp, whose MIN every TTL is compared with.
func BenchmarkHitClampFloor(b *testing.B) {
	cl := clamp.New()
	cl.Next = benchChain(b)
	wc := New()
	wc.Next = cl
	wc.floorer = cl
	before := value(hitsTotal.WithLabelValues("dns://:53"))
	runHits(b, wc)
	if value(hitsTotal.WithLabelValues("dns://:53")) == before {
		b.Fatal("no wirecache hits")
	}
}

// BenchmarkCacheHit is the stock cache plugin's hit path, the baseline wirecache replaces.
func BenchmarkCacheHit(b *testing.B) {
	c := cache.New()
	c.Next = benchChain(b)
	runHits(b, c)
}

// BenchmarkStockChainHit is what a hit costs in a stock node-cache block: metrics in front of cache.
func BenchmarkStockChainHit(b *testing.B) {
	c := cache.New()
	c.Next = benchChain(b)
	m := metrics.New("localhost:0")
	m.AddZone(".")
	m.Next = c
	runHits(b, m)
}

// BenchmarkHitParallel is wirecache's hit path from all Ps at once: shards and the entry are shared.
func BenchmarkHitParallel(b *testing.B) {
	wc := New()
	wc.Next = benchChain(b)
	ctx := context.WithValue(context.Background(), dnsserver.Key{}, &dnsserver.Server{Addr: "dns://:53"})
	r := newQuery("www.example.org.", dns.TypeA, 1232, false)
	base := &discardWriter{remote: &net.UDPAddr{IP: net.IPv4(10, 0, 0, 7), Port: 40212}}
	if _, err := wc.ServeDNS(ctx, request.NewScrubWriter(r, base), r); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		w := request.NewScrubWriter(r, base)
		for pb.Next() {
			if _, err := wc.ServeDNS(ctx, w, r); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkEntryMemory stores answers of a cluster's usual shapes and of a large one, and reports the heap
// an entry takes (after a collection) next to what the store counts against max_memory for it; entryOverhead
// comes from it. Run it with:
//
//	go test ./plugin/wirecache -run '^$' -bench EntryMemory -benchtime 1x
func BenchmarkEntryMemory(b *testing.B) {
	for _, shape := range []struct {
		name   string
		qtype  uint16
		answer func(name string) []dns.RR
	}{
		{"A", dns.TypeA, func(name string) []dns.RR {
			return []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 30}, A: net.IPv4(10, 96, 3, 7)}}
		}},
		{"NXDOMAIN", dns.TypeA, nil},
		{"TXTx20", dns.TypeTXT, func(name string) []dns.RR {
			txt := make([]dns.RR, 20)
			for i := range txt {
				txt[i] = &dns.TXT{Hdr: dns.RR_Header{Name: name, Rrtype: dns.TypeTXT, Class: dns.ClassINET, Ttl: 600},
					Txt: []string{fmt.Sprintf("%02d-%s", i, strings.Repeat("x", 90))}}
			}
			return txt
		}},
	} {
		b.Run(shape.name, func(b *testing.B) {
			const entries = 20000
			wc := New()
			wc.Capacity, wc.MaxMemory = 4*entries, 1<<40 // room in every shard
			wc.prepare()
			z := testZone(b)
			wc.Next = &chain{zone: z, modify: func(m *dns.Msg) {
				if shape.answer != nil {
					m.Rcode, m.Ns, m.Answer = dns.RcodeSuccess, nil, shape.answer(m.Question[0].Name)
				}
			}}
			ctx := context.Background()
			base := &discardWriter{remote: &net.UDPAddr{IP: net.IPv4(10, 0, 0, 7), Port: 40212}}
			var before, after runtime.MemStats
			for b.Loop() {
				runtime.GC()
				runtime.ReadMemStats(&before)
				// Each query is made here and dropped after its answer, as the server drops it, so what
				// the entry keeps of it counts too.
				for i := range entries {
					r := newQuery(fmt.Sprintf("service-%05d.my-namespace.svc.cluster.local.", i), shape.qtype, 1232, false)
					if _, err := wc.ServeDNS(ctx, request.NewScrubWriter(r, base), r); err != nil {
						b.Fatal(err)
					}
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
			}
			if wc.store.len() != entries {
				b.Fatalf("%d entries stored, want %d", wc.store.len(), entries)
			}
			b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/entries, "heap-bytes/entry")
			b.ReportMetric(float64(wc.store.size())/entries, "counted-bytes/entry")
		})
	}
}
