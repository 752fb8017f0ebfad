//go:build linux

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/privtest"
	"github.com/nodelocaldns/nodelocaldns/test/simnode"
)

var nodeCache string

// kubeAPI is the API server of the package's nodes.
var kubeAPI simnode.SharedAPI

func TestMain(m *testing.M) {
	code, err := run(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(code)
}

func run(m *testing.M) (int, error) {
	dir, err := os.MkdirTemp("", "e2e")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if nodeCache, err = simnode.BuildNodeCache(ctx, dir); err != nil {
		return 0, err
	}
	code := m.Run()
	return code, kubeAPI.Stop()
}

// lookups is how many Pod lookups each conntrack measurement makes; every one is a new process, so a new
// source port.
const lookups = 5

// nodeLocalCorefile is the node-local Corefile: the cluster's zones to the cluster DNS through the
// kube-dns-upstream Service (upstreamsvc, over TCP), everything else to the node's resolver.
const nodeLocalCorefile = `cluster.local:53 {
    bind {{.Local}} {{.ClusterIP}}
    notrack {
        ports 8080
        lock {{.Lock}}
    }
    errors
    cache {
        success 9984 30
        denial 9984 5
    }
    upstreamsvc
    health {{.Local}}:8080
}
in-addr.arpa:53 {
    bind {{.Local}} {{.ClusterIP}}
    notrack
    errors
    cache 30
    upstreamsvc
}
ip6.arpa:53 {
    bind {{.Local}} {{.ClusterIP}}
    notrack
    errors
    cache 30
    upstreamsvc
}
.:53 {
    bind {{.Local}} {{.ClusterIP}}
    notrack
    errors
    cache 30
    forward . {{.Ext}}
}
`

// e2e is one run: the simulated node, its cluster DNS and resolver, and helpers.
type e2e struct {
	mode       simnode.KubeProxyMode
	t          *testing.T
	n          *simnode.Node
	clusterDNS *simnode.Process
	ext        *simnode.Process
}

func (e *e2e) pod(name string, args ...string) string {
	e.t.Helper()
	out, err := e.n.In(context.Background(), e.n.PodNS, name, args...)
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

func (e *e2e) node(name string, args ...string) (string, error) {
	return e.n.In(context.Background(), e.n.NodeNS, name, args...)
}

// getent resolves name with glibc in the Pod, with its resolv.conf (search list, ndots:5).
func (e *e2e) getent(db, name string) string {
	e.t.Helper()
	return e.pod("getent", db, name)
}

// dig asks server directly from the Pod.
func (e *e2e) dig(server, name string, extra ...string) string {
	e.t.Helper()
	args := append([]string{"+short", "+time=2", "+tries=1", "@" + server, name}, extra...)
	return strings.TrimSpace(e.pod("dig", args...))
}

// conntrack counts the node's conntrack entries to dst:53, UDP and TCP.
func (e *e2e) conntrack(dst string) int {
	e.t.Helper()
	n := 0
	for _, proto := range []string{"udp", "tcp"} {
		entries, err := e.n.ConntrackEntries(proto, dst)
		if err != nil {
			e.t.Fatal(err)
		}
		n += len(entries)
	}
	return n
}

// flushConntrack deletes the node's conntrack entries to the kube-dns ClusterIP and the link-local address,
// those the test counts.
func (e *e2e) flushConntrack() {
	e.t.Helper()
	for _, dst := range []string{simnode.KubeDNSClusterIP, simnode.LinkLocalIP} {
		if err := e.n.DeleteConntrack(dst); err != nil {
			e.t.Fatal(err)
		}
	}
}

// podLookups resolves kubernetes.default lookups times with glibc in the Pod.
func (e *e2e) podLookups() {
	e.t.Helper()
	for range lookups {
		if out := e.getent("hosts", "kubernetes.default"); !strings.HasPrefix(out, "10.96.0.1 ") {
			e.t.Fatalf("getent hosts kubernetes.default = %q, want 10.96.0.1", out)
		}
	}
}

// ourRules returns the node's rules that name the project: the iptables and ip6tables rules of every
// table, and every line of our nftables tables.
func (e *e2e) ourRules() []string {
	e.t.Helper()
	var rules []string
	tables, err := e.node("nft", "list", "tables")
	if err != nil {
		e.t.Fatal(err)
	}
	for line := range strings.SplitSeq(tables, "\n") {
		f := strings.Fields(line)
		if len(f) != 3 || !strings.HasPrefix(f[2], "nodelocaldns") {
			continue
		}
		out, err := e.node("nft", "list", "table", f[1], f[2])
		if err != nil {
			e.t.Fatal(err)
		}
		for l := range strings.SplitSeq(out, "\n") {
			if l = strings.TrimSpace(l); l != "" && l != "}" {
				rules = append(rules, f[1]+" "+f[2]+": "+l)
			}
		}
	}
	for _, save := range []string{"iptables-save", "ip6tables-save"} {
		out, err := e.node(save)
		if err != nil {
			e.t.Fatal(err)
		}
		for l := range strings.SplitSeq(out, "\n") {
			if strings.HasPrefix(l, "-A ") && strings.Contains(strings.ToLower(l), "nodelocaldns") {
				rules = append(rules, save+" "+l)
			}
		}
	}
	slices.Sort(rules)
	return rules
}

// linkAddrs returns the addresses on the nodelocaldns link, IPv6 link-local aside, and whether it exists.
func (e *e2e) linkAddrs() ([]string, bool) {
	out, err := e.node("ip", "-o", "addr", "show", "dev", "nodelocaldns")
	if err != nil {
		return nil, false
	}
	var addrs []string
	for _, f := range regexp.MustCompile(`inet6? (\S+)`).FindAllStringSubmatch(out, -1) {
		if !strings.HasPrefix(f[1], "fe80:") { // the kernel's own link-local address
			addrs = append(addrs, f[1])
		}
	}
	slices.Sort(addrs)
	return addrs, true
}

func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var rulesInPlace = regexp.MustCompile(`plugin/notrack: rules in place for (.*) (\S+) after process start`)

// cacheEnv is the node-cache process's environment: no Kubernetes API (it would not be reachable from the
// simulated node), the kube-dns-upstream Service's variables as the kubelet sets them in a Pod, and an
// xtables lock of its own. With noIPTables its PATH is an empty directory, as in a node image for
// kube-proxy's nftables mode that ships no iptables commands.
func cacheEnv(t *testing.T, noIPTables bool) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "KUBERNETES_") && !strings.HasPrefix(kv, "KUBE_DNS_UPSTREAM_") && !strings.HasPrefix(kv, "XTABLES_LOCKFILE=") &&
			(!noIPTables || !strings.HasPrefix(kv, "PATH=")) {
			env = append(env, kv)
		}
	}
	if noIPTables {
		env = append(env, "PATH="+t.TempDir())
	}
	return append(env,
		"KUBE_DNS_UPSTREAM_SERVICE_HOST="+simnode.UpstreamClusterIP,
		"XTABLES_LOCKFILE="+filepath.Join(t.TempDir(), "xtables.lock"))
}

