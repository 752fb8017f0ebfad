//go:build linux

package rules

import (
	"context"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// kubeProxyNAT is the nat table of a node whose kube-proxy runs in iptables mode, for the kube-dns and the
// kube-dns-upstream Services, as kube-proxy writes it (names of the chains made up).
const kubeProxyNAT = `*nat
:KUBE-SERVICES - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-SVC-UPSTREAMUDP0000000 - [0:0]
:KUBE-SVC-UPSTREAMTCP0000000 - [0:0]
:KUBE-SVC-KUBEDNSUDP00000000 - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A KUBE-SERVICES -d 10.96.0.10/32 -p udp -m comment --comment "kube-system/kube-dns:dns cluster IP" -m udp --dport 53 -j KUBE-SVC-KUBEDNSUDP00000000
-A KUBE-SERVICES ! -s 10.244.0.0/16 -d 10.96.0.11/32 -p udp -m comment --comment "kube-system/kube-dns-upstream:dns cluster IP" -m udp --dport 53 -j KUBE-MARK-MASQ
-A KUBE-SERVICES -d 10.96.0.11/32 -p udp -m comment --comment "kube-system/kube-dns-upstream:dns cluster IP" -m udp --dport 53 -j KUBE-SVC-UPSTREAMUDP0000000
-A KUBE-SERVICES -d 10.96.0.11/32 -p tcp -m comment --comment "kube-system/kube-dns-upstream:dns-tcp cluster IP" -m tcp --dport 53 -j KUBE-SVC-UPSTREAMTCP0000000
-A KUBE-SVC-UPSTREAMUDP0000000 -p udp -j DNAT --to-destination 10.244.1.2:53
-A KUBE-SVC-UPSTREAMTCP0000000 -p tcp -j DNAT --to-destination 10.244.1.2:53
COMMIT
`

func TestKubeProxyServiceChainsAndTheDivertThroughThem(t *testing.T) {
	inNamespace(t, func(t *testing.T, m *Manager) {
		ctx := context.Background()
		upstream := netip.MustParseAddr("10.96.0.11")
		if chains, _, err := m.KubeProxyServiceChains(ctx, upstream, 53); err != nil || len(chains) != 0 {
			t.Fatalf("without kube-proxy: %v, %v", chains, err)
		}
		tools, err := m.backend.Tools(IPv4)
		if err != nil {
			t.Fatal(err)
		}
		restore := exec.Command(tools.Restore, "--noflush")
		restore.Stdin = strings.NewReader(kubeProxyNAT)
		if out, err := restore.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", tools.Restore, err, out)
		}
		chains, masq, err := m.KubeProxyServiceChains(ctx, upstream, 53)
		if err != nil {
			t.Fatal(err)
		}
		want := []ServiceChain{
			{UDP, "KUBE-SVC-UPSTREAMUDP0000000", "kube-system/kube-dns-upstream:dns cluster IP"},
			{TCP, "KUBE-SVC-UPSTREAMTCP0000000", "kube-system/kube-dns-upstream:dns-tcp cluster IP"},
		}
		if len(chains) != 2 || chains[0] != want[0] || chains[1] != want[1] || !masq {
			t.Fatalf("KubeProxyServiceChains = %v, masq %v; want %v, true", chains, masq, want)
		}
		if other, _, err := m.KubeProxyServiceChains(ctx, upstream, 5353); err != nil || len(other) != 0 {
			t.Errorf("another port: %v, %v", other, err)
		}

		rs := Guard(IPv4, []Divert{{From: netip.MustParseAddr("169.254.20.10"), To: upstream, Via: chains, MarkMasq: masq}})
		if err := rs.Validate(); err != nil {
			t.Fatal(err)
		}
		if n := len(rs.Chains[0].Rules); n != 4 {
			t.Fatalf("%d rules, want a masquerade mark and a jump per protocol: %v", n, rs.Chains[0].Rules)
		}
		if _, err := m.Sync(ctx, rs); err != nil {
			t.Fatal(err)
		}
		checkInPlace(t, m, rs)
		if res, err := m.Sync(ctx, rs); err != nil || res.Changed {
			t.Errorf("second sync: %+v, %v", res, err)
		}
		saved := ipt(t, m, IPv4, "-t", "nat", "-S", GuardChain)
		for _, want := range []string{
			`-A NODELOCALDNS-GUARD -s 169.254.20.10/32 -d 169.254.20.10/32 -p udp -m udp --dport 53 -m comment --comment "nodelocaldns-guard: masquerade host lookups of 169.254.20.10 udp/53" -j KUBE-MARK-MASQ`,
			`-A NODELOCALDNS-GUARD -d 169.254.20.10/32 -p tcp -m tcp --dport 53 -m comment --comment "nodelocaldns-guard: 169.254.20.10 tcp/53 to 10.96.0.11 through kube-proxy" -j KUBE-SVC-UPSTREAMTCP0000000`,
		} {
			if !strings.Contains(saved, want) {
				t.Errorf("the guard chain lacks\n%s\nin\n%s", want, saved)
			}
		}
		if err := m.Delete(ctx, rs); err != nil {
			t.Fatal(err)
		}
	})
}

func TestGuardRulesetMixesJumpAndDNAT(t *testing.T) {
	rs := Guard(IPv4, []Divert{{
		From: netip.MustParseAddr("169.254.20.10"), To: netip.MustParseAddr("10.96.0.11"),
		Via: []ServiceChain{{Protocol: UDP, Chain: "KUBE-SVC-X"}},
	}})
	rules := rs.Chains[0].Rules
	if len(rules) != 2 || target(rules[0]) != "KUBE-SVC-X" || target(rules[1]) != "DNAT" {
		t.Fatalf("rules %v: want UDP through kube-proxy's chain, TCP DNATed", rules)
	}
}

func TestCachedEndpoints(t *testing.T) {
	inNamespace(t, func(t *testing.T, m *Manager) {
		ctx := context.Background()
		if eps, err := m.CachedEndpoints(ctx, IPv4, NodeCacheSpec{}); err != nil || len(eps) != 0 {
			t.Fatalf("without rules: %v, %v", eps, err)
		}
		rs := testRuleset(IPv4)
		if _, err := m.Sync(ctx, rs); err != nil {
			t.Fatal(err)
		}
		eps, err := m.CachedEndpoints(ctx, IPv4, NodeCacheSpec{})
		if err != nil {
			t.Fatal(err)
		}
		want := Endpoints([]netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("169.254.20.10")}, 53, []uint16{8080})
		if !slices.Equal(eps, want) {
			t.Errorf("CachedEndpoints = %v, want %v", eps, want)
		}
		if err := m.Delete(ctx, rs); err != nil {
			t.Fatal(err)
		}
	})
}
