//go:build linux

package rules

import (
	"context"
	"net/netip"
	"strings"
	"testing"
)

// testDiverts are a fail-open's routes: the IPv4 address over UDP to three endpoints and over TCP to the
// local upstream, the IPv6 one to the upstream.
func testDiverts() []DivertRoute {
	v4, v6 := netip.MustParseAddr("169.254.20.10"), netip.MustParseAddr("fd00:169:254::10")
	return []DivertRoute{
		{From: v4, Port: 53, Protocol: TCP, To: []netip.AddrPort{netip.MustParseAddrPort("10.96.0.11:53")}},
		{From: v4, Port: 53, Protocol: UDP,
			To: []netip.AddrPort{netip.MustParseAddrPort("10.244.2.3:53"), netip.MustParseAddrPort("10.244.1.2:53"), netip.MustParseAddrPort("10.244.3.4:53")}},
		{From: v6, Port: 53, Protocol: UDP, To: []netip.AddrPort{netip.MustParseAddrPort("[fd00:10:96::b]:53")}},
	}
}

func TestGuardRuleset(t *testing.T) {
	routes := testDiverts()
	routes[1].Masquerade = true
	rs := Guard(IPv4, routes)
	if err := rs.Validate(); err != nil {
		t.Fatal(err)
	}
	if len(rs.Chains) != 3 || rs.Chains[0].Table != NAT || len(rs.Chains[0].Rules) != 5 {
		t.Fatalf("IPv4 guard ruleset: %+v", rs)
	}
	for i, table := range GuardMarks {
		if c := rs.Chains[1+i]; c.Table != table || c.Name != GuardChain || len(c.Rules) != 0 || len(c.Hooks) != 0 {
			t.Errorf("marker chain %d: %+v, want an empty %s chain in %s with no jump", i, c, GuardChain, table)
		}
	}
	// UDP first, its endpoints sorted and spread evenly, the last one taking what is left; then TCP.
	want := []string{
		`-s 169.254.20.10/32 -d 169.254.20.10/32 -p udp -m udp --dport 53 -m comment --comment "nodelocaldns-guard: masquerade host lookups of 169.254.20.10 udp/53" -j KUBE-MARK-MASQ`,
		`-d 169.254.20.10/32 -p udp -m udp --dport 53 -m statistic --mode random --probability 0.33333333349 -m comment --comment "nodelocaldns-guard: 169.254.20.10 udp/53 to 10.244.1.2" -j DNAT --to-destination 10.244.1.2:53`,
		`-d 169.254.20.10/32 -p udp -m udp --dport 53 -m statistic --mode random --probability 0.50000000000 -m comment --comment "nodelocaldns-guard: 169.254.20.10 udp/53 to 10.244.2.3" -j DNAT --to-destination 10.244.2.3:53`,
		`-d 169.254.20.10/32 -p udp -m udp --dport 53 -m comment --comment "nodelocaldns-guard: 169.254.20.10 udp/53 to 10.244.3.4" -j DNAT --to-destination 10.244.3.4:53`,
		`-d 169.254.20.10/32 -p tcp -m tcp --dport 53 -m comment --comment "nodelocaldns-guard: 169.254.20.10 tcp/53 to 10.96.0.11" -j DNAT --to-destination 10.96.0.11:53`,
	}
	for i, w := range want {
		if got := joinArgs(rs.Chains[0].Rules[i]); got != w {
			t.Errorf("rule %d\n%s\nwant\n%s", i, got, w)
		}
	}
	v6 := Guard(IPv6, testDiverts())
	if got := joinArgs(v6.Chains[0].Rules[0]); len(v6.Chains[0].Rules) != 1 || !strings.HasSuffix(got, "-j DNAT --to-destination [fd00:10:96::b]:53") {
		t.Errorf("IPv6 rules %v", v6.Chains[0].Rules)
	}
	if empty := Guard(IPv4, nil); len(empty.Chains[0].Rules) != 0 || len(empty.Chains[0].Hooks) != 2 {
		t.Errorf("guard ruleset without diverts: %+v", empty)
	}
}

