//go:build linux

package wirecache

import (
	"testing"
	"time"

	"github.com/coredns/coredns/core/dnsserver"
)

// BenchmarkFastPathHit is the fast path's work for one hit, from the datagram's bytes to the reply's, without
// the system calls: read the query, choose the block, find the entry, write the reply and count it.
func BenchmarkFastPathHit(b *testing.B) {
	wc := New()
	wc.Next = benchChain(b)
	_, query, _ := warmHit(b, wc)
	routes := newFastRouting(map[string]*fastBlock{".": {wc: wc, metrics: wc.metrics.of(&dnsserver.Server{Addr: "dns://:53"}, nil)}})
	fp := &fastPath{routes: routes}
	r := newFastReader(fp)
	q, err := query.Pack()
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if answered, _ := r.answer(q, 0, now); !answered {
			b.Fatal("not answered")
		}
		r.nOut, r.arena = 0, r.arena[:0]
	}
}
