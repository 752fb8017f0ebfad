//go:build linux

package nodelocal

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodelocaldns/nodelocaldns/nodelocal/internal/rules"
)

// The state machines on a fake node (fake_test.go): no root, no namespace, every interleaving a table row.

var (
	fakeClusterIP = netip.MustParseAddr("10.96.0.10")
	fakeUpstream  = netip.MustParseAddr("10.96.0.11")
	fakeV6Cluster = netip.MustParseAddr("fd00:96::a")
	fakePod1      = netip.MustParseAddrPort("10.244.1.2:53")
	fakePod2      = netip.MustParseAddrPort("10.244.2.3:53")
)

var errInjected = errors.New("injected")

// index returns the position of the first operation named name at or after from, or -1.
func index(ops []string, name string, from int) int {
	for i := from; i < len(ops); i++ {
		if ops[i] == name {
			return i
		}
	}
	return -1
}

// inOrder reports whether names occur in ops in this order.
func inOrder(ops []string, names ...string) bool {
	at := 0
	for _, name := range names {
		i := index(ops, name, at)
		if i < 0 {
			return false
		}
		at = i + 1
	}
	return true
}

// TestReconcilerOnAFakeNode runs the Reconciler's life on a node in memory: deferred rules, a sync that
// fails and is retried, the guard's divert found by a repair (kept out) and by the cache that answers
// (reclaimed, in the order the guard relies on), a hand-over and the next cache taking the node back.
func TestReconcilerOnAFakeNode(t *testing.T) {
	ctx := context.Background()
	claim := Claim{Addresses: []netip.Addr{addrA, fakeClusterIP}, DeferRules: true}
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, n *fakeNode, r *Reconciler, l *Lease)
	}{{
		name: "deferred rules come with EnableRules",
		run: func(t *testing.T, n *fakeNode, r *Reconciler, l *Lease) {
			if st := n.state(); st != "rules=0 hooked=[] marked=[] link=[10.96.0.10 169.254.20.10]" {
				t.Fatalf("after Acquire with deferred rules: %s", st)
			}
			if err := l.EnableRules(ctx); err != nil {
				t.Fatal(err)
			}
			if st := n.state(); st != "rules=4 hooked=[IPv4] marked=[] link=[10.96.0.10 169.254.20.10]" {
				t.Fatalf("after EnableRules: %s", st)
			}
			if st := r.Status(); !st.RulesPresent || st.Rules != 8 || !slices.Equal(st.RuleAddresses, []netip.Addr{fakeClusterIP, addrA}) || st.Backend != "nft" {
				t.Errorf("status: %+v", st)
			}
		},
	}, {
		name: "a failed sync is reported with its kind and retried by Ensure",
		run: func(t *testing.T, n *fakeNode, r *Reconciler, l *Lease) {
			n.fail("SyncCache", errInjected)
			err := l.EnableRules(ctx)
			if !errors.Is(err, errInjected) || KindOf(err) != KindIPTables {
				t.Fatalf("EnableRules = %v, want the injected error of kind iptables", err)
			}
			if st := r.Status(); st.RulesPresent || !errors.Is(st.LastError, errInjected) {
				t.Errorf("status after the failure: %+v", st)
			}
			if err := r.Ensure(ctx); err != nil {
				t.Fatal(err)
			}
			if st := r.Status(); !st.RulesPresent || st.LastError != nil {
				t.Errorf("status after Ensure: %+v", st)
			}
		},
	}, {
		name: "a repair keeps the jumps out and the ClusterIP off while the guard's divert stands",
		run: func(t *testing.T, n *fakeNode, r *Reconciler, l *Lease) {
			if err := l.EnableRules(ctx); err != nil {
				t.Fatal(err)
			}
			// The guard failed the node open: marks, jumps out, the ClusterIP off the link.
			n.mu.Lock()
			n.marked[rules.IPv4] = true
			clear(n.hooked)
			n.linkAddrs = []netip.Addr{addrA}
			n.mu.Unlock()
			n.resetOps()
			if err := r.Ensure(ctx); err != nil {
				t.Fatal(err)
			}
			if st := n.state(); st != "rules=4 hooked=[] marked=[IPv4] link=[169.254.20.10]" {
				t.Errorf("Ensure while failed open changed the node: %s", st)
			}
			if slices.Contains(n.changes(), "SyncCache") {
				t.Errorf("Ensure synced the rules while failed open: %v", n.changes())
			}
			if st := r.Status(); !st.GuardFailedOpen || st.RulesPresent {
				t.Errorf("status while failed open: %+v", st)
			}
			// The cache answers: divert first, then the addresses, then the jumps.
			n.resetOps()
			if err := r.Reclaim(ctx); err != nil {
				t.Fatal(err)
			}
			if ops := n.changes(); !inOrder(ops, "DeleteDivert", "Ensure", "SyncCache") {
				t.Errorf("reclaim did %v; want the divert deleted, then the link, then the rules", ops)
			}
			if st := n.state(); st != "rules=4 hooked=[IPv4] marked=[] link=[10.96.0.10 169.254.20.10]" {
				t.Errorf("after Reclaim: %s", st)
			}
			if r.Status().GuardFailedOpen {
				t.Error("status still says failed open")
			}
		},
	}, {
		// A cache started on a failed-open node binds the ClusterIP (Acquire), and the guard takes it out
		// again; its repairs before its server answered used to put it back each time, so the two fought
		// over it and the cache's probe of it raced with the guard.
		name: "a repair before the rules keeps the ClusterIP off while the guard's divert stands",
		run: func(t *testing.T, n *fakeNode, r *Reconciler, l *Lease) {
			n.mu.Lock()
			n.marked[rules.IPv4] = true
			n.linkAddrs = []netip.Addr{addrA}
			n.mu.Unlock()
			n.resetOps()
			if err := r.Ensure(ctx); err != nil {
				t.Fatal(err)
			}
			if st := n.state(); st != "rules=0 hooked=[] marked=[IPv4] link=[169.254.20.10]" {
				t.Errorf("Ensure before the rules, while failed open, changed the node: %s", st)
			}
			if st := r.Status(); !st.GuardFailedOpen || !slices.Equal(st.Addresses, []netip.Addr{addrA}) {
				t.Errorf("status while failed open: failed open %v, addresses %v", st.GuardFailedOpen, st.Addresses)
			}
			// The server answers: EnableRules takes the node back and puts the ClusterIP back.
			if err := l.EnableRules(ctx); err != nil {
				t.Fatal(err)
			}
			if st := n.state(); st != "rules=4 hooked=[IPv4] marked=[] link=[10.96.0.10 169.254.20.10]" {
				t.Errorf("after EnableRules: %s", st)
			}
			// Without a divert, a repair before the rules puts back what the link lost.
			if err := l.DisableRules(ctx); err != nil {
				t.Fatal(err)
			}
			n.mu.Lock()
			n.linkAddrs = []netip.Addr{addrA}
			n.mu.Unlock()
			if err := r.Ensure(ctx); err != nil {
				t.Fatal(err)
			}
			if st := r.Status(); st.GuardFailedOpen || !slices.Equal(st.Addresses, []netip.Addr{fakeClusterIP, addrA}) {
				t.Errorf("status after a repair with no divert: failed open %v, addresses %v", st.GuardFailedOpen, st.Addresses)
			}
		},
	}, {
		name: "a reclaim that cannot remove the divert leaves the jumps out",
		run: func(t *testing.T, n *fakeNode, _ *Reconciler, l *Lease) {
			n.mu.Lock()
			n.marked[rules.IPv4] = true
			n.mu.Unlock()
			n.fail("DeleteDivert", errInjected)
			if err := l.EnableRules(ctx); !errors.Is(err, errInjected) {
				t.Fatalf("EnableRules = %v, want the injected error", err)
			}
			if slices.Contains(n.changes(), "SyncCache") {
				t.Errorf("the jumps went in with the divert in place: %v", n.changes())
			}
		},
	}, {
		name: "hand-over: divert, narrow, forget; then unhook, forget, ClusterIP off; the next cache reclaims",
		run: func(t *testing.T, n *fakeNode, r *Reconciler, l *Lease) {
			if err := l.EnableRules(ctx); err != nil {
				t.Fatal(err)
			}
			n.served[fakeUpstream] = []netip.AddrPort{fakePod1}
			h := Handover{ServiceAddresses: []netip.Addr{fakeClusterIP}, Upstream: []netip.Addr{fakeUpstream}}
			n.resetOps()
			diverted, err := r.HandOver(ctx, h)
			if err != nil {
				t.Fatal(err)
			}
			if len(diverted) != 1 || diverted[0].From != addrA || diverted[0].To != fakeUpstream {
				t.Errorf("diverted %v", diverted)
			}
			if ops := n.changes(); !slices.Equal(ops, []string{"WriteDivert", "NarrowCache", "ForgetFlows"}) {
				t.Errorf("HandOver did %v", ops)
			}
			if st := n.state(); st != "rules=4 hooked=[IPv4] marked=[IPv4] link=[10.96.0.10 169.254.20.10]" || !n.repliesOnly {
				t.Errorf("after HandOver: %s, replies only %v", st, n.repliesOnly)
			}
			n.resetOps()
			removed, err := r.CompleteHandOver(ctx, h)
			if err != nil {
				t.Fatal(err)
			}
			if ops := n.changes(); !slices.Equal(ops, []string{"UnhookCache", "ForgetFlows", "RemoveAddresses"}) || !slices.Equal(removed, []netip.Addr{fakeClusterIP}) {
				t.Errorf("CompleteHandOver did %v, removed %v", ops, removed)
			}
			if st := n.state(); st != "rules=4 hooked=[] marked=[IPv4] link=[169.254.20.10]" {
				t.Errorf("after CompleteHandOver: %s", st)
			}
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
			// The next cache: addresses first, rules once it answers, which takes the node back.
			next := n.reconciler(t, discard{})
			nl, err := next.Acquire(ctx, claim)
			if err != nil {
				t.Fatal(err)
			}
			// It binds the ClusterIP again, but without its jumps kube-proxy's DNAT still serves it.
			if st := n.state(); st != "rules=4 hooked=[] marked=[IPv4] link=[10.96.0.10 169.254.20.10]" {
				t.Errorf("the next cache's Acquire changed more than the addresses before it answered: %s", st)
			}
			n.resetOps()
			if err := nl.EnableRules(ctx); err != nil {
				t.Fatal(err)
			}
			if ops := n.changes(); !inOrder(ops, "DeleteDivert", "Ensure", "SyncCache") {
				t.Errorf("the next cache took the node back with %v", ops)
			}
			if st := n.state(); st != "rules=4 hooked=[IPv4] marked=[] link=[10.96.0.10 169.254.20.10]" || n.repliesOnly {
				t.Errorf("after the next cache answered: %s, replies only %v", st, n.repliesOnly)
			}
		},
	}, {
		name: "a hand-over whose divert cannot be written leaves the cache's rules as they were",
		run: func(t *testing.T, n *fakeNode, r *Reconciler, l *Lease) {
			if err := l.EnableRules(ctx); err != nil {
				t.Fatal(err)
			}
			n.fail("WriteDivert", errInjected)
			n.resetOps()
			if _, err := r.HandOver(ctx, Handover{Upstream: []netip.Addr{fakeUpstream}}); !errors.Is(err, errInjected) {
				t.Fatalf("HandOver = %v, want the injected error", err)
			}
			if slices.Contains(n.changes(), "NarrowCache") || n.repliesOnly {
				t.Errorf("narrowed the rules without a divert: %v", n.changes())
			}
		},
	}, {
		name: "teardown deletes the rules, then the link",
		run: func(t *testing.T, n *fakeNode, _ *Reconciler, l *Lease) {
			if err := l.EnableRules(ctx); err != nil {
				t.Fatal(err)
			}
			n.resetOps()
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if ops := n.changes(); !slices.Equal(ops, []string{"SyncCache", "Teardown"}) {
				t.Errorf("the last Release did %v", ops)
			}
			if st := n.state(); st != "rules=0 hooked=[] marked=[] link=[]" {
				t.Errorf("after the last Release: %s", st)
			}
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			n := newFakeNode(rules.NFT)
			r := n.reconciler(t, &recLog{t: t})
			l, err := r.Acquire(ctx, claim)
			if err != nil {
				t.Fatal(err)
			}
			tc.run(t, n, r, l)
		})
	}
}

