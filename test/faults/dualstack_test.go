//go:build linux

package faults

import (
	"context"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/privtest"
	"github.com/nodelocaldns/nodelocaldns/test/simnode"
)

// The dual-stack cases: one cache serving the link-local address and the kube-dns ClusterIP of each
// family, failed open by the guard, and replaced with a gap and with a successor, beside a real kube-proxy
// in dual-stack in both its modes (simnode.NewDualStackWithKubeProxy), with lookups to the four addresses:
//
//	NODELOCALDNS_REQUIRE_PRIVILEGED=1 go test -v -run TestDualStack ./test/faults/

var (
	kubeDNS6   = net.JoinHostPort(simnode.KubeDNSClusterIP6, "53")
	linkLocal6 = net.JoinHostPort(simnode.LinkLocalIP6, "53")
)

// newDualStackRig is a rig on a dual-stack node whose rules a real kube-proxy in mode writes, in
// dual-stack (simnode.NewDualStackWithKubeProxy): the cache serves the link-local address and the kube-dns
// ClusterIP of each family, forwards to kube-dns-upstream's ClusterIP of each, and with handover hands the
// node over in both. quiet starts the cluster DNS without its query log.
func newDualStackRig(t *testing.T, mode simnode.KubeProxyMode, quiet bool) *rig {
	t.Helper()
	return newDualStackRigOn(t, mode, quiet, func() *simnode.Node { return simnode.NewDualStackWithKubeProxy(t, &kubeAPI, mode) })
}

// newEmulatedDualStackRig is newDualStackRig on a node whose kube-proxy rules simnode writes by hand
// (simnode.NewDualStack).
func newEmulatedDualStackRig(t *testing.T, mode simnode.KubeProxyMode, quiet bool) *rig {
	t.Helper()
	return newDualStackRigOn(t, mode, quiet, func() *simnode.Node { return simnode.NewDualStack(t, mode) })
}

func newDualStackRigOn(t *testing.T, mode simnode.KubeProxyMode, quiet bool, node func() *simnode.Node) *rig {
	t.Helper()
	backend := "nft" // the rig's iptables commands are named after the flavour
	if mode == simnode.NFTablesMode {
		backend = "auto"
	}
	privtest.RequirePrivileged(t, privtest.IptablesCommands("nft")...)
	r := newRigOn(t, backend, quiet, node)
	r.dualStack = true
	r.listen = []string{simnode.LinkLocalIP, simnode.KubeDNSClusterIP, simnode.LinkLocalIP6, simnode.KubeDNSClusterIP6}
	r.writeCorefile(r.corefile(53))
	return r
}

// servers are the addresses Pods ask: the kube-dns ClusterIP and the link-local address, of each family on
// a dual-stack node.
func (r *rig) servers() []string {
	if r.dualStack {
		return []string{kubeDNS, linkLocal, kubeDNS6, linkLocal6}
	}
	return []string{kubeDNS, linkLocal}
}

// loadRate is the lookups per second of the replacement tests' load to each address: 2,000 a second in
// all, whatever the number of addresses.
func (r *rig) loadRate() int { return 2 * restartLoadRate / len(r.servers()) }

// serviceIPs are those of the cache's addresses that are kube-dns ClusterIPs.
func (r *rig) serviceIPs() []string {
	var out []string
	for _, ip := range []string{simnode.KubeDNSClusterIP, simnode.KubeDNSClusterIP6} {
		if has(r.listen, ip) {
			out = append(out, ip)
		}
	}
	return out
}

// upstreamIPs are kube-dns-upstream's ClusterIPs, one per family.
func (r *rig) upstreamIPs() []string {
	if r.dualStack {
		return []string{simnode.UpstreamClusterIP, simnode.UpstreamClusterIP6}
	}
	return []string{simnode.UpstreamClusterIP}
}

// forwardTo is the cache's forward destinations: kube-dns-upstream in every family.
func (r *rig) forwardTo() string {
	var out []string
	for _, ip := range r.upstreamIPs() {
		out = append(out, net.JoinHostPort(ip, "53"))
	}
	return strings.Join(out, " ")
}

