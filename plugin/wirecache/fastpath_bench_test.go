//go:build linux

package wirecache

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/coredns/coredns/core/dnsserver"

	"github.com/miekg/dns"
)

// BenchmarkFastPathHit is the fast path's work for one hit, from the datagram's bytes to the reply's, without
// the system calls: read the query, choose the block, find the entry, write the reply and count it.
func BenchmarkFastPathHit(b *testing.B) {
	wc := New()
	wc.Next = benchChain(b)
	ctx := context.WithValue(context.Background(), dnsserver.Key{}, &dnsserver.Server{Addr: "dns://:53"})
	w := &discardWriter{remote: &net.UDPAddr{IP: net.IPv4(10, 0, 0, 7), Port: 40212}}
	if _, err := wc.ServeDNS(ctx, w, newQuery("www.example.org.", dns.TypeA, 1232, false)); err != nil {
		b.Fatal(err)
	}
	routes := fastRouting{".": &fastBlock{wc: wc, metrics: wc.metrics.forAddr("dns://:53", nil)}}
	fp := &fastPath{routes: routes}
	r := newFastReader(fp)
	q, err := newQuery("www.example.org.", dns.TypeA, 1232, false).Pack()
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if !r.answer(q, 0, now) {
			b.Fatal("not answered")
		}
		r.nOut, r.arena = 0, r.arena[:0]
	}
}