// fakeProbe is a probe whose answer a test sets.
type fakeProbe struct{ down atomic.Bool }

func (p *fakeProbe) probe(context.Context, netip.AddrPort) error {
	if p.down.Load() {
		return errors.New("no answer")
	}
	return nil
}

// TestGuardOnAFakeNode drives the guard's rounds with a clock of its own: when it fails open, in what
// order, and what it does when the cache takes the node back at each step of the way.
func TestGuardOnAFakeNode(t *testing.T) {
	ctx := context.Background()
	cfg := GuardConfig{
		Addresses:        []netip.Addr{addrA, fakeClusterIP},
		ServiceAddresses: []netip.Addr{fakeClusterIP},
		Upstream:         []netip.Addr{fakeUpstream},
		FailAfter:        3,
		Recheck:          time.Second,
	}
	// cacheServing puts the node as a cache that answers leaves it.
	cacheServing := func(n *fakeNode) {
		n.mu.Lock()
		defer n.mu.Unlock()
		n.cache = rules.Endpoints([]netip.Addr{addrA, fakeClusterIP}, 53, nil)
		n.hooked[rules.IPv4] = true
		n.linkAddrs = []netip.Addr{fakeClusterIP, addrA}
		n.served[fakeUpstream] = []netip.AddrPort{fakePod1}
	}
	// reclaim is what a cache that takes the node back does: marks, addresses, jumps.
	reclaim := func(n *fakeNode) func() {
		return func() {
			n.mu.Lock()
			defer n.mu.Unlock()
			n.unmarkLocked(rules.Families)
			if !slices.Contains(n.linkAddrs, fakeClusterIP) {
				n.linkAddrs = append([]netip.Addr{fakeClusterIP}, n.linkAddrs...)
			}
			n.hooked[rules.IPv4] = true
		}
	}
	failedOpen := "rules=4 hooked=[] marked=[IPv4] link=[169.254.20.10]"
	serving := "rules=4 hooked=[IPv4] marked=[] link=[10.96.0.10 169.254.20.10]"
	for _, tc := range []struct {
		name string
		// setup changes the node before the rounds; rounds is how many failed rounds to run.
		setup  func(n *fakeNode)
		rounds int
		want   string
		// wantChanges is the operations that changed the node, in order; wantFailovers the count.
		wantChanges   []string
		wantFailovers uint64
		wantLog       string
	}{{
		name:          "fails open after FailAfter rounds: divert, jumps, ClusterIP, flows",
		setup:         cacheServing,
		rounds:        3,
		want:          failedOpen,
		wantChanges:   []string{"WriteDivert", "UnhookCacheWhileDiverted", "RemoveAddresses", "ForgetFlows"},
		wantFailovers: 1,
	}, {
		name:        "two failed rounds are not enough",
		setup:       cacheServing,
		rounds:      2,
		want:        serving,
		wantChanges: nil,
	}, {
		name: "a cache whose jumps are not in place is left alone",
		setup: func(n *fakeNode) {
			cacheServing(n)
			clear(n.hooked)
		},
		rounds:  5,
		want:    "rules=4 hooked=[] marked=[] link=[10.96.0.10 169.254.20.10]",
		wantLog: "nothing to fail open",
	}, {
		name: "the cache takes the node back before the jumps go: the node stays the cache's",
		setup: func(n *fakeNode) {
			cacheServing(n)
			n.before("UnhookCacheWhileDiverted", reclaim(n))
		},
		rounds:      3,
		want:        serving,
		wantChanges: []string{"WriteDivert", "UnhookCacheWhileDiverted"},
		wantLog:     "took the node back while the guard was failing it open",
	}, {
		name: "the cache takes the node back while the ClusterIP goes: it gets the address back",
		setup: func(n *fakeNode) {
			cacheServing(n)
			n.before("RemoveAddresses", reclaim(n))
		},
		rounds:      3,
		want:        serving,
		wantChanges: []string{"WriteDivert", "UnhookCacheWhileDiverted", "RemoveAddresses", "AddAddresses"},
	}, {
		name: "a divert that cannot be written leaves the cache's jumps and retries next round",
		setup: func(n *fakeNode) {
			cacheServing(n)
			n.fail("WriteDivert", errInjected)
		},
		rounds:        4,
		want:          failedOpen,
		wantChanges:   []string{"WriteDivert", "WriteDivert", "UnhookCacheWhileDiverted", "RemoveAddresses", "ForgetFlows"},
		wantFailovers: 1,
		wantLog:       "injected",
	}, {
		name: "an upstream kube-proxy does not serve is not diverted, and said so",
		setup: func(n *fakeNode) {
			cacheServing(n)
			delete(n.served, fakeUpstream)
		},
		rounds:        3,
		want:          failedOpen,
		wantChanges:   []string{"WriteDivert", "UnhookCacheWhileDiverted", "RemoveAddresses", "ForgetFlows"},
		wantFailovers: 1,
		wantLog:       "not diverting",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			n := newFakeNode(rules.NFT)
			tc.setup(n)
			p := &fakeProbe{}
			p.down.Store(true)
			log := &recLog{t: t}
			c := cfg
			c.Logger = log
			g := n.guard(t, c, p.probe)
			w := &guardWatch{}
			now := time.Unix(0, 0)
			for range tc.rounds {
				g.tickLocked(ctx, w, now)
				now = now.Add(2 * time.Second) // past Recheck: every round may act
			}
			if st := n.state(); st != tc.want {
				t.Errorf("node: %s\nwant: %s", st, tc.want)
			}
			if ops := n.changes(); !slices.Equal(ops, tc.wantChanges) {
				t.Errorf("changes %v, want %v", ops, tc.wantChanges)
			}
			if g.Failovers() != tc.wantFailovers {
				t.Errorf("%d failovers, want %d", g.Failovers(), tc.wantFailovers)
			}
			if tc.wantLog != "" && log.count(tc.wantLog) == 0 {
				t.Errorf("nothing logged with %q", tc.wantLog)
			}
		})
	}
}

