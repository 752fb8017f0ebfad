//go:build linux

package nodelocal

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"

	"github.com/nodelocaldns/nodelocaldns/nodelocal/internal/rules"
)

var (
	guardClusterIP  = netip.MustParseAddr("10.96.0.10")
	guardUpstreamIP = netip.MustParseAddr("10.96.0.11")
)

// fakeCache stands in for the cache's DNS server: its probe answers while alive is set, and counts the
// probes, so that a test can wait for rounds to have happened rather than for time to have passed.
type fakeCache struct {
	alive  atomic.Bool
	probes atomic.Int64
}

func (f *fakeCache) probe(context.Context, netip.AddrPort) error {
	f.probes.Add(1)
	if f.alive.Load() {
		return nil
	}
	return errors.New("connection refused")
}

// guard returns a fast Guard for the addresses addrA (link-local) and guardClusterIP, running until the
// test ends.
func (e *env) guard(f *fakeCache, mutate ...func(*GuardConfig)) *Guard {
	e.t.Helper()
	cfg := GuardConfig{
		Backend:  string(e.mode),
		LockPath: filepath.Join(e.t.TempDir(), "guard.lock"),
		// No cache's lock to watch: the guard probes every Interval, as the tests that do not hold one want.
		CacheLockPath:    filepath.Join(e.t.TempDir(), "absent", "nodelocaldns.lock"),
		Addresses:        []netip.Addr{addrA, guardClusterIP},
		ServiceAddresses: []netip.Addr{guardClusterIP},
		Upstream:         []netip.Addr{guardUpstreamIP},
		Interval:         40 * time.Millisecond,
		ProbeTimeout:     100 * time.Millisecond,
		FailAfter:        3,
		RecoverAfter:     2,
		Recheck:          100 * time.Millisecond,
		Probe:            f.probe,
		Logger:           e.log,
	}
	for _, m := range mutate {
		m(&cfg)
	}
	g, err := NewGuard(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { g.Close() })
	return g
}

// waitRounds waits until the guard of e.guard (two addresses, so two probes a round) has probed n more
// rounds.
func (f *fakeCache) waitRounds(t *testing.T, n int) {
	t.Helper()
	want := f.probes.Load() + 2*int64(n)
	waitFor(t, fmt.Sprintf("%d more probe rounds", n), eventually, func() bool { return f.probes.Load() >= want })
}

// eventually bounds a wait for something the guard does within a few rounds: only a failure bound, generous
// so that a busy machine does not fail the test.
const eventually = 30 * time.Second

func (e *env) runGuard(g *Guard) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	e.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			e.t.Errorf("guard Run: %v", err)
		}
	})
}

func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (e *env) cacheJumps() bool {
	e.t.Helper()
	has, err := e.ipt.HasJumps(context.Background(), rules.NodeCache(rules.IPv4, rules.NodeCacheSpec{}))
	if err != nil {
		e.t.Fatal(err)
	}
	return has
}

func (e *env) guardChain() ([]rules.Rule, bool) {
	e.t.Helper()
	st, err := e.ipt.Inspect(context.Background(), rules.IPv4, rules.NAT)
	if err != nil {
		e.t.Fatal(err)
	}
	return st.Chains[rules.GuardChain], st.ChainExists(rules.GuardChain)
}

// TestGuardIdlesUntilTheCacheLockCloses: once the cache has answered RecoverAfter rounds, the guard probes
// only every IdleInterval (an hour here, so never within the test); the cache's process dying closes its
// lock file, which sets the guard probing every Interval at once, and it fails open.
func TestGuardIdlesUntilTheCacheLockCloses(t *testing.T) {
	inNamespaceNFT(t, func(t *testing.T, e *env) {
		r := e.reconciler()
		e.acquire(r, Claim{Addresses: []netip.Addr{addrA, guardClusterIP}})
		f := &fakeCache{}
		f.alive.Store(true)
		g := e.guard(f, func(c *GuardConfig) { c.CacheLockPath, c.IdleInterval = e.lock, time.Hour })
		e.runGuard(g)
		const answered = 2 * 2 // RecoverAfter rounds of e.guard's two addresses
		waitFor(t, "the first rounds", eventually, func() bool { return f.probes.Load() >= answered })
		time.Sleep(10 * 40 * time.Millisecond) // ten rounds at Interval, were the guard not idle
		if n := f.probes.Load(); n != answered {
			t.Fatalf("%d probes against a cache that answers, want the %d of the first rounds only", n, answered)
		}

		f.alive.Store(false)
		if err := r.Close(); err != nil { // the cache dies: its lock file is closed, its rules stay
			t.Fatal(err)
		}
		waitFor(t, "guard fails open", eventually, func() bool { return g.State() == GuardFailedOpen })
		if e.cacheJumps() {
			t.Error("the cache's jumps are still in place")
		}
	})
}

