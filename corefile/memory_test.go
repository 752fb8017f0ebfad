package corefile

import (
	"fmt"
	"net"
	"runtime"
	"testing"

	"github.com/miekg/dns"
)

// BenchmarkCacheEntryMemory measures the heap one CoreDNS cache entry holds, for a positive answer (one A
// record) and a negative one (NXDOMAIN with an SOA), with the names a cluster sees, alone and with a
// wirecache entry for the same answer. cacheEntryBytes and wireCacheEntryBytes in check.go come from it.
// Run it with:
//
//	go test ./corefile -run '^$' -bench CacheEntryMemory -benchtime 1x
func BenchmarkCacheEntryMemory(b *testing.B) {
	for _, kind := range []struct{ name, suffix, front string }{
		{"success", ".my-namespace.svc.cluster.local.", ""},
		{"denial", ".my-namespace.nx.cluster.local.", ""},
		// The same with wirecache in front: the difference is what a wirecache entry adds.
		{"success+wirecache", ".my-namespace.svc.cluster.local.", "wirecache {\n        capacity 1000000\n        max_memory 1GiB\n    }"},
		{"denial+wirecache", ".my-namespace.nx.cluster.local.", "wirecache {\n        capacity 1000000\n        max_memory 1GiB\n    }"},
	} {
		b.Run(kind.name, func(b *testing.B) {
			upstream := fakeUpstream(b, answerEverything)
			port := freePort(b)
			// Capacities far above the entry count, so that nothing is evicted and every query adds one entry.
			startCoreDNS(b, fmt.Appendf(nil, `cluster.local:%s {
    bind 127.0.0.1
    %s
    cache {
        success 1000000 30
        denial 1000000 30
    }
    forward . %s
}`, port, kind.front, upstream))
			addr := "127.0.0.1:" + port
			const entries = 20000
			var before, after runtime.MemStats
			for i := 0; b.Loop(); i++ {
				// Warm the server's pools before measuring.
				exchange(b, addr, fmt.Sprintf("warm-%d-%d%s", i, 0, kind.suffix), dns.TypeA)
				runtime.GC()
				runtime.ReadMemStats(&before)
				for j := range entries {
					exchange(b, addr, fmt.Sprintf("service-%d-%05d%s", i, j, kind.suffix), dns.TypeA)
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
			}
			b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/entries, "bytes/entry")
		})
	}
}

// BenchmarkLargeAnswerMemory measures what the cache plugin holds for one answer of many A records, up to the
// largest a DNS message can be (65,535 bytes: 4,090 records under a compressed owner name), as the cluster
// DNS returns for a headless Service with that many ready endpoints and forward (force_tcp) passes on whole.
// wirecache stores none of these (its entries stop at 4,096 bytes), and the cache plugin bounds entries, not
// bytes, so the worst case of a Corefile is its cache capacity times this (README, Memory).
func BenchmarkLargeAnswerMemory(b *testing.B) {
	for _, records := range []int{75, 4090} { // a 1,232-byte EDNS answer; the largest message
		b.Run(fmt.Sprintf("records=%d", records), func(b *testing.B) {
			var wire int
			upstream := fakeUpstream(b, func(w dns.ResponseWriter, r *dns.Msg) {
				m := new(dns.Msg)
				m.SetReply(r)
				m.Authoritative, m.Compress = true, true
				for i := range records {
					m.Answer = append(m.Answer, &dns.A{
						Hdr: dns.RR_Header{Name: r.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 30},
						A:   net.IPv4(10, 1, byte(i>>8), byte(i)),
					})
				}
				wire = m.Len()
				w.WriteMsg(m)
			})
			port := freePort(b)
			startCoreDNS(b, fmt.Appendf(nil, `cluster.local:%s {
    bind 127.0.0.1
    cache {
        success 1000000 30
        denial 1000000 30
    }
    forward . %s {
        force_tcp
    }
}`, port, upstream))
			c := &dns.Client{Net: "tcp"}
			ask := func(name string) {
				m := new(dns.Msg)
				m.SetQuestion(name, dns.TypeA)
				r, _, err := c.Exchange(m, "127.0.0.1:"+port)
				if err != nil || len(r.Answer) != records {
					b.Fatalf("query %s: %v (%d records)", name, err, len(r.Answer))
				}
			}
			const entries = 50
			var before, after runtime.MemStats
			for i := 0; b.Loop(); i++ {
				ask(fmt.Sprintf("warm-%d.headless.my-namespace.svc.cluster.local.", i))
				runtime.GC()
				runtime.ReadMemStats(&before)
				for j := range entries {
					ask(fmt.Sprintf("s%d-%d.headless.my-namespace.svc.cluster.local.", i, j))
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
			}
			b.ReportMetric(float64(wire), "wire-bytes")
			b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/entries, "bytes/entry")
		})
	}
}