// TestGuardWhileFailedOpen: failed open, the guard takes out jumps and the ClusterIP that came back (a
// repair loop that raced it, a cache process starting), watches again once the cache took the node back
// and answered RecoverAfter rounds, and fails open again when it dies again.
func TestGuardWhileFailedOpen(t *testing.T) {
	ctx := context.Background()
	n := newFakeNode(rules.NFT)
	n.mu.Lock()
	n.cache = rules.Endpoints([]netip.Addr{addrA, fakeClusterIP}, 53, nil)
	n.hooked[rules.IPv4] = true
	n.linkAddrs = []netip.Addr{fakeClusterIP, addrA}
	n.served[fakeUpstream] = []netip.AddrPort{fakePod1}
	n.mu.Unlock()
	p := &fakeProbe{}
	p.down.Store(true)
	log := &recLog{t: t}
	g := n.guard(t, GuardConfig{
		Addresses: []netip.Addr{addrA, fakeClusterIP}, ServiceAddresses: []netip.Addr{fakeClusterIP},
		Upstream: []netip.Addr{fakeUpstream}, FailAfter: 1, RecoverAfter: 2, Recheck: time.Second, Logger: log,
	}, p.probe)
	w := &guardWatch{}
	now := time.Unix(0, 0)
	tick := func(d time.Duration) {
		g.tickLocked(ctx, w, now)
		now = now.Add(d)
	}
	tick(100 * time.Millisecond)
	if g.State() != GuardFailedOpen {
		t.Fatalf("state %v after a failed round with FailAfter 1", g.State())
	}
	// A repair loop puts the jumps and the ClusterIP back behind the guard's back.
	n.mu.Lock()
	n.hooked[rules.IPv4] = true
	n.linkAddrs = []netip.Addr{fakeClusterIP, addrA}
	n.mu.Unlock()
	tick(2 * time.Second) // before Recheck: not looked at yet
	if st := n.state(); st != "rules=4 hooked=[IPv4] marked=[IPv4] link=[10.96.0.10 169.254.20.10]" {
		t.Fatalf("the guard read the rules before Recheck: %s", st)
	}
	tick(2 * time.Second)
	if st := n.state(); st != "rules=4 hooked=[] marked=[IPv4] link=[169.254.20.10]" || log.count("again") == 0 {
		t.Fatalf("the guard did not take them out again: %s", st)
	}
	// The cache answers and takes the node back.
	p.down.Store(false)
	n.mu.Lock()
	n.unmarkLocked(rules.Families)
	n.hooked[rules.IPv4] = true
	n.linkAddrs = []netip.Addr{fakeClusterIP, addrA}
	n.mu.Unlock()
	tick(2 * time.Second) // finds the marks gone, and the first answered round
	if g.State() != GuardFailedOpen {
		t.Fatalf("watching again after 1 answered round with RecoverAfter 2")
	}
	tick(2 * time.Second)
	if g.State() != GuardWatching {
		t.Fatalf("state %v after RecoverAfter answered rounds", g.State())
	}
	// And it dies again.
	p.down.Store(true)
	tick(2 * time.Second)
	if g.State() != GuardFailedOpen || g.Failovers() != 2 {
		t.Errorf("state %v, %d failovers after the cache died again", g.State(), g.Failovers())
	}
}

