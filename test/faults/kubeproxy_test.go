//go:build linux

package faults

import (
	"fmt"
	"strings"
	"syscall"
	"testing"

	"github.com/nodelocaldns/nodelocaldns/test/simnode"
)

// What only a real kube-proxy shows: it syncs (changes of another Service make it) and restarts under the
// cache's rules,
// under the guard's divert and under a hand-over's; the cluster-DNS Pod moves while the divert stands; and
// kube-dns-upstream loses every endpoint while diverted and gets them back. kube-proxy's syncs must keep
// succeeding (its kubeproxy_sync_proxy_rules_* metrics, checked again when each test ends) and lookups must
// keep being answered. Each case runs in iptables and in nftables mode; kube-proxy's log is in the test's
// log (-v), and what it said about its syncs is logged.
//
//	NODELOCALDNS_REQUIRE_PRIVILEGED=1 go test -v -run TestRealKubeProxy ./test/faults/

// syncs is how many syncs each case makes kube-proxy run (simnode's KubeProxy.Churn).
const syncs = 3

// eachMode runs fn in a subtest per kube-proxy mode, on a rig with a real kube-proxy.
func eachMode(t *testing.T, fn func(t *testing.T, r *rig)) {
	for _, mode := range []simnode.KubeProxyMode{simnode.IPTablesMode, simnode.NFTablesMode} {
		t.Run(string(mode), func(t *testing.T) {
			backend := "auto"
			if mode == simnode.IPTablesMode {
				backend = "nft" // the rig's iptables commands are named after the flavour
			}
			fn(t, newRigMode(t, backend, mode))
		})
	}
}

// kubeProxyChurn makes kube-proxy sync (Churn), restarts it with SIGTERM (a full sync), makes it sync again,
// SIGKILLs it and starts it again, and after each step runs check. It logs what kube-proxy said about its
// syncs.
func (r *rig) kubeProxyChurn(check func(step string)) {
	r.t.Helper()
	kp := r.n.KubeProxy
	m := kp.Churn(syncs)
	check(fmt.Sprintf("after %d syncs", syncs))
	kp.Restart(syscall.SIGTERM)
	check("after kube-proxy restarted")
	kp.Churn(syncs)
	check(fmt.Sprintf("after %d more syncs", syncs))
	kp.Stop(syscall.SIGKILL)
	kp.Start()
	check("after kube-proxy was SIGKILLed and started again")
	r.t.Logf("kube-proxy: first run %v; last run %v", m, kp.WaitForSync())
	r.logKubeProxySyncs()
}

// logKubeProxySyncs logs the lines of kube-proxy's log about its syncs and its errors, for the report.
func (r *rig) logKubeProxySyncs() {
	var lines []string
	for l := range strings.SplitSeq(r.n.KubeProxy.Log(), "\n") {
		if strings.HasPrefix(l, "E") || strings.HasPrefix(l, "W") || strings.HasPrefix(l, "---") ||
			strings.Contains(l, "Syncing") || strings.Contains(l, "Reloading") || strings.Contains(l, "SyncProxyRules complete") {
			lines = append(lines, l)
		}
	}
	const limit = 60
	if len(lines) > limit {
		lines = append(lines[:limit/2], append([]string{"..."}, lines[len(lines)-limit/2:]...)...)
	}
	r.t.Logf("kube-proxy's log about its syncs:\n%s", strings.Join(lines, "\n"))
}

// answered fails the test unless a Pod's lookup to each server is answered.
func (r *rig) answered(step string, servers ...string) {
	r.t.Helper()
	for _, server := range servers {
		if err := r.podQuery(server); err != nil {
			r.t.Errorf("%s: a lookup to %s: %v", step, server, err)
		}
	}
}