// families returns the rig's iptables of each family the node has.
func (r *rig) families() []func(args ...string) (string, error) {
	if r.dualStack {
		return []func(args ...string) (string, error){r.ipt, r.ip6t}
	}
	return []func(args ...string) (string, error){r.ipt}
}

// ip6t runs the rig's ip6tables in the node namespace.
func (r *rig) ip6t(args ...string) (string, error) {
	return r.n.In(context.Background(), r.n.NodeNS, "ip6tables-"+r.backend, append([]string{"-w", "5"}, args...)...)
}

// linkHoldsAll reports whether the cache's link holds every address the cache serves.
func (r *rig) linkHoldsAll() bool {
	addrs := r.linkAddrs()
	for _, ip := range r.listen {
		if !has(addrs, ip) {
			return false
		}
	}
	return true
}

// divertOf returns the divert the guard or a hand-over wrote, in the node's kube-proxy mode: the
// nodelocaldns-guard table, or the NODELOCALDNS-GUARD chain of iptables and ip6tables.
func (r *rig) divertOf() string {
	r.t.Helper()
	if r.n.Mode == simnode.NFTablesMode {
		out, err := r.nft("list", "table", "inet", "nodelocaldns-guard")
		if err != nil {
			r.t.Fatalf("no divert: %v", err)
		}
		return out
	}
	var b strings.Builder
	for _, ipt := range r.families() {
		out, err := ipt("-t", "nat", "-S", "NODELOCALDNS-GUARD")
		if err != nil {
			r.t.Fatalf("no divert: %v", err)
		}
		b.WriteString(out)
	}
	return b.String()
}

// checkDivertedInBothFamilies fails the test unless the divert sends each link-local address to
// kube-dns-upstream in its own family: a DNAT to the cluster-DNS Pod's address of that family in nftables
// mode, a jump into kube-proxy's chain of kube-dns-upstream in ip6tables and iptables.
func (r *rig) checkDivertedInBothFamilies() {
	r.t.Helper()
	divert := r.divertOf()
	var want []string
	if r.n.Mode == simnode.NFTablesMode {
		for _, proto := range []string{"udp", "tcp"} {
			want = append(want,
				"ip daddr "+simnode.LinkLocalIP+" "+proto+" dport 53 dnat ip to "+simnode.ClusterDNSPodIP+":53",
				"ip6 daddr "+simnode.LinkLocalIP6+" "+proto+" dport 53 dnat ip6 to ["+simnode.ClusterDNSPodIP6+"]:53")
		}
	} else {
		want = append(want, "-d "+simnode.LinkLocalIP+"/32", "-d "+simnode.LinkLocalIP6+"/128")
	}
	for _, w := range want {
		if !strings.Contains(divert, w) {
			r.t.Errorf("the divert lacks %q:\n%s", w, divert)
		}
	}
}

// TestDualStackGuardFailOpen: the cache of a dual-stack node is SIGKILLed while a Pod asks its IPv6
// link-local address every 100 ms; the guard fails the node open in both families (the kube-dns
// ClusterIPs go back to kube-proxy, each link-local address is diverted to kube-dns-upstream of its
// family), all four addresses answer, and the restarted cache takes the node back, its answers untracked
// again. In both kube-proxy modes.
func TestDualStackGuardFailOpen(t *testing.T) {
	for _, mode := range []simnode.KubeProxyMode{simnode.IPTablesMode, simnode.NFTablesMode} {
		t.Run(string(mode), func(t *testing.T) {
			r := newDualStackRig(t, mode, false)
			r.startCache()
			r.startGuard()
			for _, server := range r.servers() {
				if err := r.podQuery(server); err != nil {
					t.Fatalf("%s: the cache does not answer before the kill: %v", server, err)
				}
			}
			samples := r.killCacheWhileQuerying(linkLocal6)
			span, failed := failureSpan(samples)
			if !recoveredAfterFailure(samples) {
				t.Fatalf("lookups to %s did not recover within 15 s of the kill (%d of %d failed)\nguard:\n%s", linkLocal6, failed, len(samples), r.guard.Output())
			}
			t.Logf("%s, %s mode: %d lookups failed over %v after SIGKILL", linkLocal6, mode, failed, span.Round(time.Millisecond))
			r.waitLog(r.guard, "failed open in", 1, time.Minute)
			if addrs := r.linkAddrs(); has(addrs, simnode.KubeDNSClusterIP) || has(addrs, simnode.KubeDNSClusterIP6) ||
				!has(addrs, simnode.LinkLocalIP) || !has(addrs, simnode.LinkLocalIP6) {
				t.Errorf("failed open, the link holds %v; want the link-local addresses only", addrs)
			}
			r.checkDivertedInBothFamilies()
			for _, server := range r.servers() {
				if err := r.podQuery(server); err != nil {
					t.Errorf("%s while failed open: %v", server, err)
				}
			}
			r.startCache()
			r.waitFor("guard watches again", eventually, func() bool {
				v, err := r.scrape(guardMetrics, "coredns_nodecache_guard_state", "")
				return err == nil && v == 0
			})
			r.checkServedUntracked()
		})
	}
}