// TestProbeExemptionOnAFakeNode: reference counted, removed by the last Release, and looked for again
// after an add that failed (it may have committed).
func TestProbeExemptionOnAFakeNode(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name      string
		failAdd   bool
		wantProbe bool
	}{
		{name: "the last release removes it"},
		{name: "a failed add is removed too", failAdd: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newFakeNode(rules.NFT)
			p := NewProbeExemption(0)
			c, err := newFirewallChoice("nft", 0, 0, nil, "test")
			if err != nil {
				t.Fatal(err)
			}
			n.attach(c)
			p.fw, p.backend = c, "nft"
			if tc.failAdd {
				n.fail("AddProbeExemption", errInjected)
			}
			err1 := p.Acquire(ctx, "nft", []netip.Addr{addrA})
			err2 := p.Acquire(ctx, "nft", []netip.Addr{addrA})
			if (err1 != nil) != tc.failAdd || err2 != nil {
				t.Fatalf("Acquire: %v, %v", err1, err2)
			}
			if err := p.Release(time.Second); err != nil || !p.Active() {
				t.Fatalf("first Release: %v, active %v", err, p.Active())
			}
			if err := p.Release(time.Second); err != nil || p.Active() {
				t.Fatalf("last Release: %v, active %v", err, p.Active())
			}
			if n.probe || !strings.Contains(strings.Join(n.changes(), " "), "RemoveProbeExemption") {
				t.Errorf("probe exemption %v after the last Release; operations %v", n.probe, n.changes())
			}
		})
	}
}