// divert returns the guard's divert as the node's mode writes it.
func (r *rig) divert() string {
	r.t.Helper()
	var out string
	var err error
	if r.n.Mode == simnode.NFTablesMode {
		out, err = r.nft("list", "table", "inet", "nodelocaldns-guard")
	} else {
		out, err = r.ipt("-t", "nat", "-S", "NODELOCALDNS-GUARD")
	}
	if err != nil {
		r.t.Fatalf("the divert: %v", err)
	}
	return out
}

// cacheInPlace reports whether the cache's rules and addresses are in place.
func (r *rig) cacheInPlace() bool {
	hooked := r.jumps()
	if r.n.Mode == simnode.NFTablesMode {
		hooked = r.hooked()
	}
	return hooked && has(r.linkAddrs(), simnode.KubeDNSClusterIP) && has(r.linkAddrs(), simnode.LinkLocalIP)
}

// TestRealKubeProxyUnderTheCache: kube-proxy syncs and restarts while the cache serves the node. The
// cache's rules stay first and in place (the cache repairs nothing), and Pod lookups to both addresses stay
// answered and untracked.
func TestRealKubeProxyUnderTheCache(t *testing.T) {
	eachMode(t, func(t *testing.T, r *rig) {
		r.startCache()
		r.kubeProxyChurn(func(step string) {
			if !r.cacheInPlace() {
				t.Errorf("%s: the cache's rules or addresses are not in place (link %v)", step, r.linkAddrs())
			}
			r.checkServedUntracked()
		})
		// kube-proxy's syncs and starts leave the cache's rules alone: nothing for the cache to repair.
		if strings.Contains(r.cache.Output(), "nodelocal: repaired") {
			t.Errorf("the cache repaired its rules while kube-proxy synced and restarted:\n%s", r.cache.Output())
		}
	})
}

// failOpen starts the cache and the guard, SIGKILLs the cache and waits until the guard has failed open.
func (r *rig) failOpen() {
	r.t.Helper()
	r.startCache()
	r.startGuard()
	kill(r.t, r.cache, syscall.SIGKILL)
	r.waitLog(r.guard, "failed open in", 1, eventually)
}

// TestRealKubeProxyWhileFailedOpen: kube-proxy syncs and restarts while the guard has failed the node
// open: the ClusterIP is kube-proxy's again and the link-local address is diverted; both stay answered,
// and the divert stays.
func TestRealKubeProxyWhileFailedOpen(t *testing.T) {
	eachMode(t, func(t *testing.T, r *rig) {
		r.failOpen()
		want := r.divert()
		r.kubeProxyChurn(func(step string) {
			r.answered(step, kubeDNS, linkLocal)
			if got := r.divert(); got != want {
				t.Errorf("%s: the divert changed from\n%s\nto\n%s", step, want, got)
			}
		})
	})
}

// TestRealKubeProxyAfterAHandOver: kube-proxy syncs and restarts after the cache handed the node to the
// cluster DNS at exit (SIGTERM, no successor); both addresses stay answered, and the next cache takes the
// node back.
func TestRealKubeProxyAfterAHandOver(t *testing.T) {
	eachMode(t, func(t *testing.T, r *rig) {
		r.handover = true
		r.writeCorefile(r.corefile(53))
		old := r.startCache()
		r.stop(old)
		if !strings.Contains(old.Output(), "handed the node to the cluster DNS") {
			t.Fatalf("the cache did not hand the node over:\n%s", old.Output())
		}
		r.kubeProxyChurn(func(step string) { r.answered(step, kubeDNS, linkLocal) })
		r.startCache()
		r.checkServedUntracked()
	})
}

