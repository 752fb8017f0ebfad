//go:build linux

package nodelocal

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/nodelocaldns/nodelocaldns/nodelocal/internal/nodelock"
	"github.com/nodelocaldns/nodelocaldns/nodelocal/internal/rules"
)

// kubeProxyUpstream is kube-proxy's iptables-mode rule set for a kube-dns-upstream ClusterIP.
const kubeProxyUpstream = `*nat
:KUBE-SERVICES - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-SVC-UPSTREAMUDP0000000 - [0:0]
:KUBE-SVC-UPSTREAMTCP0000000 - [0:0]
:KUBE-SEP-UPSTREAMUDP0000000 - [0:0]
:KUBE-SEP-UPSTREAMTCP0000000 - [0:0]
-A PREROUTING -j KUBE-SERVICES
-A KUBE-SERVICES -d 10.96.0.11/32 -p udp -m comment --comment "kube-system/kube-dns-upstream:dns cluster IP" -m udp --dport 53 -j KUBE-SVC-UPSTREAMUDP0000000
-A KUBE-SERVICES -d 10.96.0.11/32 -p tcp -m comment --comment "kube-system/kube-dns-upstream:dns-tcp cluster IP" -m tcp --dport 53 -j KUBE-SVC-UPSTREAMTCP0000000
-A KUBE-SVC-UPSTREAMUDP0000000 -j KUBE-SEP-UPSTREAMUDP0000000
-A KUBE-SVC-UPSTREAMTCP0000000 -j KUBE-SEP-UPSTREAMTCP0000000
-A KUBE-SEP-UPSTREAMUDP0000000 -s 10.244.1.2/32 -j KUBE-MARK-MASQ
-A KUBE-SEP-UPSTREAMUDP0000000 -p udp -j DNAT --to-destination 10.244.1.2:53
-A KUBE-SEP-UPSTREAMTCP0000000 -s 10.244.1.2/32 -j KUBE-MARK-MASQ
-A KUBE-SEP-UPSTREAMTCP0000000 -p tcp -j DNAT --to-destination 10.244.1.2:53
COMMIT
`

// TestHandOverAndTakeBack hands the node to the cluster DNS as a cache without a successor does at exit,
// and lets the next cache take it back once it answers.
func TestHandOverAndTakeBack(t *testing.T) {
	inNamespace(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		e.restore(rules.IPv4, kubeProxyUpstream)
		r := e.reconciler()
		claim := Claim{Addresses: []netip.Addr{addrA, guardClusterIP}}
		e.acquire(r, claim)
		if !e.cacheJumps() {
			t.Fatal("no jumps before the hand-over")
		}
		diverted, err := r.HandOver(ctx, Handover{ServiceAddresses: []netip.Addr{guardClusterIP}, Upstream: []netip.Addr{guardUpstreamIP}})
		if err != nil {
			t.Fatal(err)
		}
		if len(diverted) != 1 || diverted[0].From != addrA || diverted[0].To != guardUpstreamIP {
			t.Fatalf("diverted %+v, want the link-local address to the upstream", diverted)
		}
		// Queries meet the divert and kube-proxy now; the cache's answers still skip conntrack.
		raw := e.tables()[rules.IPv4.String()+"/"+string(rules.Raw)].Chains[rules.DefaultChain]
		if !e.cacheJumps() || strings.Contains(rulesText(raw), "--dport 53") || !strings.Contains(rulesText(raw), "--sport 53") {
			t.Errorf("after HandOver: jumps %v, raw chain\n%s\nwant the jumps and the rules for answers only", e.cacheJumps(), rulesText(raw))
		}
		chain, ok := e.guardChain()
		if !ok || !strings.Contains(rulesText(chain), "-j DNAT --to-destination 10.244.1.2:53") || strings.Contains(rulesText(chain), "KUBE-SVC-") {
			t.Errorf("divert %v (exists %v), want a DNAT to the endpoint kube-proxy's rules name, and no jump to kube-proxy's chains", chain, ok)
		}
		// The addresses stay until the sockets are idle; then the jumps and the Service address go.
		e.expectLinkAddrs(DefaultInterface, addrA, guardClusterIP)
		removed, err := r.CompleteHandOver(ctx, Handover{ServiceAddresses: []netip.Addr{guardClusterIP}})
		if err != nil || len(removed) != 1 {
			t.Fatalf("CompleteHandOver: %v, %v", removed, err)
		}
		e.expectLinkAddrs(DefaultInterface, addrA)
		if e.cacheJumps() {
			t.Error("jumps still in place after the hand-over")
		}
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}

		// The next cache: addresses first, rules deferred; its repair loop keeps the node handed over.
		next := e.reconciler()
		lease := e.acquire(next, Claim{Addresses: claim.Addresses, DeferRules: true})
		e.expectLinkAddrs(DefaultInterface, addrA, guardClusterIP)
		if err := next.Ensure(ctx); err != nil {
			t.Fatal(err)
		}
		if _, ok := e.guardChain(); !ok {
			t.Fatal("a repair before the cache answered took the divert out")
		}
		// It answers: the divert goes, the jumps come back.
		if err := lease.EnableRules(ctx); err != nil {
			t.Fatal(err)
		}
		if _, ok := e.guardChain(); ok || !e.cacheJumps() {
			t.Errorf("after EnableRules: divert left %v, jumps %v", ok, e.cacheJumps())
		}
		e.expectRules(rules.Endpoints(claim.Addresses, 53, nil))
	})
}

