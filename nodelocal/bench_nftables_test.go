//go:build linux

package nodelocal

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/netnstest"
	"github.com/nodelocaldns/nodelocaldns/internal/privtest"
	"github.com/nodelocaldns/nodelocaldns/internal/stats"
	"github.com/nodelocaldns/nodelocaldns/nodelocal/internal/rules"
)

// BenchmarkSyncNFTables measures one steady-state sync (Reconciler.Ensure: link, addresses and the table
// inet nodelocaldns, dual-stack) with the nftables backend, while kube-proxy's table ip kube-proxy holds
// 0 or 50,000 elements in its service-ips verdict map (and as many in its cluster-ips set). It logs the
// ratios of the CPU time per sync (this process's, kernel time of its netlink calls included) and of the
// median wall times, 50k against 0; the goal is at most 1.5. Sizes alternate over three rounds, so that
// the load of a shared machine weighs on both alike.
//
//	NODELOCALDNS_REQUIRE_PRIVILEGED=1 go test -run '^$' -bench BenchmarkSyncNFTables -benchtime 1x ./nodelocal/
func BenchmarkSyncNFTables(b *testing.B) {
	privtest.RequirePrivileged(b, "ip", "nft")
	if !netnstest.Run(b) {
		return
	}
	r, err := New(Config{Backend: string(rules.NFTables), LockPath: filepath.Join(b.TempDir(), "lock")})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	ctx := context.Background()
	if _, err := r.Acquire(ctx, dualStack); err != nil {
		b.Fatal(err)
	}
	defer r.Teardown(ctx)
	const syncs = 500
	cpu := map[int][]time.Duration{}
	wall := map[int][]time.Duration{}
	for round := 1; round <= 3; round++ {
		for _, n := range []int{0, 50000} {
			loadKubeProxyNFTables(b, n)
			if err := r.Ensure(ctx); err != nil {
				b.Fatal(err)
			}
			took := make([]time.Duration, syncs)
			cpuStart := cpuTime(b)
			for i := range took {
				start := time.Now()
				if err := r.Ensure(ctx); err != nil {
					b.Fatal(err)
				}
				took[i] = time.Since(start)
			}
			cpu[n] = append(cpu[n], (cpuTime(b)-cpuStart)/syncs)
			wall[n] = append(wall[n], stats.Median(took))
		}
	}
	b.Logf("per sync, rounds 1-3: CPU %v with 0 elements in kube-proxy's maps, %v with 50000; median wall %v and %v",
		cpu[0], cpu[50000], wall[0], wall[50000])
	b.Logf("ratio 50000/0: CPU %.2f, median wall %.2f", ratio(stats.Median(cpu[50000]), stats.Median(cpu[0])), ratio(stats.Median(wall[50000]), stats.Median(wall[0])))
	b.ReportMetric(float64(stats.Median(cpu[50000]).Nanoseconds()), "cpu-ns/sync@50k")
	b.ReportMetric(float64(stats.Median(cpu[0]).Nanoseconds()), "cpu-ns/sync@0")
}

func ratio(a, b time.Duration) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// loadKubeProxyNFTables replaces table ip kube-proxy with one whose service-ips map and cluster-ips set
// hold n elements each.
func loadKubeProxyNFTables(b testing.TB, n int) {
	b.Helper()
	var s strings.Builder
	s.WriteString("table ip kube-proxy\ndelete table ip kube-proxy\ntable ip kube-proxy {\n" +
		"  set cluster-ips { type ipv4_addr; }\n" +
		"  map service-ips { type ipv4_addr . inet_proto . inet_service : verdict; }\n" +
		"  chain services { ip daddr . meta l4proto . th dport vmap @service-ips; }\n" +
		"  chain nat-prerouting { type nat hook prerouting priority dstnat; policy accept; jump services; }\n}\n")
	for i := 0; i < n; i += 1000 {
		var elems, ips []string
		for j := i; j < min(i+1000, n); j++ {
			ip := fmt.Sprintf("10.%d.%d.%d", 96+j>>16, (j>>8)&255, j&255)
			elems = append(elems, ip+" . tcp . 80 : drop")
			ips = append(ips, ip)
		}
		fmt.Fprintf(&s, "add element ip kube-proxy service-ips { %s }\n", strings.Join(elems, ", "))
		fmt.Fprintf(&s, "add element ip kube-proxy cluster-ips { %s }\n", strings.Join(ips, ", "))
	}
	cmd := exec.Command("nft", "-f", "-")
	cmd.Stdin = strings.NewReader(s.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("nft -f: %v: %s", err, out)
	}
}
