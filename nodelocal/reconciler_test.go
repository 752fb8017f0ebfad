//go:build linux

package nodelocal

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/nodelocaldns/nodelocaldns/internal/netnstest"
	"github.com/nodelocaldns/nodelocaldns/nodelocal/internal/link"
	"github.com/nodelocaldns/nodelocaldns/nodelocal/internal/nodelock"
	"github.com/nodelocaldns/nodelocaldns/nodelocal/internal/rules"
)

var dualStack = Claim{Addresses: []netip.Addr{addrA, addrV6}, ExtraTCPPorts: []uint16{8080}}

func TestFirstSyncDualStack(t *testing.T) {
	inNamespace(t, func(t *testing.T, e *env) {
		r := e.reconciler()
		e.acquire(r, dualStack)
		e.expectLinkAddrs(DefaultInterface, addrA, addrV6)
		eps := rules.Endpoints(dualStack.Addresses, 53, dualStack.ExtraTCPPorts)
		e.expectRules(eps)

		s := r.Status()
		if s.Backend != string(e.mode) || !s.RulesPresent || s.Rules != 2*(3*2*2+4) || s.Leases != 1 || s.LastError != nil || s.LastSync.IsZero() {
			t.Errorf("status %+v", s)
		}
		if !reflect.DeepEqual(s.Addresses, []netip.Addr{addrA, addrV6}) || !reflect.DeepEqual(s.RuleAddresses, []netip.Addr{addrA, addrV6}) {
			t.Errorf("status addresses %v, rule addresses %v", s.Addresses, s.RuleAddresses)
		}
		if e.log.count("using rules backend "+string(e.mode)) != 1 {
			t.Errorf("the backend is not logged once")
		}
	})
}

func TestResyncIsIdempotent(t *testing.T) {
	inNamespace(t, func(t *testing.T, e *env) {
		r := e.reconciler()
		e.acquire(r, dualStack)
		after1 := e.tables()
		for i := range 100 {
			if err := r.Ensure(context.Background()); err != nil {
				t.Fatalf("sync %d: %v", i+2, err)
			}
		}
		after100 := e.tables()
		if !reflect.DeepEqual(after1, after100) {
			t.Errorf("100 syncs changed the rules:\nafter 1: %v\nafter 100: %v", after1, after100)
		}
		n := 0
		for _, st := range after100 {
			n += st.Len()
		}
		if n != r.Status().Rules {
			t.Errorf("%d rules on the node, status says %d", n, r.Status().Rules)
		}
		if c := e.log.count("repaired"); c != 0 {
			t.Errorf("idle syncs logged %d repairs", c)
		}
	})
}

func TestRepairs(t *testing.T) {
	inNamespace(t, func(t *testing.T, e *env) {
		r := e.reconciler()
		e.acquire(r, dualStack)
		eps := rules.Endpoints(dualStack.Addresses, 53, dualStack.ExtraTCPPorts)
		damages := []struct {
			name string
			do   func()
		}{
			{"deleted jump", func() { e.iptables(rules.IPv4, "-t", "raw", "-D", "PREROUTING", "1") }},
			{"deleted IPv6 jump", func() { e.iptables(rules.IPv6, "-t", "filter", "-D", "OUTPUT", "1") }},
			{"deleted rule", func() { e.iptables(rules.IPv4, "-t", "filter", "-D", rules.DefaultChain, "2") }},
			{"flushed chain", func() { e.iptables(rules.IPv6, "-t", "raw", "-F", rules.DefaultChain) }},
			{"deleted address", func() { run(t, "ip", "addr", "del", addrA.String()+"/32", "dev", DefaultInterface) }},
			{"deleted IPv6 address", func() { run(t, "ip", "addr", "del", addrV6.String()+"/128", "dev", DefaultInterface) }},
			{"link down", func() { run(t, "ip", "link", "set", DefaultInterface, "down") }},
			{"deleted link", func() { run(t, "ip", "link", "del", DefaultInterface) }},
		}
		for _, d := range damages {
			d.do()
			if err := r.Ensure(context.Background()); err != nil {
				t.Fatalf("%s: %v", d.name, err)
			}
			e.expectLinkAddrs(DefaultInterface, addrA, addrV6)
			e.expectRules(eps)
		}
		if e.log.count("repaired IPv4 rules") != 2 || e.log.count("repaired IPv6 rules") != 2 {
			t.Errorf("repairs not logged as such")
		}
	})
}

