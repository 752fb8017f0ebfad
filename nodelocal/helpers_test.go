//go:build linux

package nodelocal

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/nodelocaldns/nodelocaldns/internal/netnstest"
	"github.com/nodelocaldns/nodelocaldns/internal/privtest"
	"github.com/nodelocaldns/nodelocaldns/nodelocal/internal/rules"
)

var (
	addrA  = netip.MustParseAddr("169.254.20.10")
	addrB  = netip.MustParseAddr("169.254.20.11")
	addrV6 = netip.MustParseAddr("fd00::10")
)

// recLog records what a Reconciler logs.
type recLog struct {
	t     *testing.T
	mu    sync.Mutex
	lines []string
}

func (l *recLog) add(level, format string, args ...any) {
	line := level + " " + fmt.Sprintf(format, args...)
	l.mu.Lock()
	l.lines = append(l.lines, line)
	l.mu.Unlock()
	l.t.Log(line)
}

func (l *recLog) Infof(f string, a ...any)    { l.add("[INFO]", f, a...) }
func (l *recLog) Warningf(f string, a ...any) { l.add("[WARNING]", f, a...) }
func (l *recLog) Errorf(f string, a ...any)   { l.add("[ERROR]", f, a...) }

// count returns how many lines contain s.
func (l *recLog) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, line := range l.lines {
		if strings.Contains(line, s) {
			n++
		}
	}
	return n
}

// env is one test's namespace, backend and helpers.
type env struct {
	t    *testing.T
	mode rules.Mode
	ipt  *rules.Manager
	log  *recLog
	lock string
}

// inNamespace runs fn in a fresh network namespace once per backend.
func inNamespace(t *testing.T, fn func(t *testing.T, e *env)) {
	for _, mode := range []rules.Mode{rules.NFT, rules.Legacy} {
		t.Run(string(mode), func(t *testing.T) { runIn(t, mode, fn) })
	}
}

// inNamespaceNFT runs fn in a fresh network namespace with the nft backend only, for behaviour that does
// not depend on the backend.
func inNamespaceNFT(t *testing.T, fn func(t *testing.T, e *env)) {
	runIn(t, rules.NFT, fn)
}

func runIn(t *testing.T, mode rules.Mode, fn func(t *testing.T, e *env)) {
	privtest.RequirePrivileged(t, append([]string{"ip"}, privtest.IptablesCommands(string(mode))...)...)
	if !netnstest.Run(t) {
		return
	}
	b, err := rules.NewBackend(mode, "test")
	if err != nil {
		t.Fatal(err)
	}
	fn(t, &env{
		t:    t,
		mode: mode,
		ipt:  rules.NewManager(b, rules.ManagerOptions{}),
		log:  &recLog{t: t},
		lock: filepath.Join(t.TempDir(), "nodelocaldns.lock"),
	})
}

// reconciler returns a Reconciler for this namespace, closed at the end of the test.
func (e *env) reconciler(mutate ...func(*Config)) *Reconciler {
	e.t.Helper()
	cfg := Config{Backend: string(e.mode), LockPath: e.lock, Logger: e.log, LockWait: 2 * time.Second}
	for _, m := range mutate {
		m(&cfg)
	}
	r, err := New(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { r.Close() })
	return r
}

func (e *env) acquire(r *Reconciler, c Claim) *Lease {
	e.t.Helper()
	l, err := r.Acquire(context.Background(), c)
	if err != nil {
		e.t.Fatal(err)
	}
	return l
}

func (e *env) tools(fam rules.Family) *rules.Tools {
	e.t.Helper()
	t, err := e.ipt.Backend().Tools(fam)
	if err != nil {
		e.t.Fatal(err)
	}
	return t
}

// iptables runs the backend's iptables for fam.
func (e *env) iptables(fam rules.Family, args ...string) {
	e.t.Helper()
	run(e.t, e.tools(fam).IPTables, append([]string{"-w", "5"}, args...)...)
}

// restore loads a payload with the backend's iptables-restore --noflush.
func (e *env) restore(fam rules.Family, payload string) {
	e.t.Helper()
	cmd := exec.Command(e.tools(fam).Restore, "-w", "5", "--noflush")
	cmd.Stdin = strings.NewReader(payload)
	if out, err := cmd.CombinedOutput(); err != nil {
		e.t.Fatalf("restore: %v: %s", err, out)
	}
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
}

// tables reads raw and filter of both families.
func (e *env) tables() map[string]rules.TableState {
	e.t.Helper()
	out := map[string]rules.TableState{}
	for _, fam := range rules.Families {
		for _, table := range []rules.Table{rules.Raw, rules.Filter} {
			st, err := e.ipt.Inspect(context.Background(), fam, table)
			if err != nil {
				e.t.Fatal(err)
			}
			out[fam.String()+"/"+string(table)] = st
		}
	}
	return out
}

// ruleCount counts every rule in raw and filter of both families, ours and others'.
func (e *env) ruleCount() int {
	n := 0
	for _, st := range e.tables() {
		n += st.Len()
	}
	return n
}

