//go:build linux

package faults

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodelocaldns/nodelocaldns/test/simnode"
)

// nft runs nft in the rig's node namespace.
func (r *rig) nft(args ...string) (string, error) {
	return r.n.In(context.Background(), r.n.NodeNS, "nft", args...)
}

// ourTables lists the nftables tables of ours on the node.
func (r *rig) ourTables() []string {
	r.t.Helper()
	out, err := r.nft("list", "tables")
	if err != nil {
		r.t.Fatal(err)
	}
	var tables []string
	for l := range strings.SplitSeq(out, "\n") {
		if f := strings.Fields(l); len(f) == 3 && strings.HasPrefix(f[2], "nodelocaldns") {
			tables = append(tables, f[1]+" "+f[2])
		}
	}
	return tables
}

// hooked reports whether the cache's table has both base chains, each jumping to its rules.
func (r *rig) hooked() bool {
	out, err := r.nft("list", "table", "inet", "nodelocaldns")
	return err == nil && strings.Count(out, "jump endpoints") == 2 && strings.Count(out, " notrack ") >= 8
}

// newNFTablesRig is a rig on a node whose kube-proxy runs in nftables mode, with the cache and the guard
// left to find the backend (auto).
func newNFTablesRig(t *testing.T) *rig {
	t.Helper()
	return newRigMode(t, "auto", simnode.NFTablesMode)
}

// TestNFTablesGuardFailOpen: kube-proxy in nftables mode. A Pod asking the kube-dns ClusterIP, then one
// asking the link-local address, every 100 ms, while the cache is SIGKILLed: the guard unhooks the cache's
// table and takes the ClusterIP off the link (kube-proxy's DNAT takes over), and DNATs the link-local
// address to the endpoints kube-proxy's table gives kube-dns-upstream. The times are logged, not asserted.
func TestNFTablesGuardFailOpen(t *testing.T) {
	r := newNFTablesRig(t)
	r.startCache()
	r.startGuard()
	if !strings.Contains(r.cache.Output(), "using rules backend nftables") || !strings.Contains(r.guard.Output(), "using rules backend nftables") {
		t.Fatalf("cache or guard not on the nftables backend:\ncache:\n%s\nguard:\n%s", r.cache.Output(), r.guard.Output())
	}
	for run, server := range []string{kubeDNS, linkLocal} {
		if err := r.podQuery(server); err != nil {
			t.Fatalf("%s: the cache does not answer before the kill: %v", server, err)
		}
		samples := r.killCacheWhileQuerying(server)
		span, failed := failureSpan(samples)
		if !recoveredAfterFailure(samples) {
			t.Fatalf("%s: lookups did not recover within 15 s of the kill (%d of %d failed)\nguard:\n%s", server, failed, len(samples), r.guard.Output())
		}
		t.Logf("%s: %d lookups failed over %v after SIGKILL", server, failed, span.Round(time.Millisecond))
		// The guard counts a failover once it has finished failing open, and logs it after counting.
		r.waitLog(r.guard, "failed open in", run+1, time.Minute)
		if got := r.mustScrape(guardMetrics, "coredns_nodecache_guard_failovers_total", ""); got != float64(run+1) {
			t.Fatalf("%v failovers, want %d", got, run+1)
		}
		if r.hooked() || has(r.linkAddrs(), simnode.KubeDNSClusterIP) {
			t.Fatalf("after failing open: hooked %v, link holds %v", r.hooked(), r.linkAddrs())
		}
		divert, err := r.nft("list", "table", "inet", "nodelocaldns-guard")
		if err != nil || !strings.Contains(divert, "ip daddr 169.254.20.10 udp dport 53 dnat ip to "+simnode.ClusterDNSPodIP+":53") ||
			!strings.Contains(divert, "ip daddr 169.254.20.10 tcp dport 53 dnat ip to "+simnode.ClusterDNSPodIP+":53") {
			t.Fatalf("the guard's divert: %v\n%s", err, divert)
		}
		// The cache comes back and takes the node back.
		r.startCache()
		r.waitFor("guard watches again", eventually, func() bool {
			v, err := r.scrape(guardMetrics, "coredns_nodecache_guard_state", "")
			return err == nil && v == 0
		})
		if !r.hooked() || !has(r.linkAddrs(), simnode.KubeDNSClusterIP) {
			t.Fatalf("the restarted cache did not take the node back: hooked %v, link holds %v", r.hooked(), r.linkAddrs())
		}
		if tables := r.ourTables(); strings.Contains(strings.Join(tables, " "), "nodelocaldns-guard") {
			t.Fatalf("the restarted cache left the guard's table: %v", tables)
		}
	}
}