// TestRepairSkipsUnchangedRules: on iptables-nft a repair that finds the ruleset's generation where the last
// one left it does not read the rules again, and a change by anyone moves the generation, so the next repair
// reads and repairs. iptables-legacy has no generation: every repair reads.
func TestRepairSkipsUnchangedRules(t *testing.T) {
	inNamespace(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		r := e.reconciler()
		e.acquire(r, dualStack)
		eps := rules.Endpoints(dualStack.Addresses, 53, dualStack.ExtraTCPPorts)
		for range 2 { // the second finds everything in place, writes nothing, and records the generation
			if err := r.Ensure(ctx); err != nil {
				t.Fatal(err)
			}
		}
		n := r.Status().RuleSyncs
		if err := r.Ensure(ctx); err != nil {
			t.Fatal(err)
		}
		want := n + 1
		if e.mode == rules.NFT {
			want = n
		}
		if got := r.Status().RuleSyncs; got != want {
			t.Errorf("%s: an idle repair made %d rules syncs, want %d", e.mode, got-n, want-n)
		}
		e.iptables(rules.IPv4, "-t", "raw", "-D", "PREROUTING", "1")
		if err := r.Ensure(ctx); err != nil {
			t.Fatal(err)
		}
		e.expectRules(eps)
		if r.Status().RuleSyncs == want {
			t.Error("the repair after a deleted jump did not read the rules")
		}
	})
}

func TestTeardownTwice(t *testing.T) {
	inNamespace(t, func(t *testing.T, e *env) {
		for _, fam := range rules.Families {
			e.restore(fam, foreignRules(fam, 20))
		}
		foreign := e.ruleCount()
		r := e.reconciler()
		lease := e.acquire(r, dualStack)
		for i := range 2 {
			if err := r.Teardown(context.Background()); err != nil {
				t.Fatalf("teardown %d: %v", i+1, err)
			}
		}
		e.expectNoLink(DefaultInterface)
		e.expectRules(nil)
		if n := e.ruleCount(); n != foreign {
			t.Errorf("%d rules after teardown, %d foreign ones before", n, foreign)
		}
		if s := r.Status(); s.Leases != 0 || s.RulesPresent || len(s.Addresses) != 0 || s.LastError != nil {
			t.Errorf("status after teardown: %+v", s)
		}
		if err := lease.Release(context.Background()); err != nil {
			t.Errorf("Release after Teardown: %v", err)
		}
		if err := lease.EnableRules(context.Background()); !errors.Is(err, ErrReleased) {
			t.Errorf("EnableRules after Teardown: %v", err)
		}
		// Ensure without leases leaves the node alone.
		if err := r.Ensure(context.Background()); err != nil {
			t.Fatal(err)
		}
		e.expectNoLink(DefaultInterface)
		// A new lease starts afresh.
		e.acquire(r, dualStack)
		e.expectRules(rules.Endpoints(dualStack.Addresses, 53, dualStack.ExtraTCPPorts))
	})
}

func TestLastReleaseTearsDown(t *testing.T) {
	inNamespaceNFT(t, func(t *testing.T, e *env) {
		r := e.reconciler()
		a := e.acquire(r, Claim{Addresses: []netip.Addr{addrA}})
		b := e.acquire(r, Claim{Addresses: []netip.Addr{addrA, addrV6}})
		if err := b.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
		e.expectLinkAddrs(DefaultInterface, addrA)
		e.expectRules(rules.Endpoints([]netip.Addr{addrA}, 53, nil))
		if err := a.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := a.Release(context.Background()); err != nil {
			t.Errorf("second Release: %v", err)
		}
		e.expectNoLink(DefaultInterface)
		e.expectRules(nil)
	})
}

