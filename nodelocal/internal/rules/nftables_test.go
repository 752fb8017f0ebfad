//go:build linux

package rules

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/nodelocaldns/nodelocaldns/internal/netnstest"
	"github.com/nodelocaldns/nodelocaldns/internal/privtest"
)

// inNFTNamespace runs fn in a network namespace of its own; nft (the command) only inspects what the
// backend wrote over netlink.
func inNFTNamespace(t *testing.T) bool {
	t.Helper()
	privtest.RequirePrivileged(t, "ip", "nft")
	return netnstest.Run(t)
}

func nft(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("nft", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("nft %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func nftScript(t *testing.T, script string) {
	t.Helper()
	cmd := exec.Command("nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft -f: %v: %s", err, out)
	}
}

func testEndpoints() []Endpoint {
	addrs := []netip.Addr{netip.MustParseAddr("169.254.20.10"), netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fd00::10")}
	return Endpoints(addrs, 53, []uint16{8080})
}

func TestNFTablesSyncCache(t *testing.T) {
	if !inNFTNamespace(t) {
		return
	}
	ctx := context.Background()
	n := NewNFTablesManager()
	eps := testEndpoints()
	res, err := n.SyncCache(ctx, eps, "")
	if err != nil {
		t.Fatal(err)
	}
	if !res.Changed || res.Rules != 2*len(eps)+2 {
		t.Fatalf("first sync: %+v", res)
	}
	listing := nft(t, "list", "table", "inet", NFTablesTable)
	for _, want := range []string{
		"type filter hook prerouting priority raw; policy accept;",
		"type filter hook output priority raw; policy accept;",
		`ip daddr 169.254.20.10 udp dport 53 notrack comment "nodelocaldns: to 169.254.20.10 udp/53"`,
		`ip saddr 10.96.0.10 tcp sport 8080 notrack comment "nodelocaldns: from 10.96.0.10 tcp/8080"`,
		`ip6 daddr fd00::10 udp dport 53 notrack`,
		`jump endpoints comment "nodelocaldns: skip conntrack for the node-local DNS cache"`,
	} {
		if !strings.Contains(listing, want) {
			t.Errorf("table lacks %q:\n%s", want, listing)
		}
	}
	// Steady state: nothing written.
	res, err = n.SyncCache(ctx, eps, "")
	if err != nil || res.Changed {
		t.Fatalf("second sync: %+v, %v", res, err)
	}
	for _, damage := range []struct {
		name string
		cmd  []string
	}{
		{"table deleted", []string{"delete", "table", "inet", NFTablesTable}},
		{"table flushed", []string{"flush", "table", "inet", NFTablesTable}},
		{"chain flushed", []string{"flush", "chain", "inet", NFTablesTable, nftEndpointsChain}},
		{"base chain deleted", []string{"delete", "chain", "inet", NFTablesTable, nftOutputChain}},
		{"foreign chain added", []string{"add", "chain", "inet", NFTablesTable, "foreign"}},
		{"foreign rule added", []string{"add", "rule", "inet", NFTablesTable, nftEndpointsChain, "accept"}},
	} {
		nft(t, damage.cmd...)
		res, err := n.SyncCache(ctx, eps, "")
		if err != nil || !res.Changed || len(res.Differences) == 0 {
			t.Errorf("%s: %+v, %v", damage.name, res, err)
		}
		t.Logf("%s: %v", damage.name, res.Differences)
		if after := nft(t, "list", "table", "inet", NFTablesTable); after != listing {
			t.Errorf("%s: not repaired:\n%s", damage.name, after)
		}
	}
	// Fewer endpoints: rewritten; none: the table goes.
	res, err = n.SyncCache(ctx, eps[:2], "")
	if err != nil || !res.Changed || res.Rules != 6 {
		t.Fatalf("fewer endpoints: %+v, %v", res, err)
	}
	hooked, err := n.CacheHooked(ctx)
	if err != nil || !hooked {
		t.Fatalf("hooked = %v, %v", hooked, err)
	}
	if unhooked, err := n.UnhookCache(ctx); err != nil || !unhooked {
		t.Fatalf("unhook = %v, %v", unhooked, err)
	}
	if hooked, err := n.CacheHooked(ctx); err != nil || hooked {
		t.Fatalf("after unhook: hooked = %v, %v", hooked, err)
	}
	if l := nft(t, "list", "table", "inet", NFTablesTable); !strings.Contains(l, "notrack") || strings.Contains(l, "hook") {
		t.Errorf("after unhook the rules should stay and the base chains go:\n%s", l)
	}
	if unhooked, err := n.UnhookCache(ctx); err != nil || unhooked {
		t.Fatalf("second unhook = %v, %v", unhooked, err)
	}
	if res, err := n.SyncCache(ctx, eps[:2], ""); err != nil || !res.Changed {
		t.Fatalf("rehook: %+v, %v", res, err)
	}
	if deleted, err := n.DeleteCache(ctx); err != nil || !deleted {
		t.Fatalf("delete = %v, %v", deleted, err)
	}
	if deleted, err := n.DeleteCache(ctx); err != nil || deleted {
		t.Fatalf("second delete = %v, %v", deleted, err)
	}
	if ok, err := n.TableExists(ctx, NFTablesTable); err != nil || ok {
		t.Fatalf("table exists after delete: %v, %v", ok, err)
	}
}

// kubeProxyScript is a kube-proxy nftables-mode table (pkg/proxy/nftables) for one Service port with the
// given endpoints, plus filler elements in its service-ips map.
func kubeProxyScript(svc string, port int, endpoints []string, filler int) string {
	var b strings.Builder
	b.WriteString("table ip kube-proxy {\n")
	b.WriteString("  map service-ips { type ipv4_addr . inet_proto . inet_service : verdict; }\n")
	b.WriteString("  chain mark-for-masquerade { mark set mark or 0x4000; }\n")
	for _, proto := range []string{"udp", "tcp"} {
		svcChain := fmt.Sprintf("service-ABCDEFGH-kube-system/kube-dns-upstream/%s/dns", proto)
		var vmap []string
		for i, ep := range endpoints {
			epChain := fmt.Sprintf("endpoint-%d-kube-system/kube-dns-upstream/%s/dns__%s/%d", i, proto, ep, port)
			fmt.Fprintf(&b, "  chain %s {\n    ip saddr %s jump mark-for-masquerade\n    meta l4proto %s dnat to %s:%d\n  }\n", quote(epChain), ep, proto, ep, port)
			vmap = append(vmap, fmt.Sprintf("%d : goto %s", i, quote(epChain)))
		}
		fmt.Fprintf(&b, "  chain %s {\n    ip daddr %s %s dport %d ip saddr != 10.244.0.0/16 jump mark-for-masquerade\n    numgen random mod %d vmap { %s }\n  }\n",
			quote(svcChain), svc, proto, port, len(endpoints), strings.Join(vmap, ", "))
	}
	b.WriteString("}\n")
	for _, proto := range []string{"udp", "tcp"} {
		fmt.Fprintf(&b, "add element ip kube-proxy service-ips { %s . %s . %d : goto %s }\n", svc, proto, port,
			quote(fmt.Sprintf("service-ABCDEFGH-kube-system/kube-dns-upstream/%s/dns", proto)))
	}
	for i := 0; i < filler; i += 1000 {
		var elems []string
		for j := i; j < min(i+1000, filler); j++ {
			elems = append(elems, fmt.Sprintf("10.%d.%d.%d . tcp . 80 : drop", 100+j>>16, (j>>8)&255, j&255))
		}
		fmt.Fprintf(&b, "add element ip kube-proxy service-ips { %s }\n", strings.Join(elems, ", "))
	}
	return b.String()
}

func quote(s string) string { return s }

func TestNFTablesGuardAndKubeProxyEndpoints(t *testing.T) {
	if !inNFTNamespace(t) {
		return
	}
	ctx := context.Background()
	n := NewNFTablesManager()
	if tables, err := n.KubeProxyTables(ctx); err != nil || len(tables) != 0 {
		t.Fatalf("kube-proxy tables on an empty node: %v, %v", tables, err)
	}
	nftScript(t, kubeProxyScript("10.96.0.11", 53, []string{"10.244.1.2", "10.244.2.3"}, 3000))
	if tables, err := n.KubeProxyTables(ctx); err != nil || !slices.Equal(tables, []string{"ip kube-proxy"}) {
		t.Fatalf("kube-proxy tables: %v, %v", tables, err)
	}
	svc := netip.MustParseAddr("10.96.0.11")
	eps, err := n.KubeProxyEndpoints(ctx, svc, UDP, 53)
	want := []netip.AddrPort{netip.MustParseAddrPort("10.244.1.2:53"), netip.MustParseAddrPort("10.244.2.3:53")}
	if err != nil || !slices.Equal(eps, want) {
		t.Fatalf("endpoints of %s udp/53: %v, %v", svc, eps, err)
	}
	if eps, err := n.KubeProxyEndpoints(ctx, svc, TCP, 5353); err != nil || len(eps) != 0 {
		t.Fatalf("endpoints of a port kube-proxy does not serve: %v, %v", eps, err)
	}
	if eps, err := n.KubeProxyEndpoints(ctx, netip.MustParseAddr("fd00::11"), UDP, 53); err != nil || len(eps) != 0 {
		t.Fatalf("endpoints with no ip6 table: %v, %v", eps, err)
	}

	from := netip.MustParseAddr("169.254.20.10")
	if err := n.WriteGuard(ctx, []DivertRoute{{From: from, Port: 53, Protocol: UDP, To: eps}, {From: from, Port: 53, Protocol: TCP, To: eps[:1]}}); err != nil {
		t.Fatal(err)
	}
	listing := nft(t, "list", "table", "inet", NFTablesGuardTable)
	for _, w := range []string{
		"type nat hook prerouting priority dstnat - 10; policy accept;",
		"type nat hook output priority -110; policy accept;",
		"ip daddr 169.254.20.10 udp dport 53 numgen random mod 2 0 dnat ip to 10.244.1.2:53",
		"ip daddr 169.254.20.10 udp dport 53 dnat ip to 10.244.2.3:53",
		"ip daddr 169.254.20.10 tcp dport 53 dnat ip to 10.244.1.2:53",
	} {
		if !strings.Contains(listing, w) {
			t.Errorf("guard table lacks %q:\n%s", w, listing)
		}
	}
	// The divert follows the endpoints in place while the table stands, and never writes it again once the
	// cache deleted it.
	if ok, err := n.RewriteGuardWhileMarked(ctx, []DivertRoute{{From: from, Port: 53, Protocol: UDP, To: eps[1:]}}); err != nil || !ok {
		t.Fatalf("rewrite: %v, %v", ok, err)
	}
	listing = nft(t, "list", "table", "inet", NFTablesGuardTable)
	if !strings.Contains(listing, "ip daddr 169.254.20.10 udp dport 53 dnat ip to 10.244.2.3:53") || strings.Contains(listing, "10.244.1.2") {
		t.Errorf("after the rewrite:\n%s", listing)
	}
	if _, err := n.DeleteGuard(ctx); err != nil {
		t.Fatal(err)
	}
	if ok, err := n.RewriteGuardWhileMarked(ctx, []DivertRoute{{From: from, Port: 53, Protocol: UDP, To: eps}}); err != nil || ok {
		t.Fatalf("rewrite after the table went: %v, %v", ok, err)
	}
	if ok, err := n.TableExists(ctx, NFTablesGuardTable); err != nil || ok {
		t.Fatalf("the rewrite created the table again: %v, %v", ok, err)
	}
	if err := n.WriteGuard(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if ok, err := n.TableExists(ctx, NFTablesGuardTable); err != nil || !ok {
		t.Fatalf("empty guard table: %v, %v", ok, err)
	}
	if deleted, err := n.DeleteGuard(ctx); err != nil || !deleted {
		t.Fatalf("delete guard: %v, %v", deleted, err)
	}

	probed := []netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fd00::10")}
	if err := n.AddProbeExemption(ctx, 0x53, probed); err != nil {
		t.Fatal(err)
	}
	probe := nft(t, "list", "table", "inet", NFTablesProbeTable)
	for _, w := range []string{"meta mark 0x00000053 notrack", "ip saddr 10.96.0.10 meta l4proto udp notrack", "ip6 saddr fd00::10 meta l4proto udp notrack"} {
		if !strings.Contains(probe, w) {
			t.Errorf("probe table lacks %q:\n%s", w, probe)
		}
	}
	if removed, err := n.RemoveProbeExemption(ctx); err != nil || !removed {
		t.Fatalf("remove probe exemption: %v, %v", removed, err)
	}
}
