//go:build linux

package rules

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestEndpointsSortedAndDeduplicated(t *testing.T) {
	a := netip.MustParseAddr("169.254.20.10")
	b := netip.MustParseAddr("10.96.0.10")
	got := Endpoints([]netip.Addr{a, b, a}, 53, []uint16{8080, 53})
	want := []Endpoint{
		{b, UDP, 53}, {b, TCP, 53}, {b, TCP, 8080},
		{a, UDP, 53}, {a, TCP, 53}, {a, TCP, 8080},
	}
	if !slices.Equal(got, want) {
		t.Errorf("Endpoints = %v\nwant %v", got, want)
	}
}

func TestNodeCacheKeepsFamiliesApart(t *testing.T) {
	eps := Endpoints([]netip.Addr{netip.MustParseAddr("169.254.20.10"), netip.MustParseAddr("fd00::10")}, 53, nil)
	for _, fam := range Families {
		rs := NodeCache(fam, NodeCacheSpec{Endpoints: eps})
		if err := rs.Validate(); err != nil {
			t.Fatal(err)
		}
		if got, want := rs.RuleCount(), 2*(2*2)+4; got != want {
			t.Errorf("%s: %d rules, want %d", fam, got, want)
		}
		for _, c := range rs.Chains {
			for _, r := range c.Rules {
				addr := r[1]
				if (fam == IPv4) != strings.HasSuffix(addr, "/32") {
					t.Errorf("%s ruleset has rule for %s", fam, addr)
				}
			}
		}
	}
}

func TestNodeCacheEveryRuleNamesTheProject(t *testing.T) {
	rs := NodeCache(IPv4, NodeCacheSpec{Endpoints: Endpoints([]netip.Addr{netip.MustParseAddr("169.254.20.10")}, 53, []uint16{8080})})
	for _, c := range rs.Chains {
		for _, r := range append(slices.Clone(c.Rules), c.Jump()) {
			i := slices.Index(r, "--comment")
			if i < 0 || !strings.HasPrefix(r[i+1], DefaultComment+": ") {
				t.Errorf("rule %q has no comment naming the project", r)
			}
		}
	}
}

func ExampleNodeCache() {
	eps := Endpoints([]netip.Addr{netip.MustParseAddr("169.254.20.10")}, 53, []uint16{8080})
	payload, err := NodeCache(IPv4, NodeCacheSpec{Endpoints: eps}).Payload()
	if err != nil {
		panic(err)
	}
	fmt.Print(string(payload))
	// Output:
	// *raw
	// :NODELOCALDNS - [0:0]
	// -A NODELOCALDNS -d 169.254.20.10/32 -p udp -m udp --dport 53 -m comment --comment "nodelocaldns: to 169.254.20.10 udp/53" -j NOTRACK
	// -A NODELOCALDNS -s 169.254.20.10/32 -p udp -m udp --sport 53 -m comment --comment "nodelocaldns: from 169.254.20.10 udp/53" -j NOTRACK
	// -A NODELOCALDNS -d 169.254.20.10/32 -p tcp -m tcp --dport 53 -m comment --comment "nodelocaldns: to 169.254.20.10 tcp/53" -j NOTRACK
	// -A NODELOCALDNS -s 169.254.20.10/32 -p tcp -m tcp --sport 53 -m comment --comment "nodelocaldns: from 169.254.20.10 tcp/53" -j NOTRACK
	// -A NODELOCALDNS -d 169.254.20.10/32 -p tcp -m tcp --dport 8080 -m comment --comment "nodelocaldns: to 169.254.20.10 tcp/8080" -j NOTRACK
	// -A NODELOCALDNS -s 169.254.20.10/32 -p tcp -m tcp --sport 8080 -m comment --comment "nodelocaldns: from 169.254.20.10 tcp/8080" -j NOTRACK
	// -I PREROUTING 1 -m comment --comment "nodelocaldns: skip conntrack for the node-local DNS cache" -j NODELOCALDNS
	// -I OUTPUT 1 -m comment --comment "nodelocaldns: skip conntrack for the node-local DNS cache" -j NODELOCALDNS
	// COMMIT
	// *filter
	// :NODELOCALDNS - [0:0]
	// -A NODELOCALDNS -d 169.254.20.10/32 -p udp -m udp --dport 53 -m comment --comment "nodelocaldns: to 169.254.20.10 udp/53" -j ACCEPT
	// -A NODELOCALDNS -s 169.254.20.10/32 -p udp -m udp --sport 53 -m comment --comment "nodelocaldns: from 169.254.20.10 udp/53" -j ACCEPT
	// -A NODELOCALDNS -d 169.254.20.10/32 -p tcp -m tcp --dport 53 -m comment --comment "nodelocaldns: to 169.254.20.10 tcp/53" -j ACCEPT
	// -A NODELOCALDNS -s 169.254.20.10/32 -p tcp -m tcp --sport 53 -m comment --comment "nodelocaldns: from 169.254.20.10 tcp/53" -j ACCEPT
	// -A NODELOCALDNS -d 169.254.20.10/32 -p tcp -m tcp --dport 8080 -m comment --comment "nodelocaldns: to 169.254.20.10 tcp/8080" -j ACCEPT
	// -A NODELOCALDNS -s 169.254.20.10/32 -p tcp -m tcp --sport 8080 -m comment --comment "nodelocaldns: from 169.254.20.10 tcp/8080" -j ACCEPT
	// -I INPUT 1 -m comment --comment "nodelocaldns: accept traffic of the node-local DNS cache" -j NODELOCALDNS
	// -I OUTPUT 1 -m comment --comment "nodelocaldns: accept traffic of the node-local DNS cache" -j NODELOCALDNS
	// COMMIT
}