func TestLeasesPhasesAndUnion(t *testing.T) {
	inNamespaceNFT(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		r := e.reconciler()
		// A server block: addresses at setup, rules once it answers.
		a := e.acquire(r, Claim{Addresses: []netip.Addr{addrA}, DeferRules: true})
		e.expectLinkAddrs(DefaultInterface, addrA)
		e.expectRules(nil)
		if err := a.EnableRules(ctx); err != nil {
			t.Fatal(err)
		}
		e.expectRules(rules.Endpoints([]netip.Addr{addrA}, 53, nil))

		// A second block on other addresses and an extra port, rules at once.
		b := e.acquire(r, Claim{Addresses: []netip.Addr{addrB, addrV6}, DNSPort: 5353, ExtraTCPPorts: []uint16{8080}})
		e.expectLinkAddrs(DefaultInterface, addrA, addrB, addrV6)
		want := append(rules.Endpoints([]netip.Addr{addrA}, 53, nil), rules.Endpoints([]netip.Addr{addrB, addrV6}, 5353, []uint16{8080})...)
		e.expectRules(rules.SortEndpoints(want))

		// A reload moves block a to another address: the old one leaves the link, nothing is duplicated.
		addrA2 := netip.MustParseAddr("169.254.20.12")
		if err := a.Update(ctx, Claim{Addresses: []netip.Addr{addrA2}}); err != nil {
			t.Fatal(err)
		}
		e.expectLinkAddrs(DefaultInterface, addrA2, addrB, addrV6)
		want = append(rules.Endpoints([]netip.Addr{addrA2}, 53, nil), rules.Endpoints([]netip.Addr{addrB, addrV6}, 5353, []uint16{8080})...)
		e.expectRules(rules.SortEndpoints(want))

		// Block b's rules go (the IPv6 chains with them); its addresses stay until it is released.
		if err := b.DisableRules(ctx); err != nil {
			t.Fatal(err)
		}
		e.expectRules(rules.Endpoints([]netip.Addr{addrA2}, 53, nil))
		e.expectLinkAddrs(DefaultInterface, addrA2, addrB, addrV6)
		if err := b.Release(ctx); err != nil {
			t.Fatal(err)
		}
		e.expectLinkAddrs(DefaultInterface, addrA2)
		if got := r.Status().Leases; got != 1 {
			t.Errorf("%d leases", got)
		}
		if c := a.Claim(); c.DNSPort != 53 || c.DeferRules != true {
			t.Errorf("claim %+v", c)
		}
	})
}

func TestReloadOverlap(t *testing.T) {
	// CoreDNS starts the new instance's blocks before it stops the old ones: leases of both overlap, and
	// nothing may be torn down or duplicated on the way.
	inNamespaceNFT(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		r := e.reconciler()
		old := e.acquire(r, dualStack)
		before := e.tables()
		c := dualStack
		c.DeferRules = true
		renewed := e.acquire(r, c)
		if err := renewed.EnableRules(ctx); err != nil {
			t.Fatal(err)
		}
		if err := old.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if after := e.tables(); !reflect.DeepEqual(before, after) {
			t.Errorf("reload changed the rules:\n%v\n%v", before, after)
		}
		e.expectLinkAddrs(DefaultInterface, addrA, addrV6)
		if c := e.log.count("created link"); c != 1 {
			t.Errorf("link created %d times", c)
		}
	})
}