func TestGuardFailsOpenAndTheCacheReclaims(t *testing.T) {
	inNamespace(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		r := e.reconciler()
		claim := Claim{Addresses: []netip.Addr{addrA, guardClusterIP}}
		e.acquire(r, claim)
		eps := rules.Endpoints(claim.Addresses, 53, nil)
		// IPVS mode: the kube-dns-upstream ClusterIP is an address of the node, so the guard diverts to it.
		run(t, "ip", "link", "add", "kube-ipvs0", "type", "bridge")
		run(t, "ip", "addr", "add", guardUpstreamIP.String()+"/32", "dev", "kube-ipvs0")
		f := &fakeCache{}
		f.alive.Store(true)
		g := e.guard(f)
		e.runGuard(g)

		f.waitRounds(t, 10) // against a healthy cache
		if g.State() != GuardWatching || g.Failovers() != 0 {
			t.Fatalf("healthy cache: state %v, %d failovers", g.State(), g.Failovers())
		}
		e.expectRules(eps)

		f.alive.Store(false)
		waitFor(t, "guard fails open", eventually, func() bool { return g.State() == GuardFailedOpen })
		if e.cacheJumps() {
			t.Error("the cache's jumps are still in place")
		}
		got, ok := e.guardChain()
		want := rules.Guard(rules.IPv4, []rules.DivertRoute{
			{From: addrA, Port: 53, Protocol: rules.UDP, To: []netip.AddrPort{netip.AddrPortFrom(guardUpstreamIP, 53)}},
			{From: addrA, Port: 53, Protocol: rules.TCP, To: []netip.AddrPort{netip.AddrPortFrom(guardUpstreamIP, 53)}},
		}).Chains[0].Rules
		if !ok || !slices.EqualFunc(got, want, func(a, b rules.Rule) bool { return slices.Equal(a, b) }) {
			t.Errorf("guard chain %v (exists %v), want %q", got, ok, want)
		}
		e.expectLinkAddrs(DefaultInterface, addrA)
		if g.Failovers() != 1 {
			t.Errorf("%d failovers, want 1", g.Failovers())
		}

		// The cache's repair loop honours the guard's chain.
		if err := r.Ensure(ctx); err != nil {
			t.Fatal(err)
		}
		if e.cacheJumps() || !r.Status().GuardFailedOpen || r.Status().RulesPresent {
			t.Errorf("Ensure put the jumps back or did not say why not: %+v", r.Status())
		}
		// A repair loop that raced the guard and put the jumps back loses them again.
		if _, err := e.ipt.Sync(ctx, rules.NodeCache(rules.IPv4, rules.NodeCacheSpec{Endpoints: eps})); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "guard takes the jumps out again", eventually, func() bool { return !e.cacheJumps() })

		// The cache answers again and takes the node back; the guard only watches.
		f.alive.Store(true)
		time.Sleep(200 * time.Millisecond)
		if _, ok := e.guardChain(); !ok || e.cacheJumps() {
			t.Fatal("the guard undid its fail-open by itself")
		}
		if err := r.Reclaim(ctx); err != nil {
			t.Fatal(err)
		}
		e.expectRules(eps)
		e.expectLinkAddrs(DefaultInterface, addrA, guardClusterIP)
		if _, ok := e.guardChain(); ok {
			t.Error("Reclaim left the guard's chain")
		}
		if r.Status().GuardFailedOpen || !r.Status().RulesPresent {
			t.Errorf("status after Reclaim: %+v", r.Status())
		}
		waitFor(t, "guard watches again", eventually, func() bool { return g.State() == GuardWatching })
		if g.Failovers() != 1 {
			t.Errorf("%d failovers, want 1", g.Failovers())
		}

		// And fails open again when the cache dies again; EnableRules reclaims as Reclaim does.
		f.alive.Store(false)
		waitFor(t, "guard fails open again", eventually, func() bool { return g.State() == GuardFailedOpen })
		f.alive.Store(true)
		l := e.acquire(r, Claim{Addresses: []netip.Addr{addrA}, DeferRules: true})
		if err := l.EnableRules(ctx); err != nil {
			t.Fatal(err)
		}
		e.expectRules(eps)
		waitFor(t, "guard watches again", eventually, func() bool { return g.State() == GuardWatching })
		if g.Failovers() != 2 || e.log.count("reclaimed the node") != 2 {
			t.Errorf("%d failovers, %d reclaims logged; want 2 and 2", g.Failovers(), e.log.count("reclaimed the node"))
		}
	})
}

