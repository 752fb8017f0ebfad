//go:build linux

package notrack

import (
	"context"
	"testing"

	"github.com/coredns/coredns/plugin"
	"github.com/coredns/coredns/plugin/test"
	"github.com/miekg/dns"
)

// BenchmarkServeDNS measures what the probe check costs a query that is not a probe: the handler in front
// of a next plugin that answers at once, against that plugin alone.
func BenchmarkServeDNS(b *testing.B) {
	answer := test.HandlerFunc(func(context.Context, dns.ResponseWriter, *dns.Msg) (int, error) {
		return dns.RcodeSuccess, nil
	})
	m := new(dns.Msg)
	m.SetQuestion("kubernetes.default.svc.cluster.local.", dns.TypeA)
	w := &test.ResponseWriter{}
	for _, bc := range []struct {
		name string
		h    plugin.Handler
	}{
		{"next-alone", answer},
		{"notrack-then-next", &Notrack{Next: answer, block: &block{}}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				bc.h.ServeDNS(ctx, w, m)
			}
		})
	}
}
