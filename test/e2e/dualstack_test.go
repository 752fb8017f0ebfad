//go:build linux

package e2e

import (
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/privtest"
	"github.com/nodelocaldns/nodelocaldns/test/simnode"
)

// TestDualStackNodeCache runs one node-cache process serving the link-local address and the kube-dns
// ClusterIP of each family on a dual-stack simulated node, beside a real kube-proxy in dual-stack in
// iptables and in nftables mode (simnode.NewDualStackWithKubeProxy), and checks that IPv6 Pod DNS stops at the node as IPv4's does: answered through both IPv6
// addresses, by glibc (resolv.conf naming an IPv6 nameserver) and by dig over UDP and TCP, with no
// conntrack entry for either, where the same lookups left one each before the cache started; and that
// SIGTERM leaves nothing of the cache's in either family.
func TestDualStackNodeCache(t *testing.T) {
	for _, mode := range []simnode.KubeProxyMode{simnode.IPTablesMode, simnode.NFTablesMode} {
		t.Run(string(mode), func(t *testing.T) { testDualStackNodeCache(t, mode) })
	}
}

func testDualStackNodeCache(t *testing.T, mode simnode.KubeProxyMode) {
	privtest.RequirePrivileged(t, append(slices.Clone(simnode.DualStackTools), "nft", "getent", "dig", "iptables-save", "ip6tables-save")...)
	n := simnode.NewDualStackWithKubeProxy(t, &kubeAPI, mode)
	e := &e2e{t: t, n: n, mode: mode}
	e.clusterDNS = n.StartClusterDNS(nodeCache)
	e.ext = n.StartExternalResolver(nodeCache)
	const (
		local      = simnode.LinkLocalIP
		clusterIP  = simnode.KubeDNSClusterIP
		local6     = simnode.LinkLocalIP6
		clusterIP6 = simnode.KubeDNSClusterIP6
	)
	flush := func() {
		t.Helper()
		for _, dst := range []string{clusterIP, local, clusterIP6, local6} {
			if err := n.DeleteConntrack(dst); err != nil {
				t.Fatal(err)
			}
		}
	}
	// lookups6 resolves web (A and AAAA) with glibc in the Pod, whose nameserver is server.
	lookups6 := func(server string) {
		t.Helper()
		n.SetPodNameserver(server)
		defer n.SetPodNameserver(clusterIP)
		for range lookups {
			if out := e.getent("ahosts", "web"); !strings.Contains(out, "fd00:10:244:2::7 ") || !strings.Contains(out, "10.244.2.7 ") {
				t.Fatalf("getent ahosts web via %s = %q, want its AAAA and A", server, out)
			}
		}
	}

	// Without the cache: kube-proxy's IPv6 DNAT, a conntrack entry per lookup.
	flush()
	lookups6(clusterIP6)
	if before := e.conntrack(clusterIP6); before < lookups {
		t.Fatalf("without the cache: %d conntrack entries to [%s]:53 for %d lookups, want one per lookup at least", before, clusterIP6, lookups)
	}

	dir := t.TempDir()
	// Every block binds the four addresses; health listens on the IPv4 link-local one.
	corefile := strings.NewReplacer("health {{.Local}}:8080", "health "+local+":8080", "{{.Local}}", local+" "+local6, "{{.ClusterIP}}", clusterIP+" "+clusterIP6,
		"{{.Lock}}", filepath.Join(dir, "nodelocaldns.lock"), "{{.Ext}}", simnode.ExtResolverIP).Replace(nodeLocalCorefile)
	path := filepath.Join(dir, "Corefile")
	if err := os.WriteFile(path, []byte(corefile), 0o644); err != nil {
		t.Fatal(err)
	}
	cache := n.StartEnv(n.NodeNS, cacheEnv(t, mode == simnode.NFTablesMode), nodeCache, "-conf", path)
	var logged []string
	waitFor(t, "rules in place", time.Minute, func() bool {
		if cache.Exited() {
			t.Fatalf("node-cache exited: %v\n%s", cache.Wait(0), cache.Output())
		}
		logged = rulesInPlace.FindStringSubmatch(cache.Output())
		return logged != nil
	})
	if want := clusterIP + ":53, " + local + ":53, [" + clusterIP6 + "]:53, [" + local6 + "]:53"; logged[1] != want {
		t.Errorf("rules in place for %s, want %s", logged[1], want)
	}
	if addrs, ok := e.linkAddrs(); !ok || !slices.Equal(addrs, []string{clusterIP + "/32", local + "/32", clusterIP6 + "/128", local6 + "/128"}) {
		t.Fatalf("link nodelocaldns (exists %v) holds %v", ok, addrs)
	}
	rules := e.ourRules()
	if mode == simnode.NFTablesMode {
		if want := "using rules backend nftables (kube-proxy's nftables mode (table ip kube-proxy, ip6 kube-proxy)"; !strings.Contains(cache.Output(), want) {
			t.Errorf("the cache did not log %q:\n%s", want, cache.Output())
		}
	} else if !slices.ContainsFunc(rules, func(r string) bool { return strings.HasPrefix(r, "ip6tables-save ") && strings.Contains(r, clusterIP6) }) {
		t.Errorf("no ip6tables rule of ours names %s:\n%s", clusterIP6, strings.Join(rules, "\n"))
	}
	// notrack's probes of the IPv6 ClusterIP reached the cache, not the cluster DNS behind kube-proxy's DNAT.
	if strings.Contains(e.clusterDNS.Output(), "nodelocaldns-probe-") {
		t.Errorf("the cluster DNS got notrack's probe:\n%s", e.clusterDNS.Output())
	}

	// glibc and dig in the Pod resolve through both IPv6 addresses, without a conntrack entry.
	flush()
	lookups6(clusterIP6)
	lookups6(local6)
	for _, server := range []string{clusterIP6, local6} {
		for _, transport := range []string{"+notcp", "+tcp"} {
			for range lookups {
				if out := e.dig(server, "kubernetes.default.svc.cluster.local", transport); out != "10.96.0.1" {
					t.Errorf("dig %s @%s = %q", transport, server, out)
				}
			}
		}
		if out := e.dig(server, "web.default.svc.cluster.local", "AAAA"); out != "fd00:10:244:2::7" {
			t.Errorf("dig @%s web AAAA = %q", server, out)
		}
	}
	for _, addr := range []string{clusterIP6, local6} {
		if got := e.conntrack(addr); got != 0 {
			entries, _ := n.ConntrackEntries("udp", addr)
			t.Errorf("with the cache: %d conntrack entries to [%s]:53:\n%s", got, addr, strings.Join(entries, "\n"))
		}
	}
	// The IPv4 addresses still answer, untracked, from the same process.
	for _, server := range []string{clusterIP, local} {
		if out := e.dig(server, "kubernetes.default.svc.cluster.local"); out != "10.96.0.1" {
			t.Errorf("dig @%s = %q", server, out)
		}
		if got := e.conntrack(server); got != 0 {
			t.Errorf("with the cache: %d conntrack entries to %s:53", got, server)
		}
	}
	// A miss asked over IPv6 reaches the cluster DNS once, over TCP, and repeats are answered from the cache.
	const fresh = "kube-dns.kube-system.svc.cluster.local"
	for i := range lookups {
		if out := e.dig([]string{clusterIP6, local6}[i%2], fresh); out != "10.96.0.10" {
			t.Errorf("dig %s = %q", fresh, out)
		}
	}
	if tcp, udp := simnode.WaitForQueries(e.clusterDNS, fresh, "tcp", 1, 30*time.Second), simnode.CountQueries(e.clusterDNS.Output(), fresh, "udp"); tcp != 1 || udp != 0 {
		t.Errorf("%d lookups of %s over IPv6 reached the cluster DNS %d times over TCP and %d over UDP, want 1 and 0", lookups, fresh, tcp, udp)
	}

	// SIGTERM: nothing of ours is left in either family, and IPv6 Pod lookups go through kube-proxy again.
	if err := cache.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cache.Wait(30 * time.Second); err != nil {
		t.Errorf("node-cache after SIGTERM: %v", err)
	}
	if left := e.ourRules(); len(left) > 0 {
		t.Errorf("rules left after SIGTERM:\n%s", strings.Join(left, "\n"))
	}
	if addrs, ok := e.linkAddrs(); ok {
		t.Errorf("link nodelocaldns left after SIGTERM, holding %v", addrs)
	}
	flush()
	lookups6(clusterIP6)
	if after := e.conntrack(clusterIP6); after < lookups {
		t.Errorf("cache stopped: %d conntrack entries to [%s]:53 for %d lookups, want one per lookup at least", after, clusterIP6, lookups)
	}
	if _, err := n.Query(n.PodNS, "udp", net.JoinHostPort(local6, "53"), "kubernetes.default.svc.cluster.local", dns.TypeA); err == nil {
		t.Errorf("cache stopped: [%s]:53 still answers", local6)
	}
}