// TestGuardLeavesAStartingCacheAlone: a cache whose rules are not in place yet (its server does not
// answer yet, or it stopped cleanly) is not failed open, however long the probes fail.
func TestGuardLeavesAStartingCacheAlone(t *testing.T) {
	inNamespaceNFT(t, func(t *testing.T, e *env) {
		r := e.reconciler()
		e.acquire(r, Claim{Addresses: []netip.Addr{addrA, guardClusterIP}, DeferRules: true})
		f := &fakeCache{}
		g := e.guard(f)
		e.runGuard(g)
		waitFor(t, "the guard to see there is nothing to fail open", eventually, func() bool {
			return e.log.count("nothing to fail open") > 0
		})
		f.waitRounds(t, 10) // and the probes go on failing
		if g.State() != GuardWatching || g.Failovers() != 0 {
			t.Errorf("state %v, %d failovers", g.State(), g.Failovers())
		}
		if _, ok := e.guardChain(); ok {
			t.Error("guard chain written")
		}
		e.expectLinkAddrs(DefaultInterface, addrA, guardClusterIP)
		if e.log.count("nothing to fail open") != 1 {
			t.Errorf("want one log line saying there is nothing to fail open")
		}
	})
}

// TestGuardStartedAfterTheCacheDied: the cache's rules and addresses are left behind by a process that
// is gone; a guard started afterwards fails open, and a guard restarted after that knows it has.
func TestGuardStartedAfterTheCacheDied(t *testing.T) {
	inNamespaceNFT(t, func(t *testing.T, e *env) {
		r := e.reconciler()
		e.acquire(r, Claim{Addresses: []netip.Addr{addrA, guardClusterIP}})
		if err := r.Close(); err != nil { // the cache dies: the node keeps its link and rules
			t.Fatal(err)
		}
		lock := filepath.Join(t.TempDir(), "guard.lock")
		g := e.guard(&fakeCache{}, func(c *GuardConfig) { c.LockPath = lock })
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- g.Run(ctx) }()
		waitFor(t, "guard fails open", eventually, func() bool { return g.State() == GuardFailedOpen })
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		g.Close()
		if e.cacheJumps() {
			t.Error("jumps still in place")
		}
		e.expectLinkAddrs(DefaultInterface, addrA)
		// iptables mode: the upstream ClusterIP is not an address of the node; a DNAT to it would leave the
		// node, so there is none, only the chain that marks the node as failed open.
		if rules, ok := e.guardChain(); !ok || len(rules) != 0 {
			t.Errorf("guard chain %q (exists %v), want it empty", rules, ok)
		}
		if e.log.count("not diverting") != 1 {
			t.Error("the skipped divert was not logged")
		}

		f2 := &fakeCache{}
		g2 := e.guard(f2, func(c *GuardConfig) { c.LockPath = lock })
		e.runGuard(g2)
		waitFor(t, "restarted guard knows", eventually, func() bool { return g2.State() == GuardFailedOpen })
		if g2.Failovers() != 0 {
			t.Errorf("restarted guard counted %d failovers", g2.Failovers())
		}
	})
}

func TestGuardConfigErrors(t *testing.T) {
	lock := filepath.Join(t.TempDir(), "guard.lock")
	ll6 := netip.MustParseAddr("fd00:169:254::10")
	cases := []struct {
		name string
		cfg  GuardConfig
		want string
	}{
		{"no addresses", GuardConfig{}, "needs the cache's addresses"},
		{"upstream is local", GuardConfig{Addresses: []netip.Addr{addrA, ll6}, Upstream: []netip.Addr{ll6}}, "cannot be the kube-dns-upstream ClusterIP"},
		{"foreign service address", GuardConfig{Addresses: []netip.Addr{addrA}, ServiceAddresses: []netip.Addr{guardClusterIP}, Upstream: []netip.Addr{guardUpstreamIP}}, "not one of the cache's addresses"},
		{"bad backend", GuardConfig{Addresses: []netip.Addr{guardClusterIP}, ServiceAddresses: []netip.Addr{guardClusterIP}, Backend: "ipvs"}, "unknown rules backend"},
	}
	for _, tc := range cases {
		tc.cfg.LockPath = lock
		_, err := NewGuard(tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) || KindOf(err) != KindConfig {
			t.Errorf("%s: %v, want a config error saying %q", tc.name, err, tc.want)
		}
	}
}

