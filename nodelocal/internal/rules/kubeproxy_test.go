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
:KUBE-SEP-UPSTREAMUDP0000001 - [0:0]
:KUBE-SEP-UPSTREAMUDP0000002 - [0:0]
:KUBE-SEP-UPSTREAMTCP0000001 - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A KUBE-SERVICES -d 10.96.0.10/32 -p udp -m comment --comment "kube-system/kube-dns:dns cluster IP" -m udp --dport 53 -j KUBE-SVC-KUBEDNSUDP00000000
-A KUBE-SERVICES ! -s 10.244.0.0/16 -d 10.96.0.11/32 -p udp -m comment --comment "kube-system/kube-dns-upstream:dns cluster IP" -m udp --dport 53 -j KUBE-MARK-MASQ
-A KUBE-SERVICES -d 10.96.0.11/32 -p udp -m comment --comment "kube-system/kube-dns-upstream:dns cluster IP" -m udp --dport 53 -j KUBE-SVC-UPSTREAMUDP0000000
-A KUBE-SERVICES -d 10.96.0.11/32 -p tcp -m comment --comment "kube-system/kube-dns-upstream:dns-tcp cluster IP" -m tcp --dport 53 -j KUBE-SVC-UPSTREAMTCP0000000
-A KUBE-SVC-UPSTREAMUDP0000000 ! -s 10.244.0.0/16 -d 10.96.0.11/32 -p udp -m comment --comment "kube-system/kube-dns-upstream:dns cluster IP" -m udp --dport 53 -j KUBE-MARK-MASQ
-A KUBE-SVC-UPSTREAMUDP0000000 -m comment --comment "kube-system/kube-dns-upstream:dns -> 10.244.2.3:53" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-UPSTREAMUDP0000002
-A KUBE-SVC-UPSTREAMUDP0000000 -m comment --comment "kube-system/kube-dns-upstream:dns -> 10.244.1.2:53" -j KUBE-SEP-UPSTREAMUDP0000001
-A KUBE-SVC-UPSTREAMTCP0000000 -m comment --comment "kube-system/kube-dns-upstream:dns-tcp -> 10.244.1.2:53" -j KUBE-SEP-UPSTREAMTCP0000001
-A KUBE-SEP-UPSTREAMUDP0000001 -s 10.244.1.2/32 -m comment --comment "kube-system/kube-dns-upstream:dns" -j KUBE-MARK-MASQ
-A KUBE-SEP-UPSTREAMUDP0000001 -p udp -m comment --comment "kube-system/kube-dns-upstream:dns" -m udp -j DNAT --to-destination 10.244.1.2:53
-A KUBE-SEP-UPSTREAMUDP0000002 -s 10.244.2.3/32 -m comment --comment "kube-system/kube-dns-upstream:dns" -j KUBE-MARK-MASQ
-A KUBE-SEP-UPSTREAMUDP0000002 -p udp -m comment --comment "kube-system/kube-dns-upstream:dns" -m udp -j DNAT --to-destination 10.244.2.3:53
-A KUBE-SEP-UPSTREAMTCP0000001 -s 10.244.1.2/32 -m comment --comment "kube-system/kube-dns-upstream:dns-tcp" -j KUBE-MARK-MASQ
-A KUBE-SEP-UPSTREAMTCP0000001 -p tcp -m comment --comment "kube-system/kube-dns-upstream:dns-tcp" -m tcp -j DNAT --to-destination 10.244.1.2:53
COMMIT
`

func TestKubeProxyEndpointsAndTheDivertToThem(t *testing.T) {
	inNamespace(t, func(t *testing.T, m *Manager) {
		ctx := context.Background()
		upstream := netip.MustParseAddr("10.96.0.11")
		if eps, _, err := m.KubeProxyEndpoints(ctx, upstream, UDP, 53); err != nil || len(eps) != 0 {
			t.Fatalf("without kube-proxy: %v, %v", eps, err)
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
		udp, masq, err := m.KubeProxyEndpoints(ctx, upstream, UDP, 53)
		wantUDP := []netip.AddrPort{netip.MustParseAddrPort("10.244.1.2:53"), netip.MustParseAddrPort("10.244.2.3:53")}
		if err != nil || !slices.Equal(udp, wantUDP) || !masq {
			t.Fatalf("UDP endpoints %v, masq %v, %v; want %v, true", udp, masq, err, wantUDP)
		}
		tcp, _, err := m.KubeProxyEndpoints(ctx, upstream, TCP, 53)
		if err != nil || !slices.Equal(tcp, wantUDP[:1]) {
			t.Fatalf("TCP endpoints %v, %v", tcp, err)
		}
		if other, _, err := m.KubeProxyEndpoints(ctx, upstream, UDP, 5353); err != nil || len(other) != 0 {
			t.Errorf("another port: %v, %v", other, err)
		}

		from := netip.MustParseAddr("169.254.20.10")
		rs := Guard(IPv4, []DivertRoute{
			{From: from, Port: 53, Protocol: UDP, To: udp, Masquerade: masq},
			{From: from, Port: 53, Protocol: TCP, To: tcp, Masquerade: masq},
		})
		if err := rs.Validate(); err != nil {
			t.Fatal(err)
		}
		if _, err := m.Sync(ctx, rs); err != nil {
			t.Fatal(err)
		}
		checkInPlace(t, m, rs)
		if res, err := m.Sync(ctx, rs); err != nil || res.Changed {
			t.Errorf("second sync: %+v, %v", res, err)
		}
		saved := ipt(t, m, IPv4, "-t", "nat", "-S", GuardChain)
		if strings.Contains(saved, "KUBE-SVC-") || strings.Contains(saved, "KUBE-SEP-") {
			t.Errorf("the divert refers to kube-proxy's chains, which kube-proxy must be free to delete:\n%s", saved)
		}
		// kube-proxy deletes the Service's chains (no endpoints left, or the Service gone) while the divert
		// stands: nothing of ours refers to them, so it can.
		del := exec.Command(tools.Restore, "--noflush")
		del.Stdin = strings.NewReader("*nat\n-F KUBE-SERVICES\n-F KUBE-SVC-UPSTREAMUDP0000000\n-X KUBE-SVC-UPSTREAMUDP0000000\n" +
			"-F KUBE-SEP-UPSTREAMUDP0000001\n-X KUBE-SEP-UPSTREAMUDP0000001\n-F KUBE-SEP-UPSTREAMUDP0000002\n-X KUBE-SEP-UPSTREAMUDP0000002\nCOMMIT\n")
		if out, err := del.CombinedOutput(); err != nil {
			t.Fatalf("kube-proxy could not delete its chains while the divert stands: %v: %s", err, out)
		}
		if err := m.Delete(ctx, rs); err != nil {
			t.Fatal(err)
		}
	})
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
