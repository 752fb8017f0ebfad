//go:build linux

package rules

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/netnstest"
	"github.com/nodelocaldns/nodelocaldns/internal/privtest"
)

// inNamespace runs fn once per backend, each time in a network namespace of its own.
func inNamespace(t *testing.T, fn func(t *testing.T, m *Manager)) {
	for _, mode := range []Mode{NFT, Legacy} {
		t.Run(string(mode), func(t *testing.T) {
			privtest.RequirePrivileged(t, append([]string{"ip"}, privtest.IptablesCommands(string(mode))...)...)
			if !netnstest.Run(t) {
				return
			}
			b, err := NewBackend(mode, "test")
			if err != nil {
				t.Fatal(err)
			}
			fn(t, NewManager(b, ManagerOptions{LockWait: 2 * time.Second}))
		})
	}
}

func testRuleset(fam Family) Ruleset {
	addrs := []netip.Addr{netip.MustParseAddr("169.254.20.10"), netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fd00::10")}
	return NodeCache(fam, NodeCacheSpec{Endpoints: Endpoints(addrs, 53, []uint16{8080})})
}

// ipt runs the backend's iptables (or, with save, iptables-save) for fam and fails the test on error.
func ipt(t *testing.T, m *Manager, fam Family, args ...string) string {
	t.Helper()
	tools, err := m.backend.Tools(fam)
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(tools.IPTables, append([]string{"-w", "5"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v: %s", tools.IPTables, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func restore(t *testing.T, m *Manager, fam Family, payload string) {
	t.Helper()
	tools, err := m.backend.Tools(fam)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(tools.Restore, "-w", "5", "--noflush")
	cmd.Stdin = strings.NewReader(payload)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", tools.Restore, err, out)
	}
}

// checkInPlace verifies that the node holds exactly rs: every chain with its rules, one jump per hook, at
// position 1, and every rule carrying a comment that names the project.
func checkInPlace(t *testing.T, m *Manager, rs Ruleset) {
	t.Helper()
	ctx := context.Background()
	for _, c := range rs.Chains {
		st, err := m.Inspect(ctx, rs.Family, c.Table)
		if err != nil {
			t.Fatal(err)
		}
		if !sameRules(st.Chains[c.Name], c.Rules) {
			t.Errorf("%s %s/%s holds\n%q\nwant\n%q", rs.Family, c.Table, c.Name, st.Chains[c.Name], c.Rules)
		}
		var want []JumpPosition
		for _, h := range c.Hooks {
			want = append(want, JumpPosition{From: h, Position: 1})
		}
		got := st.JumpsTo(c.Name)
		slices.SortFunc(got, func(a, b JumpPosition) int { return strings.Compare(a.From, b.From) })
		slices.SortFunc(want, func(a, b JumpPosition) int { return strings.Compare(a.From, b.From) })
		if !slices.Equal(got, want) {
			t.Errorf("%s %s: jumps to %s at %v, want %v", rs.Family, c.Table, c.Name, got, want)
		}
		ours := slices.Clone(st.Chains[c.Name])
		if len(c.Hooks) > 0 {
			ours = append(ours, c.Jump())
		}
		for _, r := range ours {
			if i := slices.Index(r, "--comment"); i < 0 || !strings.HasPrefix(r[i+1], DefaultComment) {
				t.Errorf("rule without project comment: %q", r)
			}
		}
	}
}

func TestSyncFromScratchThenIdle(t *testing.T) {
	inNamespace(t, func(t *testing.T, m *Manager) {
		ctx := context.Background()
		for _, fam := range Families {
			rs := testRuleset(fam)
			res, err := m.Sync(ctx, rs)
			if err != nil {
				t.Fatal(err)
			}
			if !res.Changed || len(res.RewrittenChains) != 2 || len(res.RepairedJumps) != 4 {
				t.Errorf("%s first sync: %+v", fam, res)
			}
			checkInPlace(t, m, rs)
			for i := range 3 {
				res, err = m.Sync(ctx, rs)
				if err != nil {
					t.Fatal(err)
				}
				if res.Changed {
					t.Errorf("%s sync %d rewrote a ruleset in place: %+v", fam, i+2, res)
				}
			}
			checkInPlace(t, m, rs)
		}
	})
}

func TestSyncRepairs(t *testing.T) {
	rs := testRuleset(IPv4)
	// foreignKept checks that a chain holds our jump and then exactly the foreign rules given.
	foreignKept := func(table Table, chain string, foreign ...Rule) func(t *testing.T, m *Manager) {
		return func(t *testing.T, m *Manager) {
			st, err := m.Inspect(context.Background(), IPv4, table)
			if err != nil {
				t.Fatal(err)
			}
			got := st.Chains[chain]
			if len(got) != 1+len(foreign) || !sameRules(got[1:], foreign) {
				t.Errorf("%s %s after repair: %q, want our jump then %q", table, chain, got, foreign)
			}
		}
	}
	damages := []struct {
		name  string
		do    func(t *testing.T, m *Manager)
		after func(t *testing.T, m *Manager)
	}{
		{"deleted jump", func(t *testing.T, m *Manager) { ipt(t, m, IPv4, "-t", "raw", "-D", "PREROUTING", "1") }, nil},
		{"deleted rule", func(t *testing.T, m *Manager) { ipt(t, m, IPv4, "-t", "filter", "-D", DefaultChain, "3") }, nil},
		{"flushed chain", func(t *testing.T, m *Manager) { ipt(t, m, IPv4, "-t", "raw", "-F", DefaultChain) }, nil},
		{"foreign rule added to our chain", func(t *testing.T, m *Manager) {
			ipt(t, m, IPv4, "-t", "filter", "-A", DefaultChain, "-s", "192.0.2.1/32", "-j", "ACCEPT")
		}, nil},
		{"jump pushed down", func(t *testing.T, m *Manager) {
			ipt(t, m, IPv4, "-t", "filter", "-I", "INPUT", "1", "-s", "192.0.2.1/32", "-j", "DROP")
		}, foreignKept(Filter, "INPUT", Rule{"-s", "192.0.2.1/32", "-j", "DROP"})},
		{"duplicate jump", func(t *testing.T, m *Manager) {
			ipt(t, m, IPv4, "-t", "raw", "-I", "OUTPUT", "1", "-s", "192.0.2.1/32", "-j", "ACCEPT")
			ipt(t, m, IPv4, "-t", "raw", "-A", "OUTPUT", "-m", "comment", "--comment", "old", "-j", DefaultChain)
		}, foreignKept(Raw, "OUTPUT", Rule{"-s", "192.0.2.1/32", "-j", "ACCEPT"})},
		{"everything deleted", func(t *testing.T, m *Manager) {
			restore(t, m, IPv4, "*raw\n-F PREROUTING\n-F OUTPUT\n-F "+DefaultChain+"\n-X "+DefaultChain+"\nCOMMIT\n*filter\n-F INPUT\n-F OUTPUT\n-F "+DefaultChain+"\n-X "+DefaultChain+"\nCOMMIT\n")
		}, nil},
	}
	inNamespace(t, func(t *testing.T, m *Manager) {
		ctx := context.Background()
		for _, d := range damages {
			if _, err := m.Sync(ctx, rs); err != nil {
				t.Fatal(err)
			}
			d.do(t, m)
			res, err := m.Sync(ctx, rs)
			if err != nil {
				t.Fatalf("%s: %v", d.name, err)
			}
			if !res.Changed {
				t.Errorf("%s: sync did not notice", d.name)
			}
			t.Logf("%s: %+v", d.name, res)
			checkInPlace(t, m, rs)
			if d.after != nil {
				d.after(t, m)
			}
		}
	})
}

func TestSyncFollowsChangedRuleset(t *testing.T) {
	inNamespace(t, func(t *testing.T, m *Manager) {
		ctx := context.Background()
		one := NodeCache(IPv4, NodeCacheSpec{Endpoints: Endpoints([]netip.Addr{netip.MustParseAddr("169.254.20.10")}, 53, nil)})
		two := NodeCache(IPv4, NodeCacheSpec{Endpoints: Endpoints([]netip.Addr{netip.MustParseAddr("169.254.20.10"), netip.MustParseAddr("169.254.20.11")}, 53, nil)})
		for _, rs := range []Ruleset{one, two, one} {
			res, err := m.Sync(ctx, rs)
			if err != nil {
				t.Fatal(err)
			}
			if len(res.RepairedJumps) != 0 && rs.Chains[0].Rules[0][1] != "169.254.20.10/32" {
				t.Errorf("a changed ruleset moved jumps: %+v", res)
			}
			checkInPlace(t, m, rs)
		}
	})
}

func TestDeleteAndRemoveJumps(t *testing.T) {
	inNamespace(t, func(t *testing.T, m *Manager) {
		ctx := context.Background()
		for _, fam := range Families {
			rs := testRuleset(fam)
			foreign := "*raw\n:FOREIGN - [0:0]\n-A FOREIGN -j ACCEPT\n-A PREROUTING -j FOREIGN\nCOMMIT\n"
			restore(t, m, fam, foreign)
			if _, err := m.Sync(ctx, rs); err != nil {
				t.Fatal(err)
			}
			if err := m.RemoveJumps(ctx, rs); err != nil {
				t.Fatal(err)
			}
			for _, c := range rs.Chains {
				st, err := m.Inspect(ctx, fam, c.Table)
				if err != nil {
					t.Fatal(err)
				}
				if j := st.JumpsTo(c.Name); len(j) != 0 {
					t.Errorf("%s %s: jumps left after RemoveJumps: %v", fam, c.Table, j)
				}
				if !sameRules(st.Chains[c.Name], c.Rules) {
					t.Errorf("%s %s: RemoveJumps changed the chain", fam, c.Table)
				}
			}
			if _, err := m.Sync(ctx, rs); err != nil {
				t.Fatal(err)
			}
			checkInPlace(t, m, rs)
			for i := range 2 {
				if err := m.Delete(ctx, rs); err != nil {
					t.Fatalf("%s delete %d: %v", fam, i+1, err)
				}
			}
			for _, table := range []Table{Raw, Filter} {
				st, err := m.Inspect(ctx, fam, table)
				if err != nil {
					t.Fatal(err)
				}
				if st.ChainExists(DefaultChain) || len(st.JumpsTo(DefaultChain)) != 0 {
					t.Errorf("%s %s: left behind: %v", fam, table, st.Chains)
				}
				if table == Raw && (len(st.Chains["FOREIGN"]) != 1 || len(st.Chains["PREROUTING"]) != 1) {
					t.Errorf("%s: foreign rules touched: %v", fam, st.Chains)
				}
			}
		}
	})
}

func TestSyncFailsCleanlyWithoutChangingAnything(t *testing.T) {
	inNamespace(t, func(t *testing.T, m *Manager) {
		ctx := context.Background()
		rs := testRuleset(IPv4)
		if _, err := m.Sync(ctx, rs); err != nil {
			t.Fatal(err)
		}
		ipt(t, m, IPv4, "-t", "raw", "-F", DefaultChain)
		bad := testRuleset(IPv4)
		bad.Chains[0].Rules = append(bad.Chains[0].Rules, Rule{"-m", "nosuchmatch", "-j", "NOTRACK"})
		_, err := m.Sync(ctx, bad)
		if err == nil || !strings.Contains(err.Error(), "nosuchmatch") {
			t.Fatalf("Sync with a bad rule: %v", err)
		}
		st, err := m.Inspect(ctx, IPv4, Raw)
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Chains[DefaultChain]) != 0 {
			t.Errorf("a failed transaction changed the chain: %q", st.Chains[DefaultChain])
		}
	})
}

func TestLockContention(t *testing.T) {
	privtest.RequirePrivileged(t, append([]string{"ip"}, privtest.IptablesCommands(string(Legacy))...)...)
	if !netnstest.Run(t) {
		return
	}
	lockPath := os.Getenv(netnstest.EnvXtablesLock)
	f, err := os.OpenFile(lockPath, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	b, err := NewBackend(Legacy, "test")
	if err != nil {
		t.Fatal(err)
	}
	m := NewManager(b, ManagerOptions{LockWait: time.Second})
	_, err = m.Sync(context.Background(), testRuleset(IPv4))
	if !IsLockContention(err) {
		t.Fatalf("Sync while another holds the xtables lock: %v", err)
	}
	t.Log(err)
}

func TestSyncHonoursContext(t *testing.T) {
	privtest.RequirePrivileged(t, append([]string{"ip"}, privtest.IptablesCommands(string(Legacy))...)...)
	if !netnstest.Run(t) {
		return
	}
	f, err := os.OpenFile(os.Getenv(netnstest.EnvXtablesLock), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	b, err := NewBackend(Legacy, "test")
	if err != nil {
		t.Fatal(err)
	}
	// A lock wait far longer than the context: the context must win.
	m := NewManager(b, ManagerOptions{LockWait: time.Hour})
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	start := time.Now()
	// Legacy reads by iptables-save, which takes no lock; the restore then waits, bounded by ctx.
	_, err = m.Sync(ctx, testRuleset(IPv4))
	if err == nil {
		t.Fatal("Sync succeeded while the xtables lock was held")
	}
	if took := time.Since(start); took > time.Minute {
		t.Errorf("Sync took %v with a 1.5s context", took)
	}
	t.Log(err)
}

func TestDetect(t *testing.T) {
	privtest.RequirePrivileged(t, append(append([]string{"ip", "nft"}, privtest.IptablesCommands(string(Legacy))...), privtest.IptablesCommands(string(NFT))...)...)
	const kubeProxyNFT = "table ip kube-proxy {\n  map service-ips { type ipv4_addr . inet_proto . inet_service : verdict; }\n" +
		"  chain services { ip daddr . meta l4proto . th dport vmap @service-ips; }\n}\n"
	cases := []struct {
		name   string
		setup  map[string]string // command -> restore payload
		nft    string            // nft -f script
		want   Mode
		reason string
		// none: no kube-proxy rules, want is the fallback; fails: an error mentioning reason; noTools: no
		// iptables command on PATH, as in a node image for nftables mode.
		none, fails, noTools bool
	}{
		{name: "empty node", want: NFT, reason: "neither", none: true},
		{name: "kubelet hint in legacy", setup: map[string]string{"iptables-legacy-restore": "*mangle\n:KUBE-IPTABLES-HINT - [0:0]\nCOMMIT\n"}, want: Legacy, reason: "hint", none: true},
		{name: "kubelet hint in nft", setup: map[string]string{
			"ip6tables-nft-restore":   "*mangle\n:KUBE-KUBELET-CANARY - [0:0]\nCOMMIT\n",
			"iptables-legacy-restore": "*nat\n:KUBE-SERVICES - [0:0]\nCOMMIT\n",
		}, want: NFT, reason: "hint"},
		{name: "kube chains in legacy only", setup: map[string]string{"iptables-legacy-restore": "*nat\n:KUBE-SERVICES - [0:0]\n-A PREROUTING -j KUBE-SERVICES\nCOMMIT\n"}, want: Legacy, reason: "KUBE-"},
		{name: "more rules in legacy", setup: map[string]string{"iptables-legacy-restore": "*filter\n-A INPUT -s 192.0.2.1/32 -j ACCEPT\nCOMMIT\n"}, want: Legacy, reason: "legacy has 1", none: true},
		{name: "kube-proxy in nftables mode", setup: map[string]string{"iptables-nft-restore": "*mangle\n:KUBE-IPTABLES-HINT - [0:0]\nCOMMIT\n"},
			nft: kubeProxyNFT, want: NFTables, reason: "table ip kube-proxy"},
		{name: "kube-proxy in both", setup: map[string]string{"iptables-nft-restore": "*nat\n:KUBE-SERVICES - [0:0]\nCOMMIT\n"},
			nft: kubeProxyNFT, reason: "both in nftables", fails: true},
		{name: "no iptables commands, kube-proxy in nftables mode", nft: kubeProxyNFT, want: NFTables, reason: "no iptables commands", noTools: true},
		{name: "no iptables commands, kube-proxy in iptables-nft", setup: map[string]string{"iptables-nft-restore": "*nat\n:KUBE-SERVICES - [0:0]\nCOMMIT\n"},
			reason: "no iptables commands are installed", fails: true, noTools: true},
		{name: "no iptables commands, no kube-proxy", want: NFTables, reason: "no iptables commands", none: true, noTools: true},
	}
	for _, tc := range cases {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			if !netnstest.Run(t) {
				return
			}
			for cmd, payload := range tc.setup {
				c := exec.Command(cmd, "--noflush")
				c.Stdin = strings.NewReader(payload)
				if out, err := c.CombinedOutput(); err != nil {
					t.Fatalf("%s: %v: %s", cmd, err, out)
				}
			}
			if tc.nft != "" {
				nftScript(t, tc.nft)
			}
			if tc.noTools {
				t.Setenv("PATH", t.TempDir())
			}
			b, err := Select(context.Background(), Auto)
			var none *NoKubeProxyRulesError
			switch {
			case tc.fails:
				if err == nil || !strings.Contains(err.Error(), tc.reason) {
					t.Fatalf("Select = %v, %v; want an error saying %q", b, err, tc.reason)
				}
				return
			case tc.none:
				if !errors.As(err, &none) {
					t.Fatalf("Select = %v, %v; want a NoKubeProxyRulesError", b, err)
				}
				b = none.Backend
			case err != nil:
				t.Fatal(err)
			}
			if b.Mode != tc.want || !strings.Contains(b.Reason, tc.reason) {
				t.Errorf("detected %s (%s), want %s (%s)", b.Mode, b.Reason, tc.want, tc.reason)
			}
		})
	}
}

func TestToolsForBothFamilies(t *testing.T) {
	for _, mode := range []Mode{Legacy, NFT} {
		privtest.RequirePrivileged(t, privtest.IptablesCommands(string(mode))...)
		b, err := NewBackend(mode, "test")
		if err != nil {
			t.Fatal(err)
		}
		for _, fam := range Families {
			tools, err := b.Tools(fam)
			if err != nil {
				t.Fatal(err)
			}
			want := fmt.Sprintf("%s-%s", commandPrefix(fam), mode)
			if !strings.HasSuffix(tools.IPTables, want) || !strings.HasSuffix(tools.Restore, want+"-restore") || tools.Version == "" {
				t.Errorf("%s %s: %+v", mode, fam, tools)
			}
		}
	}
	if _, err := NewBackend(Auto, ""); err == nil {
		t.Error("NewBackend(Auto) is not an error")
	}
}

// TestSyncReportsRulesAhead inserts another component's ACCEPT above our jump in raw PREROUTING, as
// kubernetes-sigs/node-local-dns#13 describes: the next Sync reports it (family, table, chain, position, text)
// and puts our jump back above it; the Sync after that finds nothing ahead.
func TestSyncReportsRulesAhead(t *testing.T) {
	rs := testRuleset(IPv4)
	inNamespace(t, func(t *testing.T, m *Manager) {
		ctx := context.Background()
		if _, err := m.Sync(ctx, rs); err != nil {
			t.Fatal(err)
		}
		ipt(t, m, IPv4, "-t", "raw", "-I", "PREROUTING", "1", "-p", "tcp", "-m", "comment", "--comment", "other component", "-j", "ACCEPT")
		ipt(t, m, IPv4, "-t", "raw", "-I", "PREROUTING", "1", "-s", "192.0.2.1/32", "-j", "DROP")
		res, err := m.Sync(ctx, rs)
		if err != nil {
			t.Fatal(err)
		}
		want := []string{
			`IPv4 raw/PREROUTING rule 1 (-A PREROUTING -s 192.0.2.1/32 -j DROP)`,
			`IPv4 raw/PREROUTING rule 2 (-A PREROUTING -p tcp -m comment --comment "other component" -j ACCEPT)`,
		}
		var got []string
		for _, a := range res.Ahead {
			got = append(got, a.String())
		}
		if !slices.Equal(got, want) {
			t.Errorf("rules ahead: %q, want %q", got, want)
		}
		checkInPlace(t, m, rs)
		if res, err := m.Sync(ctx, rs); err != nil || len(res.Ahead) != 0 || res.Changed {
			t.Errorf("second sync: %+v, %v; want nothing ahead and nothing changed", res, err)
		}
	})
}