// TestGuardDualStackMarksBothFamilies: the guard of a dual-stack cache whose IPv6 address is a Service
// address only marks and unhooks both families, so that the IPv6 jumps go too.
func TestGuardDualStackMarksBothFamilies(t *testing.T) {
	ctx := context.Background()
	n := newFakeNode(rules.NFT)
	n.mu.Lock()
	n.cache = rules.Endpoints([]netip.Addr{addrA, fakeV6Cluster}, 53, nil)
	n.hooked[rules.IPv4], n.hooked[rules.IPv6] = true, true
	n.linkAddrs = []netip.Addr{addrA, fakeV6Cluster}
	n.served[fakeUpstream] = []netip.AddrPort{fakePod1}
	n.mu.Unlock()
	p := &fakeProbe{}
	p.down.Store(true)
	g := n.guard(t, GuardConfig{
		Addresses: []netip.Addr{addrA, fakeV6Cluster}, ServiceAddresses: []netip.Addr{fakeV6Cluster},
		Upstream: []netip.Addr{fakeUpstream}, FailAfter: 1, Logger: &recLog{t: t},
	}, p.probe)
	g.tickLocked(ctx, &guardWatch{}, time.Unix(0, 0))
	if st := n.state(); st != "rules=4 hooked=[] marked=[IPv4 IPv6] link=[169.254.20.10]" {
		t.Errorf("after failing open: %s", st)
	}
}