// TestDivertFollowsTheUpstreamEndpoints: the guard failed the node open while kube-dns-upstream's
// endpoint was one no Pod has; kube-proxy then moves it to the cluster-DNS Pod (a cluster-DNS rollout during
// a long fail-open). The divert follows within the guard's recheck, and link-local lookups are answered
// again; in both kube-proxy modes.
func TestDivertFollowsTheUpstreamEndpoints(t *testing.T) {
	for _, mode := range []simnode.KubeProxyMode{simnode.NFTablesMode, simnode.IPTablesMode} {
		t.Run(string(mode), func(t *testing.T) {
			backend := "auto"
			if mode == simnode.IPTablesMode {
				backend = "nft" // the rig's iptables commands are named after the flavour
			}
			r := newRigMode(t, backend, mode)
			r.startCache()
			r.startGuard()
			const gone = "10.244.1.99"
			r.n.SetUpstreamEndpoint(gone)
			kill(t, r.cache, syscall.SIGKILL)
			r.waitLog(r.guard, "failed open in", 1, time.Minute)
			divert := func() string {
				var out string
				var err error
				if mode == simnode.NFTablesMode {
					out, err = r.nft("list", "table", "inet", "nodelocaldns-guard")
				} else {
					out, err = r.ipt("-t", "nat", "-S", "NODELOCALDNS-GUARD")
				}
				if err != nil {
					t.Fatal(err)
				}
				return out
			}
			if d := divert(); !strings.Contains(d, gone+":53") {
				t.Fatalf("the divert does not point at kube-dns-upstream's endpoint %s:\n%s", gone, d)
			}
			r.n.SetUpstreamEndpoint(simnode.ClusterDNSPodIP)
			r.waitFor("the divert follows the endpoint", 20*time.Second, func() bool {
				d := divert()
				return strings.Contains(d, simnode.ClusterDNSPodIP+":53") && !strings.Contains(d, gone)
			})
			r.waitLog(r.guard, "kube-dns-upstream's endpoints changed", 1, time.Second)
			if err := r.podQuery(linkLocal); err != nil {
				t.Errorf("a link-local lookup once the divert followed the endpoint: %v", err)
			}
		})
	}
}

// TestNFTablesRulesRepaired: the cache's table deleted, flushed, a base chain deleted or a chain flushed
// behind its back is put back by its sync loop (every second here). The time each repair took is logged; the
// bound only fails a cache that does not repair.
func TestNFTablesRulesRepaired(t *testing.T) {
	r := newNFTablesRig(t)
	r.startCache()
	for _, damage := range [][]string{
		{"delete", "table", "inet", "nodelocaldns"},
		{"flush", "table", "inet", "nodelocaldns"},
		{"delete", "chain", "inet", "nodelocaldns", "prerouting"},
		{"flush", "chain", "inet", "nodelocaldns", "endpoints"},
	} {
		if _, err := r.nft(damage...); err != nil {
			t.Fatal(err)
		}
		took := r.waitFor(strings.Join(damage, " ")+": repaired", eventually, r.hooked)
		t.Logf("nft %s: repaired in %v", strings.Join(damage, " "), took.Round(time.Millisecond))
		for _, server := range []string{linkLocal, kubeDNS} {
			if err := r.podQuery(server); err != nil {
				t.Errorf("nft %s: %s does not answer after the repair: %v", strings.Join(damage, " "), server, err)
			}
		}
	}
	if !strings.Contains(r.cache.Output(), "repaired table inet nodelocaldns") {
		t.Errorf("the repairs were not logged:\n%s", r.cache.Output())
	}
}

// TestNFTablesSIGTERM: SIGTERM while Pods query leaves none of our tables and no link, kube-proxy's table
// as it was, and Pods resolving through kube-proxy.
func TestNFTablesSIGTERM(t *testing.T) {
	r := newNFTablesRig(t)
	before, err := r.nft("list", "table", "ip", "kube-proxy")
	if err != nil {
		t.Fatal(err)
	}
	cache := r.startCache()
	r.startGuard()
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.hammer(kubeDNS, 2, 3*time.Second, 1_000_000)
	}()
	time.Sleep(time.Second)
	start := time.Now()
	kill(t, cache, syscall.SIGTERM)
	if err := cache.Wait(terminationGrace); err != nil && !strings.Contains(err.Error(), "exit status") {
		t.Fatalf("cache did not exit: %v", err)
	}
	t.Logf("exited %v after SIGTERM under load", time.Since(start).Round(time.Millisecond))
	if out := cache.Output(); !strings.Contains(out, "SIGTERM: removed the rules and the addresses") {
		t.Errorf("the cache did not log a complete teardown:\n%s", out)
	}
	<-done
	if tables := r.ourTables(); len(tables) != 0 {
		t.Errorf("tables left after SIGTERM: %v", tables)
	}
	if r.linkAddrs() != nil {
		t.Errorf("link left behind with %v", r.linkAddrs())
	}
	if after, err := r.nft("list", "table", "ip", "kube-proxy"); err != nil || after != before {
		t.Errorf("kube-proxy's table changed: %v\nbefore:\n%s\nafter:\n%s", err, before, after)
	}
	if err := r.podQuery(kubeDNS); err != nil {
		t.Errorf("Pods do not resolve through kube-proxy after the cache stopped: %v", err)
	}
	if v := r.mustScrape(guardMetrics, "coredns_nodecache_guard_failovers_total", ""); v != 0 {
		t.Errorf("the guard failed a cleanly stopped cache open")
	}
}
