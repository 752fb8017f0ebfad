//go:build linux

package rules

import (
	"context"
	"net/netip"
	"strings"
	"testing"
)

func testDiverts() []Divert {
	return []Divert{
		{From: netip.MustParseAddr("169.254.20.10"), To: netip.MustParseAddr("10.96.0.11")},
		{From: netip.MustParseAddr("fd00:169:254::10"), To: netip.MustParseAddr("fd00:10:96::b"), Port: 53},
	}
}

func TestGuardRuleset(t *testing.T) {
	rs := Guard(IPv4, testDiverts())
	if err := rs.Validate(); err != nil {
		t.Fatal(err)
	}
	if len(rs.Chains) != 3 || rs.Chains[0].Table != NAT || len(rs.Chains[0].Rules) != 2 {
		t.Fatalf("IPv4 guard ruleset: %+v", rs)
	}
	for i, table := range GuardMarks {
		if c := rs.Chains[1+i]; c.Table != table || c.Name != GuardChain || len(c.Rules) != 0 || len(c.Hooks) != 0 {
			t.Errorf("marker chain %d: %+v, want an empty %s chain in %s with no jump", i, c, GuardChain, table)
		}
	}
	want := `-d 169.254.20.10/32 -p udp -m udp --dport 53 -m comment --comment "nodelocaldns-guard: 169.254.20.10 udp/53 to 10.96.0.11" -j DNAT --to-destination 10.96.0.11:53`
	if got := joinArgs(rs.Chains[0].Rules[0]); got != want {
		t.Errorf("first rule\n%s\nwant\n%s", got, want)
	}
	v6 := Guard(IPv6, testDiverts())
	if got := joinArgs(v6.Chains[0].Rules[1]); !strings.HasSuffix(got, "-j DNAT --to-destination [fd00:10:96::b]:53") {
		t.Errorf("IPv6 rule %s", got)
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