// TestNodeCache runs the node-cache build with a node-local Corefile on a simulated node, with kube-proxy in
// iptables and in nftables mode, and checks that Pod DNS stops at the node, with neither DNAT nor
// conntrack, and that SIGUSR1 and SIGTERM behave. In nftables mode the cache runs with no iptables command
// on its PATH, and finds the backend itself (backend auto).
func TestNodeCache(t *testing.T) {
	for _, mode := range []simnode.KubeProxyMode{simnode.IPTablesMode, simnode.NFTablesMode} {
		t.Run(string(mode), func(t *testing.T) { testNodeCache(t, mode) })
	}
}

func testNodeCache(t *testing.T, mode simnode.KubeProxyMode) {
	privtest.RequirePrivileged(t, append(slices.Clone(simnode.Tools), "nft", "getent", "dig", "iptables-save", "ip6tables-save")...)
	var n *simnode.Node
	// Registered first, so it runs last: after simnode's own cleanup, nothing of this test is left.
	t.Cleanup(func() {
		if n == nil {
			return
		}
		out, err := exec.Command("ip", "netns", "list").CombinedOutput()
		if err != nil {
			t.Errorf("ip netns list: %v", err)
		}
		for _, ns := range []string{n.NodeNS, n.PodNS, n.DNSNS, n.ExtNS} {
			if strings.Contains(string(out), ns) {
				t.Errorf("namespace %s left behind", ns)
			}
		}
	})
	n = simnode.NewWithKubeProxy(t, &kubeAPI, mode)
	e := &e2e{t: t, n: n, mode: mode}
	e.clusterDNS = n.StartClusterDNS(nodeCache)
	e.ext = n.StartExternalResolver(nodeCache)
	const (
		local     = simnode.LinkLocalIP
		clusterIP = simnode.KubeDNSClusterIP
	)

	// Without the cache: kube-proxy's DNAT, a conntrack entry per lookup.
	e.flushConntrack()
	e.podLookups()
	before := e.conntrack(clusterIP)
	if before < lookups {
		t.Fatalf("without the cache: %d conntrack entries for %d lookups, want one per lookup at least", before, lookups)
	}

	// Start the cache.
	dir := t.TempDir()
	corefile := strings.NewReplacer("{{.Local}}", local, "{{.ClusterIP}}", clusterIP,
		"{{.Lock}}", filepath.Join(dir, "nodelocaldns.lock"), "{{.Ext}}", simnode.ExtResolverIP).Replace(nodeLocalCorefile)
	path := filepath.Join(dir, "Corefile")
	if err := os.WriteFile(path, []byte(corefile), 0o644); err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	cache := n.StartEnv(n.NodeNS, cacheEnv(t, mode == simnode.NFTablesMode), nodeCache, "-conf", path)
	var logged []string
	waitFor(t, "rules in place", 30*time.Second, func() bool {
		if cache.Exited() {
			t.Fatalf("node-cache exited: %v\n%s", cache.Wait(0), cache.Output())
		}
		logged = rulesInPlace.FindStringSubmatch(cache.Output())
		return logged != nil
	})
	observed := time.Since(started)
	toRules, err := time.ParseDuration(logged[2])
	if err != nil {
		t.Fatalf("rules in place after %q: %v", logged[2], err)
	}
	if logged[1] != clusterIP+":53, "+local+":53" {
		t.Errorf("rules in place for %s", logged[1])
	}
	if addrs, ok := e.linkAddrs(); !ok || !slices.Equal(addrs, []string{clusterIP + "/32", local + "/32"}) {
		t.Fatalf("link nodelocaldns (exists %v) holds %v", ok, addrs)
	}
	rules := e.ourRules()
	if len(rules) == 0 {
		t.Fatal("no rules")
	}
	wantBackend := "using rules backend nft "
	if mode == simnode.NFTablesMode {
		// kube-proxy writes a table per family, also on a node without IPv6 addresses.
		wantBackend = "using rules backend nftables (kube-proxy's nftables mode (table ip kube-proxy, ip6 kube-proxy); no iptables commands installed)"
	}
	if !strings.Contains(cache.Output(), wantBackend) {
		t.Errorf("the cache did not log %q:\n%s", wantBackend, cache.Output())
	}
	for _, r := range rules {
		if inNFT := strings.HasPrefix(r, "inet "); inNFT != (mode == simnode.NFTablesMode) {
			t.Errorf("kube-proxy in %s mode, and this rule of ours: %s", mode, r)
		}
	}
	// notrack's probe of 10.96.0.10 reached the cache, not the cluster DNS behind kube-proxy's DNAT.
	if strings.Contains(e.clusterDNS.Output(), "nodelocaldns-probe-") {
		t.Errorf("the cluster DNS got notrack's probe:\n%s", e.clusterDNS.Output())
	}

	// glibc and dig in the Pod resolve through both addresses.
	if out := e.getent("hosts", "kubernetes.default"); !strings.HasPrefix(out, "10.96.0.1 ") {
		t.Errorf("getent hosts kubernetes.default via %s = %q", clusterIP, out)
	}
	if out := e.getent("ahosts", "web"); !strings.Contains(out, "10.244.2.7 ") || !strings.Contains(out, "fd00:10:244:2::7 ") {
		t.Errorf("getent ahosts web via %s = %q, want its A and AAAA", clusterIP, out)
	}
	n.SetPodNameserver(local)
	if out := e.getent("hosts", "kubernetes.default"); !strings.HasPrefix(out, "10.96.0.1 ") {
		t.Errorf("getent hosts kubernetes.default via %s = %q", local, out)
	}
	if out := e.getent("ahosts", "web"); !strings.Contains(out, "10.244.2.7 ") {
		t.Errorf("getent ahosts web via %s = %q", local, out)
	}
	n.SetPodNameserver(clusterIP)
	for _, server := range []string{clusterIP, local} {
		for _, transport := range []string{"+notcp", "+tcp"} {
			if out := e.dig(server, "kubernetes.default.svc.cluster.local", transport); out != "10.96.0.1" {
				t.Errorf("dig %s @%s = %q", transport, server, out)
			}
		}
	}
	// The reverse zones go to the cluster DNS too, which serves none and refuses.
	reverse := "1.0.96.10.in-addr.arpa"
	for _, server := range []string{clusterIP, local} {
		if out := e.pod("dig", "+time=2", "+tries=1", "@"+server, reverse, "PTR"); !strings.Contains(out, "status: REFUSED") {
			t.Errorf("dig @%s %s PTR:\n%s", server, reverse, out)
		}
	}
	// The node's resolver would not refuse: it never sees them. (The cluster DNS logs only its zone's queries.)
	if got := simnode.CountQueries(e.ext.Output(), reverse, "udp"); got != 0 {
		t.Errorf("the node's resolver saw %s %d times", reverse, got)
	}

	// Names outside the cluster go to the `.` block's upstream, the node's resolver; the cluster DNS sees
	// only the search-list expansions.
	if out := e.getent("hosts", "example.org"); !strings.HasPrefix(out, simnode.ExternalAnswer+" ") {
		t.Errorf("getent hosts example.org = %q, want %s", out, simnode.ExternalAnswer)
	}
	if out := e.dig(local, "www.example.com"); out != simnode.ExternalAnswer {
		t.Errorf("dig @%s www.example.com = %q", local, out)
	}
	for _, name := range []string{"example.org", "www.example.com"} {
		if got := simnode.WaitForQueries(e.ext, name, "udp", 1, 30*time.Second); got == 0 {
			t.Errorf("the node's resolver never saw %s", name)
		}
		if got := simnode.CountQueries(e.clusterDNS.Output(), name, "udp") + simnode.CountQueries(e.clusterDNS.Output(), name, "tcp"); got != 0 {
			t.Errorf("the cluster DNS saw %s %d times", name, got)
		}
	}

	// No conntrack entry for Pod lookups to either address, by glibc or dig, UDP or TCP.
	e.flushConntrack()
	e.podLookups()
	for range lookups {
		e.dig(local, "kubernetes.default.svc.cluster.local")
		e.dig(clusterIP, "kubernetes.default.svc.cluster.local", "+tcp")
	}
	withCache := map[string]int{clusterIP: e.conntrack(clusterIP), local: e.conntrack(local)}
	for addr, got := range withCache {
		if got != 0 {
			entries, _ := e.n.ConntrackEntries("udp", addr)
			t.Errorf("with the cache: %d conntrack entries to %s:53:\n%s", got, addr, strings.Join(entries, "\n"))
		}
	}

	// Cache hits never reach the cluster DNS; the miss reaches it over TCP.
	const fresh = "kube-dns.kube-system.svc.cluster.local"
	for i := range lookups {
		server := []string{clusterIP, local}[i%2]
		if out := e.dig(server, fresh); out != "10.96.0.10" {
			t.Errorf("dig @%s %s = %q", server, fresh, out)
		}
	}
	tcp := simnode.WaitForQueries(e.clusterDNS, fresh, "tcp", 1, 30*time.Second)
	udp := simnode.CountQueries(e.clusterDNS.Output(), fresh, "udp")
	if udp != 0 || tcp != 1 {
		t.Errorf("%d lookups of %s reached the cluster DNS %d times over UDP and %d over TCP, want 0 and 1", lookups, fresh, udp, tcp)
	}

	// SIGUSR1: a reload of the same Corefile neither removes nor duplicates a rule, nor touches the link.
	mark := len(cache.Output())
	reloads := strings.Count(cache.Output(), "Reloading complete")
	if err := cache.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "reload", 10*time.Second, func() bool { return strings.Count(cache.Output(), "Reloading complete") > reloads })
	if after := e.ourRules(); !slices.Equal(after, rules) {
		t.Errorf("rules after SIGUSR1 (%d):\n%s\nbefore (%d):\n%s", len(after), strings.Join(after, "\n"), len(rules), strings.Join(rules, "\n"))
	}
	if changes := cache.Output()[mark:]; strings.Contains(changes, "nodelocal:") {
		t.Errorf("the reload changed the node:\n%s", changes)
	}
	e.flushConntrack()
	if out := e.getent("hosts", "kubernetes.default"); !strings.HasPrefix(out, "10.96.0.1 ") {
		t.Errorf("after the reload: getent hosts kubernetes.default = %q", out)
	}
	if got := e.conntrack(clusterIP); got != 0 {
		t.Errorf("after the reload: %d conntrack entries", got)
	}

	// SIGTERM: no rule and no link left, and Pod lookups go through the DNAT to the cluster DNS again.
	stopping := time.Now()
	if err := cache.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cache.Wait(30 * time.Second); err != nil { // the kubelet's default grace period
		t.Errorf("node-cache after SIGTERM: %v", err)
	}
	stopped := time.Since(stopping)
	if left := e.ourRules(); len(left) > 0 {
		t.Errorf("rules left after SIGTERM:\n%s", strings.Join(left, "\n"))
	}
	if addrs, ok := e.linkAddrs(); ok {
		t.Errorf("link nodelocaldns left after SIGTERM, holding %v", addrs)
	}
	udpBefore := simnode.CountQueries(e.clusterDNS.Output(), "kubernetes.default.svc.cluster.local", "udp")
	e.flushConntrack()
	e.podLookups()
	after := e.conntrack(clusterIP)
	if after < lookups {
		t.Errorf("cache stopped: %d conntrack entries for %d lookups, want one per lookup at least", after, lookups)
	}
	if got := simnode.WaitForQueries(e.clusterDNS, "kubernetes.default.svc.cluster.local", "udp", udpBefore+lookups, 30*time.Second) - udpBefore; got < lookups {
		t.Errorf("cache stopped: the cluster DNS got %d of %d lookups over UDP", got, lookups)
	}

	// glibc sends each query of a lookup (AAAA and A over the search list) from a fresh source port.
	t.Logf("conntrack entries to %s:53 for %d Pod lookups (getent hosts kubernetes.default): %d before the cache started, %d after it stopped",
		clusterIP, lookups, before, after)
	t.Logf("with the cache: %d entries to %s:53 and %d to %s:53 for %d getent lookups via %[2]s, %[5]d dig UDP via %[4]s and %[5]d dig TCP via %[2]s",
		withCache[clusterIP], clusterIP, withCache[local], local, lookups)
	t.Logf("rules in place %v after process start (notrack's log), seen by the test %v after it started the process; %d rules; SIGTERM to exit %v",
		toRules, observed.Round(time.Millisecond), len(rules), stopped.Round(time.Millisecond))
}