func TestValidateRejects(t *testing.T) {
	ok := Chain{Table: Raw, Name: "OURS", Hooks: []string{"PREROUTING"}, JumpComment: "x", Rules: []Rule{{"-j", "NOTRACK"}}}
	tests := []struct {
		name string
		rs   Ruleset
		want string
	}{
		{"family", Ruleset{Family: 5, Chains: []Chain{ok}}, "family"},
		{"table", Ruleset{Family: IPv4, Chains: []Chain{{Table: "weird", Name: "X"}}}, "unknown table"},
		{"long name", Ruleset{Family: IPv4, Chains: []Chain{{Table: Raw, Name: strings.Repeat("N", 29)}}}, "invalid chain name"},
		{"twice", Ruleset{Family: IPv4, Chains: []Chain{ok, ok}}, "appears twice"},
		{"shared hook", Ruleset{Family: IPv4, Chains: []Chain{ok, {Table: Raw, Name: "OTHER", Hooks: []string{"PREROUTING"}}}}, "both want position 1"},
		{"quote", Ruleset{Family: IPv4, Chains: []Chain{{Table: Raw, Name: "X", Rules: []Rule{{"-m", "comment", "--comment", `a"b`, "-j", "ACCEPT"}}}}}, "quote"},
		{"empty rule", Ruleset{Family: IPv4, Chains: []Chain{{Table: Raw, Name: "X", Rules: []Rule{{}}}}}, "empty rule"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.rs.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Validate() = %v, want an error about %q", err, tc.want)
			}
		})
	}
	if err := (Ruleset{Family: IPv6, Chains: []Chain{ok, {Table: Filter, Name: "OURS", Hooks: []string{"INPUT"}}}}).Validate(); err != nil {
		t.Errorf("same chain name in two tables: %v", err)
	}
}

func TestArgsRoundTrip(t *testing.T) {
	for _, args := range [][]string{
		{"-A", "X", "-m", "comment", "--comment", "nodelocaldns: to 1.2.3.4 udp/53", "-j", "ACCEPT"},
		{"-A", "X", "--comment", `quote " and \ backslash`, "-j", "ACCEPT"},
		{"-A", "X", "--comment", "", "-j", "ACCEPT"},
		{"-A", "X", "--comment", "it's", "-j", "ACCEPT"},
	} {
		line := joinArgs(args)
		got, err := splitArgs(line)
		if err != nil {
			t.Fatalf("splitArgs(%q): %v", line, err)
		}
		if !slices.Equal(got, args) {
			t.Errorf("round trip through %q: got %q, want %q", line, got, args)
		}
	}
	if _, err := splitArgs(`-A X --comment "open`); err == nil {
		t.Error("an unterminated quote is not an error")
	}
}