// expectRules checks that the node holds exactly the rules for eps: in each family our chains with their
// rules and one jump at position 1 of each hook, or, for a family without endpoints, no chain and no jump.
func (e *env) expectRules(eps []rules.Endpoint) {
	e.t.Helper()
	for _, fam := range rules.Families {
		want := rules.NodeCache(fam, rules.NodeCacheSpec{Endpoints: eps})
		hasEndpoints := slices.ContainsFunc(eps, func(x rules.Endpoint) bool { return rules.FamilyOf(x.Addr) == fam })
		for _, c := range want.Chains {
			st, err := e.ipt.Inspect(context.Background(), fam, c.Table)
			if err != nil {
				e.t.Fatal(err)
			}
			jumps := st.JumpsTo(c.Name)
			if !hasEndpoints {
				if st.ChainExists(c.Name) || len(jumps) > 0 {
					e.t.Errorf("%s %s: want no chain %s, found %d rules and jumps %v", fam, c.Table, c.Name, len(st.Chains[c.Name]), jumps)
				}
				continue
			}
			if !slices.EqualFunc(st.Chains[c.Name], c.Rules, func(a, b rules.Rule) bool { return slices.Equal(a, b) }) {
				e.t.Errorf("%s %s/%s holds\n%q\nwant\n%q", fam, c.Table, c.Name, st.Chains[c.Name], c.Rules)
			}
			var wantJumps []rules.JumpPosition
			for _, h := range c.Hooks {
				wantJumps = append(wantJumps, rules.JumpPosition{From: h, Position: 1})
			}
			slices.SortFunc(wantJumps, func(a, b rules.JumpPosition) int { return strings.Compare(a.From, b.From) })
			if !slices.Equal(jumps, wantJumps) {
				e.t.Errorf("%s %s: jumps %v, want %v", fam, c.Table, jumps, wantJumps)
			}
			for chain, rs := range st.Chains {
				for _, r := range rs {
					if (chain == c.Name || slices.Contains(r, c.Name)) && !slices.ContainsFunc(r, func(s string) bool { return strings.HasPrefix(s, rules.DefaultComment+": ") }) {
						e.t.Errorf("%s %s: rule without project comment: %q", fam, chain, r)
					}
				}
			}
		}
	}
}

// expectLinkAddrs checks the link holds exactly addrs, IPv6 link-local addresses aside.
func (e *env) expectLinkAddrs(name string, addrs ...netip.Addr) {
	e.t.Helper()
	l, err := netlink.LinkByName(name)
	if err != nil {
		e.t.Fatalf("link %s: %v", name, err)
	}
	have := linkAddrs(e.t, l)
	slices.SortFunc(addrs, netip.Addr.Compare)
	if !slices.Equal(have, addrs) {
		e.t.Errorf("link %s holds %v, want %v", name, have, addrs)
	}
}

func (e *env) expectNoLink(name string) {
	e.t.Helper()
	if _, err := netlink.LinkByName(name); err == nil {
		e.t.Errorf("link %s still exists", name)
	}
}

func linkAddrs(t *testing.T, l netlink.Link) []netip.Addr {
	t.Helper()
	list, err := netlink.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	var out []netip.Addr
	for _, a := range list {
		ip, _ := netip.AddrFromSlice(a.IP)
		ip = ip.Unmap()
		if ip.Is6() && ip.IsLinkLocalUnicast() {
			continue
		}
		out = append(out, ip)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// foreignRules returns an iptables-restore payload with n rules in each of raw and filter, spread over
// chains of up to 1000 rules, each chain reached from the table's built-in chains, the way kube-proxy lays
// out its rules.
func foreignRules(fam rules.Family, n int) string {
	return foreignPayload(fam, n, []rules.Table{rules.Raw, rules.Filter}, false)
}

var foreignHooks = map[rules.Table][]string{
	rules.Raw:    {"PREROUTING", "OUTPUT"},
	rules.Filter: {"INPUT", "FORWARD", "OUTPUT"},
}

// foreignPayload loads (or, with remove, deletes) n foreign rules in each of tables.
func foreignPayload(fam rules.Family, n int, tables []rules.Table, remove bool) string {
	var b strings.Builder
	chains := (n + 999) / 1000
	for _, table := range tables {
		fmt.Fprintf(&b, "*%s\n", table)
		if remove {
			for _, h := range foreignHooks[table] {
				for c := range chains {
					fmt.Fprintf(&b, "-D %s -m comment --comment \"foreign jump\" -j KUBE-FOREIGN-%d\n", h, c)
				}
			}
			for c := range chains {
				fmt.Fprintf(&b, "-F KUBE-FOREIGN-%d\n-X KUBE-FOREIGN-%d\n", c, c)
			}
			b.WriteString("COMMIT\n")
			continue
		}
		for c := range chains {
			fmt.Fprintf(&b, ":KUBE-FOREIGN-%d - [0:0]\n", c)
		}
		for _, h := range foreignHooks[table] {
			for c := range chains {
				fmt.Fprintf(&b, "-A %s -m comment --comment \"foreign jump\" -j KUBE-FOREIGN-%d\n", h, c)
			}
		}
		for i := range n {
			dst := fmt.Sprintf("10.%d.%d.%d/32", (i>>16)&255, (i>>8)&255, i&255)
			if fam == rules.IPv6 {
				dst = fmt.Sprintf("fd10::%x/128", i)
			}
			fmt.Fprintf(&b, "-A KUBE-FOREIGN-%d -d %s -p tcp -m tcp --dport %d -m comment --comment \"svc %d\" -j ACCEPT\n", i/1000, dst, 1+i%60000, i)
		}
		b.WriteString("COMMIT\n")
	}
	return b.String()
}