// TestGuardSyncHasJumpsChainExists writes the guard's nat chain: read back it must compare equal (so a
// second Sync writes nothing), and ChainExists and HasJumps must see it and, after Delete, not.
func TestGuardSyncHasJumpsChainExists(t *testing.T) {
	inNamespace(t, func(t *testing.T, m *Manager) {
		ctx := context.Background()
		for _, fam := range Families {
			rs := Guard(fam, testDiverts())
			if ok, err := m.ChainExists(ctx, fam, NAT, GuardChain); err != nil || ok {
				t.Fatalf("%s: guard chain exists before any sync: %v, %v", fam, ok, err)
			}
			if ok, err := m.HasJumps(ctx, rs); err != nil || ok {
				t.Fatalf("%s: jumps before any sync: %v, %v", fam, ok, err)
			}
			if _, err := m.Sync(ctx, rs); err != nil {
				t.Fatal(err)
			}
			checkInPlace(t, m, rs)
			if res, err := m.Sync(ctx, rs); err != nil || res.Changed {
				t.Errorf("%s: second sync of the guard chain: %+v, %v", fam, res, err)
			}
			if ok, err := m.ChainExists(ctx, fam, NAT, GuardChain); err != nil || !ok {
				t.Errorf("%s: ChainExists after sync: %v, %v", fam, ok, err)
			}
			if ok, err := m.HasJumps(ctx, rs); err != nil || !ok {
				t.Errorf("%s: HasJumps after sync: %v, %v", fam, ok, err)
			}
			if err := m.RemoveJumps(ctx, rs); err != nil {
				t.Fatal(err)
			}
			if ok, err := m.HasJumps(ctx, rs); err != nil || ok {
				t.Errorf("%s: HasJumps after RemoveJumps: %v, %v", fam, ok, err)
			}
			if err := m.Delete(ctx, rs); err != nil {
				t.Fatal(err)
			}
			if ok, err := m.ChainExists(ctx, fam, NAT, GuardChain); err != nil || ok {
				t.Errorf("%s: ChainExists after Delete: %v, %v", fam, ok, err)
			}
		}
	})
}

// TestRemoveJumpsWhileMarked: the cache's jumps go only while the guard's markers are there; with a marker
// gone (the cache took the node back, or is doing so) they stay.
func TestRemoveJumpsWhileMarked(t *testing.T) {
	inNamespace(t, func(t *testing.T, m *Manager) {
		ctx := context.Background()
		for _, fam := range Families {
			cache := testRuleset(fam)
			if _, err := m.Sync(ctx, cache); err != nil {
				t.Fatal(err)
			}
			if marked, removed, err := m.RemoveJumpsWhileMarked(ctx, cache, GuardChain); err != nil || marked || removed {
				t.Errorf("%s, no marker: marked %v, removed %v, %v", fam, marked, removed, err)
			}
			checkInPlace(t, m, cache)

			guard := Guard(fam, testDiverts())
			if _, err := m.Sync(ctx, guard); err != nil {
				t.Fatal(err)
			}
			// Only the filter table marked: the raw one is gone, as when a reclaim is half-way through.
			ipt(t, m, fam, "-t", "raw", "-X", GuardChain)
			if marked, removed, err := m.RemoveJumpsWhileMarked(ctx, cache, GuardChain); err != nil || marked || removed {
				t.Errorf("%s, raw marker gone: marked %v, removed %v, %v", fam, marked, removed, err)
			}
			checkInPlace(t, m, cache)

			if _, err := m.Sync(ctx, guard); err != nil {
				t.Fatal(err)
			}
			if marked, removed, err := m.RemoveJumpsWhileMarked(ctx, cache, GuardChain); err != nil || !marked || !removed {
				t.Errorf("%s, marked: marked %v, removed %v, %v", fam, marked, removed, err)
			}
			if has, err := m.HasJumps(ctx, cache); err != nil || has {
				t.Errorf("%s: jumps after the removal: %v, %v", fam, has, err)
			}
			if marked, removed, err := m.RemoveJumpsWhileMarked(ctx, cache, GuardChain); err != nil || !marked || removed {
				t.Errorf("%s, marked, no jumps left: marked %v, removed %v, %v", fam, marked, removed, err)
			}
			for _, rs := range []Ruleset{guard, cache} {
				if err := m.Delete(ctx, rs); err != nil {
					t.Fatal(err)
				}
			}
		}
	})
}

// TestRewriteGuardWhileMarked: the guard's nat chain follows new routes in place, reads back as written (so
// that a Sync after it changes nothing), and is not created again once the cache deleted it.
func TestRewriteGuardWhileMarked(t *testing.T) {
	inNamespace(t, func(t *testing.T, m *Manager) {
		ctx := context.Background()
		rs := Guard(IPv4, testDiverts())
		if _, err := m.Sync(ctx, rs); err != nil {
			t.Fatal(err)
		}
		moved := testDiverts()
		moved[1].To = moved[1].To[:2]
		if ok, err := m.RewriteGuardWhileMarked(ctx, IPv4, moved); err != nil || !ok {
			t.Fatalf("rewrite: %v, %v", ok, err)
		}
		checkInPlace(t, m, Guard(IPv4, moved))
		if res, err := m.Sync(ctx, Guard(IPv4, moved)); err != nil || res.Changed {
			t.Errorf("a sync after the rewrite changed %v (%v): the rules do not read back as written", res.RewrittenChains, err)
		}
		if err := m.Delete(ctx, rs); err != nil {
			t.Fatal(err)
		}
		if ok, err := m.RewriteGuardWhileMarked(ctx, IPv4, moved); err != nil || ok {
			t.Fatalf("rewrite after the chain went: %v, %v", ok, err)
		}
		if ok, err := m.ChainExists(ctx, IPv4, NAT, GuardChain); err != nil || ok {
			t.Errorf("the rewrite created the chain again: %v, %v", ok, err)
		}
	})
}