// TestDualStackReplaceWithAGap is TestReplaceWithAGap on a dual-stack node, in both kube-proxy modes: under
// load to the four addresses, the old cache hands the node over in both families (both kube-dns ClusterIPs
// to kube-proxy, both link-local addresses diverted), the new one takes it back 3 s later, and not one
// lookup is lost.
func TestDualStackReplaceWithAGap(t *testing.T) {
	for _, mode := range []simnode.KubeProxyMode{simnode.IPTablesMode, simnode.NFTablesMode} {
		t.Run(string(mode), func(t *testing.T) {
			r := newDualStackRig(t, mode, true)
			r.handover, r.wirecache = true, true
			r.writeCorefile(r.corefile(53))
			old := r.startCache()
			stopLoad := r.startLoad()
			r.stop(old)
			if !strings.Contains(old.Output(), "handed the node to the cluster DNS") || strings.Contains(old.Output(), "without a divert") {
				t.Errorf("the old cache did not hand the node over in both families:\n%s", old.Output())
			}
			addrs := r.linkAddrs()
			slices.Sort(addrs)
			jumps := r.anyJump
			if mode == simnode.NFTablesMode {
				jumps = r.hooked
			}
			if want := []string{simnode.LinkLocalIP, simnode.LinkLocalIP6}; jumps() || !slices.Equal(addrs, want) {
				t.Errorf("after the hand-over: jumps or hooks %v, link %v; want none and %v", jumps(), addrs, want)
			}
			r.checkDivertedInBothFamilies()
			time.Sleep(3 * time.Second) // the gap of the rolling update
			r.startCache()
			r.checkNoLookupLost(stopLoad())
			r.checkServedUntracked()
		})
	}
}

// TestDualStackReplaceWithASuccessor is TestReplaceWithASuccessor on a dual-stack node, in both kube-proxy
// modes: the successor takes the node over once it answers on the four addresses, the old cache drains and
// leaves everything to it, and not one lookup is lost.
func TestDualStackReplaceWithASuccessor(t *testing.T) {
	for _, mode := range []simnode.KubeProxyMode{simnode.IPTablesMode, simnode.NFTablesMode} {
		t.Run(string(mode), func(t *testing.T) {
			r := newDualStackRig(t, mode, true)
			r.handover, r.wirecache = true, true
			r.writeCorefile(r.corefile(53))
			old := r.startCache()
			stopLoad := r.startLoad()
			next := r.startSuccessor()
			r.waitLog(old, "handed the node over", 1, 10*time.Second)
			r.stop(old)
			if !strings.Contains(old.Output(), "left the link, the addresses and the rules to the successor") {
				t.Errorf("the old cache did not leave the node to its successor:\n%s", old.Output())
			}
			r.checkNoLookupLost(stopLoad())
			r.checkServedUntracked()
			if next.Exited() {
				t.Fatalf("the successor exited: %v", next.Wait(0))
			}
			r.cache = next
		})
	}
}
