package corefile

import (
	"fmt"
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