func TestGuardWithoutUpstreamWarns(t *testing.T) {
	log := &recLog{t: t}
	g, err := NewGuard(GuardConfig{
		LockPath:  filepath.Join(t.TempDir(), "guard.lock"),
		Addresses: []netip.Addr{addrA, netip.MustParseAddr("fd00:169:254::10")},
		Upstream:  []netip.Addr{guardUpstreamIP},
		Logger:    log,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if len(g.diverts) != 1 || g.diverts[0].From != addrA || log.count("[fd00:169:254::10]") != 1 {
		t.Errorf("diverts %v; want 169.254.20.10 only, and a warning naming fd00:169:254::10", g.diverts)
	}
}

func TestSecondGuardIsRefused(t *testing.T) {
	cfg := GuardConfig{
		LockPath:         filepath.Join(t.TempDir(), "guard.lock"),
		Addresses:        []netip.Addr{addrA, guardClusterIP},
		ServiceAddresses: []netip.Addr{guardClusterIP},
		Upstream:         []netip.Addr{guardUpstreamIP},
	}
	g, err := NewGuard(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	_, err = NewGuard(cfg)
	if KindOf(err) != KindNodeLock || !strings.Contains(err.Error(), "another instance") {
		t.Errorf("second guard: %v, want a node_lock error naming the first", err)
	}
}

func TestDNSProbe(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var ednsVersion atomic.Int32
	ednsVersion.Store(-1)
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetRcode(r, dns.RcodeRefused) // any rcode counts: the server is alive
		if opt := r.IsEdns0(); opt != nil {
			ednsVersion.Store(int32(opt.Version()))
		}
		w.WriteMsg(m)
	})}
	go srv.ActivateAndServe()
	defer srv.Shutdown()
	// A live server passes whatever the machine's load: the timeout here is only a failure bound.
	live := DNSProbe("cluster.local", dns.TypeSOA, 30*time.Second)
	ctx := context.Background()
	if err := live(ctx, netip.MustParseAddrPort(pc.LocalAddr().String())); err != nil {
		t.Errorf("live server: %v", err)
	}
	if err := DNSProbe("", dns.TypeSOA, 30*time.Second)(ctx, netip.MustParseAddrPort(pc.LocalAddr().String())); err != nil {
		t.Errorf("live server, EDNS version probe: %v", err)
	}
	if v := ednsVersion.Load(); v != 1 {
		t.Errorf("the EDNS probe asked for EDNS version %d, want 1", v)
	}

	silent, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	// ctx has no deadline: a timeout can only be the probe's own.
	probe := DNSProbe("cluster.local", dns.TypeSOA, 300*time.Millisecond)
	var timeout net.Error
	if err := probe(ctx, netip.MustParseAddrPort(silent.LocalAddr().String())); err == nil {
		t.Error("a server that never answers passed")
	} else if !errors.As(err, &timeout) || !timeout.Timeout() {
		t.Errorf("a server that never answers: %v, want the probe's timeout", err)
	}

	closed, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := closed.LocalAddr().String()
	closed.Close()
	if err := probe(ctx, netip.MustParseAddrPort(addr)); err == nil {
		t.Error("a closed port passed")
	}
}