// TestGuardDivertFollowsTheEndpoints: while failed open, the divert follows kube-dns-upstream's endpoints
// (a cluster-DNS rollout during a long fail-open), rewrites nothing while they stay, never marks the node
// again once the cache took it back, and a guard that found the node failed open (a hand-over's divert)
// points it at the endpoints of now at its first recheck.
func TestGuardDivertFollowsTheEndpoints(t *testing.T) {
	ctx := context.Background()
	cfg := GuardConfig{
		Addresses: []netip.Addr{addrA, fakeClusterIP}, ServiceAddresses: []netip.Addr{fakeClusterIP},
		Upstream: []netip.Addr{fakeUpstream}, FailAfter: 1, Recheck: time.Second,
	}
	routesTo := func(n *fakeNode) []netip.AddrPort {
		n.mu.Lock()
		defer n.mu.Unlock()
		var out []netip.AddrPort
		for _, r := range n.divert.Routes {
			out = append(out, r.To...)
		}
		return out
	}
	t.Run("failed open by this guard", func(t *testing.T) {
		n := newFakeNode(rules.NFT)
		n.mu.Lock()
		n.cache = rules.Endpoints([]netip.Addr{addrA, fakeClusterIP}, 53, nil)
		n.hooked[rules.IPv4] = true
		n.linkAddrs = []netip.Addr{fakeClusterIP, addrA}
		n.served[fakeUpstream] = []netip.AddrPort{fakePod1}
		n.mu.Unlock()
		p := &fakeProbe{}
		p.down.Store(true)
		c := cfg
		c.Logger = &recLog{t: t}
		g := n.guard(t, c, p.probe)
		w := &guardWatch{}
		now := time.Unix(0, 0)
		g.tickLocked(ctx, w, now)
		if got := routesTo(n); !slices.Equal(got, []netip.AddrPort{fakePod1, fakePod1}) {
			t.Fatalf("divert to %v after failing open", got)
		}
		n.resetOps()
		now = now.Add(2 * time.Second)
		g.tickLocked(ctx, w, now)
		if slices.Contains(n.changes(), "RefreshDivert") {
			t.Errorf("rewrote a divert whose endpoints stayed: %v", n.changes())
		}
		// The cluster DNS moves.
		n.mu.Lock()
		n.served[fakeUpstream] = []netip.AddrPort{fakePod2}
		n.mu.Unlock()
		now = now.Add(2 * time.Second)
		g.tickLocked(ctx, w, now)
		if got := routesTo(n); !slices.Equal(got, []netip.AddrPort{fakePod2, fakePod2}) {
			t.Fatalf("divert to %v after the endpoints moved to %v", got, fakePod2)
		}
		// It moves again while the cache takes the node back: the divert is not written again.
		n.mu.Lock()
		n.served[fakeUpstream] = []netip.AddrPort{fakePod1}
		n.mu.Unlock()
		n.before("RefreshDivert", func() {
			n.mu.Lock()
			defer n.mu.Unlock()
			n.unmarkLocked(rules.Families)
		})
		now = now.Add(2 * time.Second)
		g.tickLocked(ctx, w, now)
		if st := n.state(); strings.Contains(st, "marked=[IPv4]") {
			t.Errorf("the refresh marked the node again after the cache took it back: %s", st)
		}
	})
	t.Run("failed open before this guard", func(t *testing.T) {
		n := newFakeNode(rules.NFT)
		n.mu.Lock()
		n.cache = rules.Endpoints([]netip.Addr{addrA, fakeClusterIP}, 53, nil)
		n.marked[rules.IPv4] = true
		n.divert.Routes = []rules.DivertRoute{{From: addrA, Port: 53, Protocol: rules.UDP, To: []netip.AddrPort{fakePod1}}}
		n.linkAddrs = []netip.Addr{addrA}
		n.served[fakeUpstream] = []netip.AddrPort{fakePod2}
		n.mu.Unlock()
		p := &fakeProbe{}
		p.down.Store(true)
		c := cfg
		c.Logger = &recLog{t: t}
		g := n.guard(t, c, p.probe)
		g.state.Store(int32(GuardFailedOpen)) // as Run finds it
		g.tickLocked(ctx, &guardWatch{}, time.Unix(0, 0))
		if got := routesTo(n); !slices.Equal(got, []netip.AddrPort{fakePod2, fakePod2}) {
			t.Errorf("the divert found in place points at %v, want kube-dns-upstream's endpoints of now %v", got, fakePod2)
		}
	})
}