func TestParseRulesSaveOutput(t *testing.T) {
	out := `# Generated by iptables-save v1.8.9 on Sat Nov 29 16:00:00 2025
*mangle
:PREROUTING ACCEPT [0:0]
:KUBE-IPTABLES-HINT - [0:0]
-A PREROUTING -j KUBE-IPTABLES-HINT
COMMIT
*raw
:PREROUTING ACCEPT [10:600]
:OUTPUT ACCEPT [0:0]
:NODELOCALDNS - [0:0]
:EMPTY - [0:0]
-A PREROUTING -m comment --comment "nodelocaldns: skip" -j NODELOCALDNS
-A PREROUTING -j KUBE-X
-A PREROUTING -m comment --comment nodelocaldns -j NODELOCALDNS
-A NODELOCALDNS -d 169.254.20.10/32 -p udp -m udp --dport 53 -m comment --comment "nodelocaldns: to 169.254.20.10 udp/53" -j NOTRACK
COMMIT
`
	st, err := parseRules([]byte(out), Raw)
	if err != nil {
		t.Fatal(err)
	}
	if st.ChainExists("KUBE-IPTABLES-HINT") {
		t.Error("a chain of another table leaked into raw")
	}
	if !st.ChainExists("EMPTY") || len(st.Chains["EMPTY"]) != 0 {
		t.Error("an empty chain is missing")
	}
	if got := st.JumpsTo("NODELOCALDNS"); !slices.Equal(got, []JumpPosition{{"PREROUTING", 1}, {"PREROUTING", 3}}) {
		t.Errorf("JumpsTo = %v", got)
	}
	if got := st.RuleCount("NODELOCALDNS"); got != 3 {
		t.Errorf("RuleCount = %d, want 3", got)
	}
	if got := st.Len(); got != 4 {
		t.Errorf("Len = %d, want 4", got)
	}
	want := Rule{"-d", "169.254.20.10/32", "-p", "udp", "-m", "udp", "--dport", "53", "-m", "comment", "--comment", "nodelocaldns: to 169.254.20.10 udp/53", "-j", "NOTRACK"}
	if !slices.Equal(st.Chains["NODELOCALDNS"][0], want) {
		t.Errorf("rule = %q", st.Chains["NODELOCALDNS"][0])
	}
}

func TestParseRulesListOutput(t *testing.T) {
	st, err := parseRules([]byte("-P PREROUTING ACCEPT\n-A PREROUTING -j X\n"), "")
	if err != nil {
		t.Fatal(err)
	}
	if got := st.Chains["PREROUTING"]; len(got) != 1 || target(got[0]) != "X" {
		t.Errorf("PREROUTING = %q", got)
	}
	if _, err := parseRules([]byte("garbage\n"), ""); err == nil {
		t.Error("garbage parses")
	}
}

func TestTarget(t *testing.T) {
	tests := []struct {
		r    Rule
		want string
	}{
		{Rule{"-m", "comment", "--comment", "-j X", "-j", "ACCEPT"}, "ACCEPT"},
		{Rule{"-g", "OURS"}, "OURS"},
		{Rule{"-j", "CT", "--notrack"}, "CT"},
		{Rule{"-p", "tcp"}, ""},
	}
	for _, tc := range tests {
		if got := target(tc.r); got != tc.want {
			t.Errorf("target(%q) = %q, want %q", tc.r, got, tc.want)
		}
	}
}

func TestCommandErrorLockContention(t *testing.T) {
	held := &CommandError{Args: []string{"iptables-restore"}, ExitStatus: 4, Stderr: "Another app is currently holding the xtables lock. Stopped waiting after 1s.\n"}
	if !IsLockContention(fmt.Errorf("sync: %w", held)) {
		t.Error("lock contention not recognised through wrapping")
	}
	for _, ce := range []*CommandError{
		{ExitStatus: 4, Stderr: "iptables-restore: unable to initialize table 'raw'"},
		{ExitStatus: 1, Stderr: "Another app is currently holding the xtables lock."},
	} {
		if ce.LockContention() {
			t.Errorf("%+v taken for lock contention", ce)
		}
	}
	if IsLockContention(errors.New("xtables lock")) {
		t.Error("a plain error taken for lock contention")
	}
	msg := (&CommandError{Args: []string{"iptables", "-S"}, ExitStatus: 2, Stderr: "bad\n  arg\n"}).Error()
	if msg != "iptables -S: exit status 2: bad arg" {
		t.Errorf("Error() = %q", msg)
	}
}