func TestCheckProbeResponse(t *testing.T) {
	q := new(dns.Msg)
	q.SetQuestion("cluster.local.", dns.TypeSOA)
	ok := new(dns.Msg)
	ok.SetRcode(q, dns.RcodeServerFailure)
	wrongID := ok.Copy()
	wrongID.Id = q.Id + 1
	wrongQ := ok.Copy()
	wrongQ.Question[0].Name = "example.org."
	notResponse := q.Copy()
	upper := ok.Copy()
	upper.Question[0].Name = "CLUSTER.local."
	for _, tc := range []struct {
		name string
		r    *dns.Msg
		ok   bool
	}{
		{"SERVFAIL", ok, true}, {"0x20 case", upper, true}, {"nil", nil, false},
		{"wrong ID", wrongID, false}, {"wrong question", wrongQ, false}, {"query", notResponse, false},
	} {
		if err := CheckProbeResponse(q, tc.r); (err == nil) != tc.ok {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}

// onceHook returns a hook that runs fn the first time only.
func onceHook(fn func()) func() {
	var done atomic.Bool
	return func() {
		if done.CompareAndSwap(false, true) {
			fn()
		}
	}
}

// TestGuardRaceWithReclaim: the cache takes the node back at the worst moment for the guard, after the
// guard decided to take the jumps out and before it does. The node must end as the cache left it (jumps
// and the kube-dns ClusterIP in place, no divert), not with neither the cache's jumps nor the guard's
// divert.
func TestGuardRaceWithReclaim(t *testing.T) {
	inNamespace(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		r := e.reconciler()
		claim := Claim{Addresses: []netip.Addr{addrA, guardClusterIP}}
		e.acquire(r, claim)
		eps := rules.Endpoints(claim.Addresses, 53, nil)
		g := e.guard(&fakeCache{})
		reclaim := func() {
			if err := r.Reclaim(ctx); err != nil {
				t.Errorf("Reclaim: %v", err)
			}
		}
		cacheOwnsTheNode := func(when string) {
			t.Helper()
			e.expectRules(eps)
			e.expectLinkAddrs(DefaultInterface, addrA, guardClusterIP)
			if _, ok := e.guardChain(); ok {
				t.Errorf("%s: the guard's chain is back", when)
			}
		}

		// While failing open: the divert is written, the jumps not yet out.
		g.beforeJumpRemoval = onceHook(reclaim)
		if err := g.FailOpen(ctx); err != nil && !errors.Is(err, errTakenBack) {
			t.Fatal(err)
		}
		cacheOwnsTheNode("reclaim during the fail-open")

		// While failed open: a recheck found the divert in place (or is about to) and takes the jumps out
		// again.
		g.beforeJumpRemoval = nil
		if err := g.FailOpen(ctx); err != nil {
			t.Fatal(err)
		}
		if e.cacheJumps() {
			t.Fatal("the jumps stayed after a fail-open")
		}
		g.beforeJumpRemoval = onceHook(reclaim)
		g.mu.Lock()
		g.tickLocked(ctx, &guardWatch{}, time.Now())
		g.mu.Unlock()
		cacheOwnsTheNode("reclaim during a recheck")
	})
}

// TestGuardKeepsTheServiceAddressOut: while the node is failed open, the cache's periodic sync does not put
// the kube-dns ClusterIP back, and a guard restarted into a failed-open node takes out the one an earlier
// cache process put back; the cache's reclaim brings it back.
func TestGuardKeepsTheServiceAddressOut(t *testing.T) {
	inNamespaceNFT(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		r := e.reconciler()
		claim := Claim{Addresses: []netip.Addr{addrA, guardClusterIP}}
		e.acquire(r, claim)
		lock := filepath.Join(t.TempDir(), "guard.lock")
		g := e.guard(&fakeCache{}, func(c *GuardConfig) { c.LockPath = lock })
		if err := g.FailOpen(ctx); err != nil {
			t.Fatal(err)
		}
		e.expectLinkAddrs(DefaultInterface, addrA)
		if err := r.Ensure(ctx); err != nil {
			t.Fatal(err)
		}
		e.expectLinkAddrs(DefaultInterface, addrA)
		if st := r.Status(); !st.GuardFailedOpen || slices.Contains(st.Addresses, guardClusterIP) {
			t.Errorf("status while failed open: %+v", st)
		}
		if e.cacheJumps() {
			t.Error("Ensure put the jumps back")
		}
		g.Close()

		// An earlier version of the cache, or an operator, put it back; the restarted guard removes it.
		run(t, "ip", "addr", "add", guardClusterIP.String()+"/32", "dev", DefaultInterface)
		f2 := &fakeCache{}
		g2 := e.guard(f2, func(c *GuardConfig) { c.LockPath = lock })
		e.runGuard(g2)
		waitFor(t, "the restarted guard removes the ClusterIP", eventually, func() bool {
			l, err := netlink.LinkByName(DefaultInterface)
			return err == nil && !slices.Contains(linkAddrs(t, l), guardClusterIP)
		})
		if g2.State() != GuardFailedOpen {
			t.Errorf("restarted guard: %v", g2.State())
		}

		f2.alive.Store(true) // the cache answers again: the guard must not fail it open again
		if err := r.Reclaim(ctx); err != nil {
			t.Fatal(err)
		}
		e.expectLinkAddrs(DefaultInterface, addrA, guardClusterIP)
		e.expectRules(rules.Endpoints(claim.Addresses, 53, nil))

		// EnableRules takes the node back as Reclaim does, the ClusterIP included.
		l := e.acquire(r, Claim{Addresses: []netip.Addr{addrB}, DeferRules: true})
		if err := g2.FailOpen(ctx); err != nil {
			t.Fatal(err)
		}
		e.expectLinkAddrs(DefaultInterface, addrA, addrB)
		if err := l.EnableRules(ctx); err != nil {
			t.Fatal(err)
		}
		e.expectLinkAddrs(DefaultInterface, addrA, addrB, guardClusterIP)
		e.expectRules(rules.Endpoints([]netip.Addr{addrA, addrB, guardClusterIP}, 53, nil))
	})
}