func TestBridgeFallbackLoggedOnce(t *testing.T) {
	inNamespaceNFT(t, func(t *testing.T, e *env) {
		var add link.AddFunc
		if netnstest.KernelHasDummy(t) {
			add = func(l netlink.Link) error {
				if l.Type() == "dummy" {
					return unix.EOPNOTSUPP
				}
				return netlink.LinkAdd(l)
			}
		} else {
			t.Log("the kernel has no dummy link type: this is the real fallback")
		}
		r := e.reconciler(func(c *Config) { c.AddLink = add })
		e.acquire(r, dualStack)
		if s := r.Status(); s.LinkKind != "bridge" || !s.LinkOwned {
			t.Errorf("status %+v", s)
		}
		run(t, "ip", "link", "del", DefaultInterface)
		if err := r.Ensure(context.Background()); err != nil {
			t.Fatal(err)
		}
		e.expectLinkAddrs(DefaultInterface, addrA, addrV6)
		if c := e.log.count("no dummy link type"); c != 1 {
			t.Errorf("fallback logged %d times, want once", c)
		}
	})
}

func TestDummyPath(t *testing.T) {
	inNamespaceNFT(t, func(t *testing.T, e *env) {
		var add link.AddFunc
		wantKind := "dummy"
		if !netnstest.KernelHasDummy(t) {
			wantKind = "ifb"
			add = func(l netlink.Link) error {
				if _, ok := l.(*netlink.Dummy); !ok {
					return fmt.Errorf("test: asked for a %s link, only dummy expected", l.Type())
				}
				return netlink.LinkAdd(&netlink.Ifb{LinkAttrs: *l.Attrs()})
			}
			t.Log("the kernel has no dummy link type: a stand-in creates an ifb link when asked for a dummy")
		}
		r := e.reconciler(func(c *Config) { c.AddLink = add })
		e.acquire(r, dualStack)
		if s := r.Status(); s.LinkKind != wantKind || !s.LinkOwned {
			t.Errorf("status %+v", s)
		}
		if c := e.log.count("no dummy link type"); c != 0 {
			t.Errorf("fallback logged on the dummy path")
		}
		e.expectLinkAddrs(DefaultInterface, addrA, addrV6)
		if err := r.Teardown(context.Background()); err != nil {
			t.Fatal(err)
		}
		e.expectNoLink(DefaultInterface)
	})
}

func TestConcurrentEnsure(t *testing.T) {
	inNamespace(t, func(t *testing.T, e *env) {
		r := e.reconciler()
		e.acquire(r, dualStack)
		single := e.tables()
		// Damage first, so that the racing syncs have something to repair.
		e.iptables(rules.IPv4, "-t", "raw", "-F", rules.DefaultChain)
		e.iptables(rules.IPv6, "-t", "filter", "-D", "INPUT", "1")
		start := make(chan struct{})
		errs := make(chan error, 8)
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				<-start
				errs <- r.Ensure(context.Background())
			})
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Error(err)
			}
		}
		if got := e.tables(); !reflect.DeepEqual(got, single) {
			t.Errorf("after 8 concurrent syncs:\n%v\nwant\n%v", got, single)
		}
	})
}