// TestRealKubeProxyClusterDNSMovesWhileDiverted: while the guard has failed the node open, the cluster-DNS
// Pod moves (both Services' EndpointSlices name another Pod, and the old one stops). kube-proxy moves the
// ClusterIP, the guard moves the divert, and both addresses are answered by the new Pod.
func TestRealKubeProxyClusterDNSMovesWhileDiverted(t *testing.T) {
	eachMode(t, func(t *testing.T, r *rig) {
		r.failOpen()
		second := r.n.AddClusterDNSPod()
		moved := r.n.StartClusterDNSIn(r.bin, second, simnode.SecondClusterDNSPodIP)
		kp := r.n.KubeProxy
		kp.SetEndpoints(simnode.KubeDNSService, simnode.SecondClusterDNSPodIP)
		kp.SetUpstreamEndpoints(simnode.SecondClusterDNSPodIP)
		kill(t, r.clusterDNS, syscall.SIGKILL)
		r.waitFor("the divert follows the Pod", eventually, func() bool {
			d := r.divert()
			return strings.Contains(d, simnode.SecondClusterDNSPodIP+":53") && !strings.Contains(d, simnode.ClusterDNSPodIP+":53")
		})
		r.waitLog(r.guard, "kube-dns-upstream's endpoints changed", 1, eventually)
		const name = "kubernetes.default.svc.cluster.local"
		before := simnode.CountQueries(moved.Output(), name, "udp")
		r.answered("once the Pod moved", kubeDNS, linkLocal)
		if got := simnode.WaitForQueries(moved, name, "udp", before+2, eventually); got < before+2 {
			t.Errorf("the new cluster-DNS Pod saw %d of the 2 lookups:\n%s", got-before, moved.Output())
		}
		r.logKubeProxySyncs()
	})
}

// TestRealKubeProxyUpstreamLosesItsEndpointsWhileDiverted: while the guard has failed the node open,
// kube-dns-upstream loses every endpoint (kube-proxy deletes its Service port's chains: nothing of ours may
// refer to them) and gets its endpoint back. kube-proxy's syncs succeed throughout, the kube-dns ClusterIP
// stays answered, and the link-local address is answered again once the endpoint is back.
func TestRealKubeProxyUpstreamLosesItsEndpointsWhileDiverted(t *testing.T) {
	eachMode(t, func(t *testing.T, r *rig) {
		r.failOpen()
		kp := r.n.KubeProxy
		kp.SetUpstreamEndpoints()
		kp.Churn(syncs)
		r.answered("while kube-dns-upstream has no endpoint", kubeDNS)
		lookup := r.podQuery(linkLocal)
		t.Logf("a link-local lookup while kube-dns-upstream has no endpoint: %v; the divert:\n%s", lookup, r.divert())
		kp.SetUpstreamEndpoints(simnode.ClusterDNSPodIP)
		r.waitFor("link-local lookups answered once the endpoint is back", eventually, func() bool {
			return r.podQuery(linkLocal) == nil
		})
		r.answered("once kube-dns-upstream's endpoint is back", kubeDNS, linkLocal)
		r.logKubeProxySyncs()
	})
}

// TestRealKubeProxyDivertsToEveryEndpoint: kube-dns-upstream has two endpoints (two cluster-DNS Pods), so
// kube-proxy's rules pick one at random; the guard's divert must name both, and a link-local lookup is
// answered by either.
func TestRealKubeProxyDivertsToEveryEndpoint(t *testing.T) {
	eachMode(t, func(t *testing.T, r *rig) {
		second := r.n.AddClusterDNSPod()
		r.n.StartClusterDNSIn(r.bin, second, simnode.SecondClusterDNSPodIP)
		r.n.KubeProxy.SetUpstreamEndpoints(simnode.ClusterDNSPodIP, simnode.SecondClusterDNSPodIP)
		r.failOpen()
		d := r.divert()
		for _, ip := range []string{simnode.ClusterDNSPodIP, simnode.SecondClusterDNSPodIP} {
			if !strings.Contains(d, ip+":53") && !strings.Contains(d, ip+" . 53") {
				t.Errorf("the divert does not name kube-dns-upstream's endpoint %s:\n%s", ip, d)
			}
		}
		r.answered("with two endpoints", kubeDNS, linkLocal)
	})
}