func TestWaitSecondsFollowsDeadline(t *testing.T) {
	m := NewManager(&Backend{Mode: NFT, run: execRunner{}}, ManagerOptions{LockWait: 30 * time.Second})
	if got := m.waitSeconds(context.Background()); got != "30" {
		t.Errorf("without deadline: %s", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2500*time.Millisecond)
	defer cancel()
	if got := m.waitSeconds(ctx); got != "3" {
		t.Errorf("2.5s before the deadline: %s", got)
	}
	ctx, cancel = context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	if got := m.waitSeconds(ctx); got != "1" {
		t.Errorf("past the deadline: %s", got)
	}
}

func TestParseMode(t *testing.T) {
	for in, want := range map[string]Mode{"": Auto, "auto": Auto, "Legacy": Legacy, " nft ": NFT, "nftables": NFTables} {
		if got, err := ParseMode(in); err != nil || got != want {
			t.Errorf("ParseMode(%q) = %q, %v", in, got, err)
		}
	}
	if _, err := ParseMode("ipvs"); err == nil {
		t.Error("ParseMode accepts ipvs")
	}
}

func TestFailedLine(t *testing.T) {
	err := &CommandError{ExitStatus: 1, Stderr: "iptables-restore: line 3 failed\n"}
	if got := failedLine(err, []byte("*raw\n:X - [0:0]\n-A X -j BOGUS\nCOMMIT\n")); got != " (line 3: -A X -j BOGUS)" {
		t.Errorf("failedLine = %q", got)
	}
}

func TestChainFromSaveMatchesFullParse(t *testing.T) {
	out := []byte(`*filter
:INPUT ACCEPT [0:0]
:NODELOCALDNS - [0:0]
:NODELOCALDNS-X - [0:0]
-A INPUT -m comment --comment "nodelocaldns: x" -j NODELOCALDNS
-A NODELOCALDNS-X -j ACCEPT
-A NODELOCALDNS -d 169.254.20.10/32 -m comment --comment "a b" -j ACCEPT
COMMIT
*raw
:NODELOCALDNS - [0:0]
-A NODELOCALDNS -j NOTRACK
COMMIT
`)
	full, err := parseRules(out, Filter)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"INPUT", "NODELOCALDNS", "NODELOCALDNS-X", "MISSING"} {
		got, ok, err := chainFromSave(out, Filter, name)
		if err != nil {
			t.Fatal(err)
		}
		if ok != full.ChainExists(name) || !sameRules(got, full.Chains[name]) {
			t.Errorf("%s: %q %v, full parse %q %v", name, got, ok, full.Chains[name], full.ChainExists(name))
		}
	}
	if _, _, err := chainFromSave(out, NAT, "X"); err == nil {
		t.Error("a missing table is not an error")
	}
}

// TestRulesLaidOutByTraffic checks where a query over UDP to each of the cache's addresses, and its answer,
// find their rule in each chain of ours, for both backends: among the UDP rules, which come first (two per
// address), not after every rule of the addresses that sort before theirs.
func TestRulesLaidOutByTraffic(t *testing.T) {
	addrs := []netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("169.254.20.10")}
	eps := Endpoints(addrs, 53, []uint16{8080, 8181})
	type packet struct {
		to   bool // a query (to the address) or an answer (from it)
		addr netip.Addr
	}
	var packets []packet
	for _, a := range addrs {
		packets = append(packets, packet{true, a}, packet{false, a})
	}
	within := func(packet) int { return 2 * len(addrs) }

	rs := NodeCache(IPv4, NodeCacheSpec{Endpoints: eps})
	for _, c := range rs.Chains {
		for _, p := range packets {
			flag, port := "-s", "--sport"
			if p.to {
				flag, port = "-d", "--dport"
			}
			at := slices.IndexFunc(c.Rules, func(r Rule) bool {
				return slices.Contains(r, flag) && r[slices.Index(r, flag)+1] == p.addr.String()+"/32" &&
					slices.Contains(r, "udp") && r[slices.Index(r, port)+1] == "53"
			})
			if at < 0 || at >= within(p) {
				t.Errorf("iptables %s/%s: the rule for %+v is rule %d of %d, want one of the first %d:\n%v", c.Table, c.Name, p, at+1, len(c.Rules), within(p), c.Rules)
			}
		}
	}

	table := cacheTable(eps, "")
	for _, c := range table.chains {
		if c.name != nftEndpointsChain {
			continue
		}
		for _, p := range packets {
			dir := "from"
			if p.to {
				dir = "to"
			}
			want := fmt.Sprintf("%s: %s %s udp/53", DefaultComment, dir, p.addr)
			at := slices.IndexFunc(c.rules, func(r nftRule) bool { return r.comment == want })
			if at < 0 || at >= within(p) {
				t.Errorf("nftables %s: %q is rule %d of %d, want one of the first %d", c.name, want, at+1, len(c.rules), within(p))
			}
		}
	}
}