func TestConcurrentLeases(t *testing.T) {
	inNamespaceNFT(t, func(t *testing.T, e *env) {
		r := e.reconciler()
		var (
			wg     sync.WaitGroup
			mu     sync.Mutex
			leases []*Lease
			addrs  []netip.Addr
		)
		for i := range 8 {
			a := netip.AddrFrom4([4]byte{169, 254, 20, byte(10 + i)})
			addrs = append(addrs, a)
			wg.Go(func() {
				l, err := r.Acquire(context.Background(), Claim{Addresses: []netip.Addr{a, addrV6}, DeferRules: true})
				if err != nil {
					t.Error(err)
					return
				}
				if err := l.EnableRules(context.Background()); err != nil {
					t.Error(err)
				}
				mu.Lock()
				leases = append(leases, l)
				mu.Unlock()
			})
		}
		wg.Wait()
		e.expectLinkAddrs(DefaultInterface, append(addrs, addrV6)...)
		e.expectRules(rules.Endpoints(append(addrs, addrV6), 53, nil))
		for _, l := range leases {
			wg.Go(func() {
				if err := l.Release(context.Background()); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		e.expectNoLink(DefaultInterface)
		e.expectRules(nil)
	})
}

func TestForeignRuleSet10k(t *testing.T) {
	inNamespace(t, func(t *testing.T, e *env) {
		for _, fam := range rules.Families {
			e.restore(fam, foreignRules(fam, 10000))
		}
		foreign := e.ruleCount()
		if foreign < 4*10000 {
			t.Fatalf("only %d foreign rules loaded", foreign)
		}
		r := e.reconciler()
		e.acquire(r, dualStack)
		eps := rules.Endpoints(dualStack.Addresses, 53, dualStack.ExtraTCPPorts)
		e.expectRules(eps)
		e.iptables(rules.IPv4, "-t", "filter", "-D", "INPUT", "1")
		if err := r.Ensure(context.Background()); err != nil {
			t.Fatal(err)
		}
		e.expectRules(eps)
		if n := e.ruleCount(); n != foreign+r.Status().Rules {
			t.Errorf("%d rules, want %d foreign + %d ours", n, foreign, r.Status().Rules)
		}
		if err := r.Teardown(context.Background()); err != nil {
			t.Fatal(err)
		}
		if n := e.ruleCount(); n != foreign {
			t.Errorf("%d rules after teardown, want the %d foreign ones", n, foreign)
		}
		e.expectRules(nil)
	})
}

func TestNoInterfaceAndNoRules(t *testing.T) {
	t.Run("no_interface", func(t *testing.T) {
		inNamespaceNFT(t, func(t *testing.T, e *env) {
			r := e.reconciler(func(c *Config) { c.NoInterface = true })
			e.acquire(r, dualStack)
			e.expectNoLink(DefaultInterface)
			e.expectRules(rules.Endpoints(dualStack.Addresses, 53, dualStack.ExtraTCPPorts))
			if err := r.Teardown(context.Background()); err != nil {
				t.Fatal(err)
			}
			e.expectRules(nil)
		})
	})
	t.Run("no_rules", func(t *testing.T) {
		inNamespaceNFT(t, func(t *testing.T, e *env) {
			r := e.reconciler(func(c *Config) { c.NoRules = true; c.Interface = "nl-other" })
			e.acquire(r, dualStack)
			e.expectLinkAddrs("nl-other", addrA, addrV6)
			e.expectRules(nil)
			if s := r.Status(); s.Backend != "" || s.RulesPresent {
				t.Errorf("status %+v", s)
			}
			if err := r.Teardown(context.Background()); err != nil {
				t.Fatal(err)
			}
			e.expectNoLink("nl-other")
		})
	})
}

func TestLeftoversOfEarlierRun(t *testing.T) {
	inNamespaceNFT(t, func(t *testing.T, e *env) {
		// An earlier process served both families and died without tearing down.
		first := e.reconciler()
		e.acquire(first, dualStack)
		if err := first.Close(); err != nil {
			t.Fatal(err)
		}
		// The new one serves IPv4 only: it adopts the link and removes the IPv6 rules nobody claims.
		r := e.reconciler()
		e.acquire(r, Claim{Addresses: []netip.Addr{addrA}})
		e.expectRules(rules.Endpoints([]netip.Addr{addrA}, 53, nil))
		if s := r.Status(); !s.LinkOwned || len(s.ForeignAddresses) != 1 {
			t.Errorf("status %+v", s)
		}
		if err := r.Teardown(context.Background()); err != nil {
			t.Fatal(err)
		}
		e.expectNoLink(DefaultInterface)
	})
}

func TestLockContentionIsClassified(t *testing.T) {
	runIn(t, rules.Legacy, func(t *testing.T, e *env) {
		release := holdXtablesLock(t)
		defer release()
		r := e.reconciler(func(c *Config) { c.LockWait = time.Second })
		_, err := r.Acquire(context.Background(), dualStack)
		if KindOf(err) != KindIPTablesLock {
			t.Fatalf("Acquire while the xtables lock is held: kind %q: %v", KindOf(err), err)
		}
		// The failed Acquire left nothing behind.
		e.expectNoLink(DefaultInterface)
		release()
		e.acquire(r, dualStack)
	})
}

func TestTeardownIsBoundedByContext(t *testing.T) {
	runIn(t, rules.Legacy, func(t *testing.T, e *env) {
		r := e.reconciler(func(c *Config) { c.LockWait = time.Hour })
		e.acquire(r, dualStack)
		release := holdXtablesLock(t)
		defer release()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		start := time.Now()
		err := r.Teardown(ctx)
		if err == nil {
			t.Fatal("Teardown succeeded while the xtables lock was held")
		}
		// Far from the hour-long lock wait: the deadline ended it.
		if took := time.Since(start); took > time.Minute {
			t.Errorf("Teardown took %v with a 2s deadline", took)
		}
		t.Log(err)
		release()
		if err := r.Teardown(context.Background()); err != nil {
			t.Fatalf("Teardown once the lock is free: %v", err)
		}
		e.expectRules(nil)
		e.expectNoLink(DefaultInterface)
	})
}

func TestLinkErrorsAreClassified(t *testing.T) {
	inNamespaceNFT(t, func(t *testing.T, e *env) {
		r := e.reconciler(func(c *Config) { c.AddLink = func(netlink.Link) error { return unix.EPERM } })
		_, err := r.Acquire(context.Background(), dualStack)
		if KindOf(err) != KindInterfaceAdd || !strings.Contains(err.Error(), "create dummy link nodelocaldns") {
			t.Errorf("Acquire with a failing link: kind %q: %v", KindOf(err), err)
		}
		if s := r.Status(); s.LastError == nil || s.Leases != 0 {
			t.Errorf("status %+v", s)
		}
	})
}

func TestRunKeepsRepairing(t *testing.T) {
	inNamespaceNFT(t, func(t *testing.T, e *env) {
		r := e.reconciler()
		e.acquire(r, dualStack)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx, 50*time.Millisecond) }()
		run(t, "ip", "link", "del", DefaultInterface)
		e.iptables(rules.IPv4, "-t", "raw", "-D", "PREROUTING", "1")
		deadline := time.Now().Add(20 * time.Second)
		for e.log.count("repaired IPv4 rules") == 0 || e.log.count("created link") < 2 {
			if time.Now().After(deadline) {
				t.Fatal("Run did not repair within 20s")
			}
			time.Sleep(20 * time.Millisecond)
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		e.expectLinkAddrs(DefaultInterface, addrA, addrV6)
		e.expectRules(rules.Endpoints(dualStack.Addresses, 53, dualStack.ExtraTCPPorts))
	})
}

func TestSecondInstanceFailsFast(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.lock")
	first, err := New(Config{LockPath: path, NoRules: true, NoInterface: true})
	if err != nil {
		t.Fatal(err)
	}
	_, err = New(Config{LockPath: path})
	var held *nodelock.HeldError
	if KindOf(err) != KindNodeLock || !errors.As(err, &held) || !strings.Contains(err.Error(), fmt.Sprintf("pid %d", os.Getpid())) {
		t.Fatalf("second New: kind %q: %v", KindOf(err), err)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	if err := first.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := first.Ensure(context.Background()); !errors.Is(err, ErrClosed) {
		t.Errorf("Ensure after Close: %v", err)
	}
	if _, err := first.Acquire(context.Background(), dualStack); !errors.Is(err, ErrClosed) {
		t.Errorf("Acquire after Close: %v", err)
	}
	again, err := New(Config{LockPath: path})
	if err != nil {
		t.Fatalf("New after Close: %v", err)
	}
	again.Close()
}

func TestConfigErrors(t *testing.T) {
	lock := filepath.Join(t.TempDir(), "node.lock")
	for _, cfg := range []Config{
		{Interface: "far-too-long-a-name", LockPath: lock},
		{Interface: "a/b", LockPath: lock},
		{Backend: "iptables", LockPath: lock},
		{LockWait: -time.Second, LockPath: lock},
	} {
		if _, err := New(cfg); KindOf(err) != KindConfig {
			t.Errorf("New(%+v): kind %q: %v", cfg, KindOf(err), err)
		}
	}
	r, err := New(Config{LockPath: lock})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for _, c := range []Claim{
		{},
		{Addresses: []netip.Addr{{}}},
		{Addresses: []netip.Addr{netip.MustParseAddr("0.0.0.0")}},
		{Addresses: []netip.Addr{netip.MustParseAddr("ff02::1")}},
		{Addresses: []netip.Addr{netip.MustParseAddr("fe80::1%eth0")}},
		{Addresses: []netip.Addr{addrA}, ExtraTCPPorts: []uint16{0}},
	} {
		if _, err := r.Acquire(context.Background(), c); KindOf(err) != KindConfig {
			t.Errorf("Acquire(%+v): kind %q: %v", c, KindOf(err), err)
		}
	}
	if err := r.Run(context.Background(), 0); KindOf(err) != KindConfig {
		t.Errorf("Run with interval 0: %v", err)
	}
	if s := r.Status(); s.Leases != 0 || !s.LastAttempt.IsZero() {
		t.Errorf("rejected claims changed the status: %+v", s)
	}
}

func TestClaimNormalize(t *testing.T) {
	c, err := Claim{
		Addresses:     []netip.Addr{addrV6, netip.MustParseAddr("::ffff:169.254.20.10"), addrA},
		ExtraTCPPorts: []uint16{9153, 8080, 9153},
	}.normalize()
	if err != nil {
		t.Fatal(err)
	}
	want := Claim{Addresses: []netip.Addr{addrA, addrV6}, DNSPort: 53, ExtraTCPPorts: []uint16{8080, 9153}}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("normalize = %+v, want %+v", c, want)
	}
}

func TestKinds(t *testing.T) {
	lockErr := &rules.CommandError{ExitStatus: 4, Stderr: "Another app is currently holding the xtables lock."}
	tests := []struct {
		err  error
		want Kind
	}{
		{rulesError("sync", fmt.Errorf("restore: %w", lockErr)), KindIPTablesLock},
		{rulesError("sync", &rules.CommandError{ExitStatus: 1}), KindIPTables},
		{linkError("ensure", &link.Error{Phase: link.Change, Op: "add", Err: unix.EPERM}), KindInterfaceAdd},
		{linkError("ensure", &link.Error{Phase: link.Check, Op: "list", Err: unix.EPERM}), KindInterfaceCheck},
		{errors.New("other"), ""},
	}
	for _, tc := range tests {
		if got := KindOf(tc.err); got != tc.want {
			t.Errorf("KindOf(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
	joined := errors.Join(tests[2].err, tests[0].err, tests[3].err, tests[1].err, tests[0].err)
	if got := Kinds(fmt.Errorf("wrapped: %w", joined)); !reflect.DeepEqual(got, []Kind{KindInterfaceAdd, KindIPTablesLock, KindInterfaceCheck, KindIPTables}) {
		t.Errorf("Kinds = %v", got)
	}
}

// holdXtablesLock takes the private xtables lock file netnstest gave this child and returns its release.
func holdXtablesLock(t *testing.T) func() {
	t.Helper()
	f, err := os.OpenFile(os.Getenv(netnstest.EnvXtablesLock), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	return func() { once.Do(func() { f.Close() }) }
}