// TestHandOffToASuccessor lets a successor take the node while the owner serves: nothing on the node
// changes, and the lock moves.
func TestHandOffToASuccessor(t *testing.T) {
	inNamespaceNFT(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		owner := e.reconciler()
		claim := Claim{Addresses: []netip.Addr{addrA, guardClusterIP}}
		e.acquire(owner, claim)
		cfg := Config{Backend: string(e.mode), LockPath: e.lock, Logger: e.log}
		if _, err := New(cfg); KindOf(err) != KindNodeLock {
			t.Fatalf("a second New: %v, want a node_lock error", err)
		}
		next, err := Queue(cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer next.Close()
		if !strings.Contains(next.Owner(), "pid ") {
			t.Errorf("Owner() = %q", next.Owner())
		}
		if _, err := Queue(cfg); KindOf(err) != KindNodeLock {
			t.Fatalf("a third instance queued: %v", err)
		}
		if queued, ready, err := owner.SuccessorReady(); err != nil || !queued || ready {
			t.Fatalf("SuccessorReady before the successor answers: %v, %v, %v", queued, ready, err)
		}
		if err := next.Ready(); err != nil {
			t.Fatal(err)
		}
		if queued, ready, err := owner.SuccessorReady(); err != nil || !queued || !ready {
			t.Fatalf("SuccessorReady: %v, %v, %v", queued, ready, err)
		}
		rulesBefore := e.ruleCount()
		if err := owner.HandOff(); err != nil {
			t.Fatal(err)
		}
		r, err := next.Take(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		e.expectLinkAddrs(DefaultInterface, addrA, guardClusterIP)
		if e.ruleCount() != rulesBefore {
			t.Errorf("the hand-off changed the rules: %d, was %d", e.ruleCount(), rulesBefore)
		}
		e.acquire(r, claim)
		e.expectRules(rules.Endpoints(claim.Addresses, 53, nil))
		// The old owner is closed and cannot touch the node any more.
		if _, err := owner.HandOver(ctx, Handover{}); !errors.Is(err, ErrClosed) {
			t.Errorf("HandOver after HandOff: %v, want ErrClosed", err)
		}
		if _, err := Queue(Config{LockPath: e.lock + ".nobody"}); !errors.Is(err, nodelock.ErrNotHeld) {
			t.Errorf("Queue where nobody owns the node: %v", err)
		}
	})
}

func rulesText(rs []rules.Rule) string {
	var b strings.Builder
	for _, r := range rs {
		b.WriteString(strings.Join(r, " "))
		b.WriteByte('\n')
	}
	return b.String()
}

// TestCleanup removes what a handed-over node holds: chains without jumps, the divert, the link.
func TestCleanup(t *testing.T) {
	inNamespaceNFT(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		e.restore(rules.IPv4, kubeProxyUpstream)
		r := e.reconciler()
		e.acquire(r, Claim{Addresses: []netip.Addr{addrA, guardClusterIP}})
		if _, err := r.HandOver(ctx, Handover{ServiceAddresses: []netip.Addr{guardClusterIP}, Upstream: []netip.Addr{guardUpstreamIP}}); err != nil {
			t.Fatal(err)
		}
		cfg := Config{Backend: string(e.mode), LockPath: e.lock, Logger: e.log}
		if err := Cleanup(ctx, cfg); KindOf(err) != KindNodeLock {
			t.Fatalf("Cleanup while a cache owns the node: %v, want a node_lock error", err)
		}
		r.Close()
		if err := Cleanup(ctx, cfg); err != nil {
			t.Fatal(err)
		}
		if _, ok := e.guardChain(); ok {
			t.Error("the divert is still there")
		}
		if e.ruleCount() != 0 {
			t.Errorf("%d rules left", e.ruleCount())
		}
		e.expectNoLink(DefaultInterface)
		if err := Cleanup(ctx, cfg); err != nil {
			t.Errorf("a second Cleanup: %v", err)
		}
	})
}
