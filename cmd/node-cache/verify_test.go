//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodelocaldns/nodelocaldns/corefile"
	"github.com/nodelocaldns/nodelocaldns/examples/kubernetes"
	"github.com/nodelocaldns/nodelocaldns/test/simnode"
)

// TestVerifyOnSimulatedNode runs node-cache as the iptables manifest's DaemonSet runs it, on a simulated
// node with kube-proxy in iptables mode and one in nftables mode, then -verify with the same arguments: all
// checks pass on the healthy node; with the hook of the node's own traffic gone (the raw OUTPUT jump, the
// output base chain) the rules and conntrack rows fail; with the cache stopped the answers and readiness
// fail. Each time the exit status says so.
func TestVerifyOnSimulatedNode(t *testing.T) {
	for _, mode := range []struct {
		kubeProxy simnode.KubeProxyMode
		rules     []string // targets of the rules rows
		breakHook [][]string
	}{
		{simnode.IPTablesMode, []string{"IPv4 raw/NODELOCALDNS", "IPv4 filter/NODELOCALDNS"},
			[][]string{{"iptables", "-t", "raw", "-D", "OUTPUT", "1"}}},
		{simnode.NFTablesMode, []string{"nftables inet nodelocaldns"},
			[][]string{{"nft", "flush", "chain", "inet", "nodelocaldns", "output"}, {"nft", "delete", "chain", "inet", "nodelocaldns", "output"}}},
	} {
		t.Run(string(mode.kubeProxy), func(t *testing.T) {
			testVerify(t, mode.kubeProxy, mode.rules, mode.breakHook)
		})
	}
}

// verifyNode is a simulated node running node-cache as the iptables manifest's DaemonSet runs it, with the
// cluster DNS, the node's resolver and a kube-dns ConfigMap with one stub domain.
type verifyNode struct {
	*simnode.Node
	binary, localIP, kubeDNS string
	conf                     string   // the Corefile the cache serves
	env                      []string // the cache's environment, as its container has it
	clusterDNS, cache        *simnode.Process
}

func startVerifyNode(t *testing.T, mode simnode.KubeProxyMode) *verifyNode {
	t.Helper()
	objs, err := kubernetes.Load("nodelocaldns-iptables.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return startVerifyNodeWith(t, mode, []byte(objs.ConfigMap("node-local-dns").Data["Corefile"]))
}

// startVerifyNodeWith is startVerifyNode with base as the node-local-dns ConfigMap's Corefile.
func startVerifyNodeWith(t *testing.T, mode simnode.KubeProxyMode, base []byte) *verifyNode {
	t.Helper()
	n := simnode.NewWithMode(t, mode)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	binary, err := simnode.BuildNodeCache(ctx, t.TempDir())
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	clusterDNS := startClusterDNSWithReverse(t, n, binary)
	n.StartExternalResolver(binary)

	netnsDir := filepath.Join("/etc/netns", n.NodeNS)
	if err := os.MkdirAll(netnsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(netnsDir) })
	writeFile(t, filepath.Join(netnsDir, "resolv.conf"), []byte("nameserver "+simnode.ExtResolverIP+"\n"))

	dir := t.TempDir()
	baseFile, conf, kubeDNS := filepath.Join(dir, "Corefile.base"), filepath.Join(dir, "Corefile"), filepath.Join(dir, "kube-dns")
	writeFile(t, baseFile, base)
	writeKubeDNSDir(t, kubeDNS, corefile.KubeDNS{StubDomains: map[string][]string{"corp.example": {simnode.ExtResolverIP}}})
	env := append(os.Environ(), "KUBE_DNS_UPSTREAM_SERVICE_HOST="+simnode.UpstreamClusterIP, "KUBE_DNS_UPSTREAM_SERVICE_PORT=53",
		"XTABLES_LOCKFILE="+filepath.Join(dir, "xtables.lock"))
	localIP := simnode.LinkLocalIP + "," + simnode.KubeDNSClusterIP
	// A sync interval of an hour keeps the cache's repair loop from undoing the breakage below.
	cache := n.StartEnv(n.NodeNS, env, binary, "-localip", localIP, "-conf", conf, "-upstreamsvc", "kube-dns-upstream",
		"-pidfile", filepath.Join(dir, "node-cache.pid"), "-basecorefile", baseFile, "-kubednscm", kubeDNS,
		"-lockfile", filepath.Join(dir, "nodelocaldns.lock"), "-syncinterval", "1h")
	t.Cleanup(func() {
		if !cache.Exited() {
			_ = cache.Signal(syscall.SIGCONT)
			_ = cache.Signal(syscall.SIGTERM)
			_ = cache.Wait(10 * time.Second)
		}
	})
	t.Cleanup(func() {
		if !clusterDNS.Exited() {
			_ = clusterDNS.Signal(syscall.SIGCONT)
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(cache.Output(), "plugin/notrack: rules in place for") {
		if cache.Exited() || time.Now().After(deadline) {
			t.Fatalf("notrack did not report its rules in place:\n%s", cache.Output())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := n.WaitForDNS(n.NodeNS, "udp", net.JoinHostPort(simnode.LinkLocalIP, "53"), "kubernetes.default.svc.cluster.local", 20*time.Second); err != nil {
		t.Fatal(err)
	}
	return &verifyNode{Node: n, binary: binary, localIP: localIP, kubeDNS: kubeDNS, conf: conf, env: env, clusterDNS: clusterDNS, cache: cache}
}

// verify runs node-cache -verify on the node, with the cache's environment (as kubectl exec into its
// container does), and returns the table and the exit status.
func (n *verifyNode) verify(t *testing.T, extra ...string) (string, int) {
	t.Helper()
	args := append([]string{"netns", "exec", n.NodeNS, n.binary, "-verify", "-localip", n.localIP, "-kubednscm", n.kubeDNS,
		"-conf", n.conf, "-verify.external", "www.example.org"}, extra...)
	cmd := exec.Command("ip", args...)
	cmd.Env = n.env
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &exit):
		return string(out), exit.ExitCode()
	}
	t.Fatalf("running -verify: %v: %s", err, out)
	return "", 0
}

func testVerify(t *testing.T, mode simnode.KubeProxyMode, rulesRows []string, breakHook [][]string) {
	vn := startVerifyNode(t, mode)
	n, cache := vn.Node, vn.cache
	verify := func(extra ...string) (string, int) {
		t.Helper()
		return vn.verify(t, extra...)
	}

	out, code := verify()
	t.Logf("healthy node:\n%s", out)
	if code != 0 {
		t.Fatalf("-verify exited %d on a healthy node", code)
	}
	for _, ip := range []string{simnode.LinkLocalIP, simnode.KubeDNSClusterIP} {
		expectRow(t, out, "address", ip, "ok")
		expectRow(t, out, "answer", ip+" kubernetes.default.svc.cluster.local A/udp", "ok")
		expectRow(t, out, "answer", ip+" kubernetes.default.svc.cluster.local A/tcp", "ok")
		expectRow(t, out, "answer", ip+" 1.0.96.10.in-addr.arpa. PTR", "ok")
		expectRow(t, out, "answer", ip+" www.example.org. A", "ok")
		expectRow(t, out, "answer", ip+" corp.example. A", "ok")
		expectRow(t, out, "conntrack", ip, "ok")
	}
	expectRow(t, out, "link", "nodelocaldns", "ok")
	for _, r := range rulesRows {
		expectRow(t, out, "rules", r, "ok")
	}
	expectRow(t, out, "fail-open", "", "ok")
	expectRow(t, out, "ready", ":8181/ready", "ok")
	expectRow(t, out, "health", ":8080/health", "ok")
	expectRow(t, out, "upstream", "kube-dns-upstream at "+simnode.UpstreamClusterIP+":53", "ok")

	// Without the hook of the node's own traffic, its lookups are tracked again.
	for _, cmd := range breakHook {
		if _, err := n.In(context.Background(), n.NodeNS, cmd[0], cmd[1:]...); err != nil {
			t.Fatal(err)
		}
	}
	out, code = verify()
	t.Logf("output hook deleted:\n%s", out)
	if code != 1 {
		t.Errorf("-verify exited %d with the output hook gone, want 1", code)
	}
	expectRow(t, out, "rules", rulesRows[0], "FAIL")
	for _, ip := range []string{simnode.LinkLocalIP, simnode.KubeDNSClusterIP} {
		expectRow(t, out, "conntrack", ip, "FAIL")
		expectRow(t, out, "answer", ip+" kubernetes.default.svc.cluster.local A/udp", "ok")
	}

	// A stopped cache answers nothing and is not ready.
	if err := cache.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	out, code = verify("-verify.timeout", "300ms")
	if err := cache.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	t.Logf("cache stopped:\n%s", out)
	if code != 1 {
		t.Errorf("-verify exited %d with the cache stopped, want 1", code)
	}
	expectRow(t, out, "answer", simnode.LinkLocalIP+" kubernetes.default.svc.cluster.local A/udp", "FAIL")
	expectRow(t, out, "answer", simnode.LinkLocalIP+" www.example.org. A", "FAIL")
	expectRow(t, out, "ready", ":8181/ready", "FAIL")
	expectRow(t, out, "address", simnode.LinkLocalIP, "ok")
}

// TestVerifyUpstreamCorefile runs the cache with upstream's own node-local-dns ConfigMap Corefile (the
// drop-in promise), which has no ready plugin: -verify passes on the healthy node, with the ready row
// skipped and saying why, and the health row asking where the Corefile's health listens.
func TestVerifyUpstreamCorefile(t *testing.T) {
	base, err := os.ReadFile(filepath.Join("..", "..", "corefile", "testdata", "upstream-template.Corefile"))
	if err != nil {
		t.Fatal(err)
	}
	// Substituted as upstream's instructions have it done before the manifest is applied.
	base = []byte(strings.NewReplacer(corefile.DNSDomainVar, simnode.ClusterDomain, corefile.LocalDNSVar, simnode.LinkLocalIP,
		corefile.DNSServerVar, simnode.KubeDNSClusterIP).Replace(string(base)))
	vn := startVerifyNodeWith(t, simnode.IPTablesMode, base)
	out, code := vn.verify(t)
	t.Logf("healthy node, upstream's Corefile:\n%s", out)
	if code != 0 {
		t.Errorf("-verify exited %d on a healthy node serving upstream's Corefile, want 0", code)
	}
	expectRow(t, out, "corefile", vn.conf, "ok")
	expectRow(t, out, "ready", "/ready", "skipped")
	if !strings.Contains(out, "has no ready plugin") {
		t.Errorf("the ready row does not say why it is skipped")
	}
	expectRow(t, out, "health", simnode.LinkLocalIP+":8080/health", "ok")
	for _, ip := range []string{simnode.LinkLocalIP, simnode.KubeDNSClusterIP} {
		expectRow(t, out, "answer", ip+" kubernetes.default.svc.cluster.local A/udp", "ok")
		expectRow(t, out, "answer", ip+" www.example.org. A", "ok")
		expectRow(t, out, "conntrack", ip, "ok")
	}
	for _, r := range tableRows(out) {
		if r.result == "FAIL" {
			t.Errorf("row %s %s fails on a healthy node", r.check, r.target)
		}
	}
}

// TestVerifyConntrackEntriesFromBefore runs -verify on a healthy node whose conntrack table already holds
// entries to the cache's addresses from most source ports, as the node's own lookups from before the
// NOTRACK rules were in place leave them (the cache's probes of its own addresses, for one). -verify sends
// its lookups from ports with no entry, so none of those entries reads as one of its lookups being tracked.
// The node's source ports are narrowed to 40, with entries for 28 of them, so that lookups from any port
// would hit one nearly every time; the 12 others leave room for the cache's own UDP sockets.
func TestVerifyConntrackEntriesFromBefore(t *testing.T) {
	vn := startVerifyNode(t, simnode.IPTablesMode)
	const first, ports, stale = 40000, 40, 28
	if _, err := vn.In(context.Background(), vn.NodeNS, "sysctl", "-w",
		fmt.Sprintf("net.ipv4.ip_local_port_range=%d %d", first, first+ports-1)); err != nil {
		t.Fatal(err)
	}
	for _, ip := range []string{simnode.LinkLocalIP, simnode.KubeDNSClusterIP} {
		for port := first; port < first+stale; port++ {
			// The node's own lookup of the address goes out from the address itself.
			if _, err := vn.In(context.Background(), vn.NodeNS, "conntrack", "-I", "-p", "udp", "-s", ip, "-d", ip,
				"--sport", strconv.Itoa(port), "--dport", "53", "-t", "300"); err != nil {
				t.Fatal(err)
			}
		}
	}
	out, code := vn.verify(t)
	t.Logf("healthy node, conntrack entries from before:\n%s", out)
	if code != 0 {
		t.Errorf("-verify exited %d on a healthy node, want 0", code)
	}
	for _, ip := range []string{simnode.LinkLocalIP, simnode.KubeDNSClusterIP} {
		expectRow(t, out, "conntrack", ip, "ok")
	}
}

// TestVerifyClusterDNSOutage runs -verify on a healthy node cache while the cluster DNS behind
// kube-dns-upstream is hung (SIGSTOP), then gone (SIGKILL). The upstream row fails and names
// kube-dns-upstream and its address; the cache's own rows pass; answers for cluster names the cache does not
// hold are marked UPSTREAM, not FAIL, and the one it holds is served; -verify exits 3, not 1.
func TestVerifyClusterDNSOutage(t *testing.T) {
	vn := startVerifyNode(t, simnode.IPTablesMode)
	out, code := vn.verify(t)
	t.Logf("healthy node:\n%s", out)
	if code != 0 {
		t.Fatalf("-verify exited %d on a healthy node", code)
	}
	// The target is namespace/name when the address comes from the cache's metrics, name alone when a slow
	// scrape left it to the environment.
	upstream := "kube-dns-upstream at " + simnode.UpstreamClusterIP + ":53"

	expectOutage := func(out string, code int, name string, cached bool) {
		t.Helper()
		if code != exitUpstreamUnreachable {
			t.Errorf("-verify exited %d, want %d (the upstream's failure)", code, exitUpstreamUnreachable)
		}
		expectRow(t, out, "upstream", upstream, "FAIL")
		if !strings.Contains(out, upstream+" does not answer this node; the node cache's own checks passed") {
			t.Errorf("the summary does not put the failure on %s", upstream)
		}
		clusterRows := "UPSTREAM"
		if cached {
			clusterRows = "ok"
		}
		for _, ip := range []string{simnode.LinkLocalIP, simnode.KubeDNSClusterIP} {
			expectRow(t, out, "address", ip, "ok")
			expectRow(t, out, "answer", ip+" "+name+" A/udp", clusterRows)
			expectRow(t, out, "answer", ip+" "+name+" A/tcp", clusterRows)
			expectRow(t, out, "answer", ip+" www.example.org. A", "ok")
			expectRow(t, out, "answer", ip+" corp.example. A", "ok")
			expectRow(t, out, "conntrack", ip, "ok")
			if !cached {
				expectRow(t, out, "answer", ip+" reverse", "UPSTREAM")
			}
		}
		expectRow(t, out, "link", "nodelocaldns", "ok")
		expectRow(t, out, "rules", "IPv4 raw/NODELOCALDNS", "ok")
		expectRow(t, out, "fail-open", "", "ok")
		expectRow(t, out, "ready", ":8181/ready", "ok")
		expectRow(t, out, "health", ":8080/health", "ok")
		for _, r := range tableRows(out) {
			if r.result == "FAIL" && r.check != "upstream" {
				t.Errorf("row %s %s fails: only the upstream row may", r.check, r.target)
			}
		}
	}

	// Hung: connections are accepted, nothing answers. A name the cache never asked for times out.
	if err := vn.clusterDNS.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	out, code = vn.verify(t, "-verify.name", "web.default.svc.cluster.local")
	t.Logf("cluster DNS hung:\n%s", out)
	expectOutage(out, code, "web.default.svc.cluster.local", false)

	// Gone: connections are refused. The name asked on the healthy node is served from the cache; a new
	// one gets SERVFAIL.
	if err := vn.clusterDNS.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = vn.clusterDNS.Wait(10 * time.Second) // killed; its exit status is "signal: killed"
	if !vn.clusterDNS.Exited() {
		t.Fatal("the cluster DNS did not exit on SIGKILL")
	}
	out, code = vn.verify(t)
	t.Logf("cluster DNS gone:\n%s", out)
	expectOutage(out, code, "kubernetes.default.svc.cluster.local", true)
	expectRow(t, out, "answer", simnode.LinkLocalIP+" 1.0.96.10.in-addr.arpa. PTR", "ok")

	out, code = vn.verify(t, "-verify.name", "kube-dns.kube-system.svc.cluster.local")
	t.Logf("cluster DNS gone, a name the cache does not hold:\n%s", out)
	expectOutage(out, code, "kube-dns.kube-system.svc.cluster.local", false)
	if !strings.Contains(out, "SERVFAIL") {
		t.Errorf("no answer row shows the cache's SERVFAIL")
	}
}

// tableRow is one row of the -verify table.
type tableRow struct{ check, target, result string }

var tableRowRE = regexp.MustCompile(`(?m)^(\S+)\s+(\S.*?)\s+(ok|FAIL|UPSTREAM|skipped)\s`)

// tableRows parses the -verify table.
func tableRows(table string) []tableRow {
	var rows []tableRow
	for _, m := range tableRowRE.FindAllStringSubmatch(table, -1) {
		rows = append(rows, tableRow{m[1], m[2], m[3]})
	}
	return rows
}

// expectRow fails the test unless the -verify table has exactly one row of check whose target contains
// target, with result.
func expectRow(t *testing.T, table, check, target, result string) {
	t.Helper()
	row := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(check) + `\s+(\S.*?)\s+(ok|FAIL|UPSTREAM|skipped)\s`)
	var found []string
	for _, m := range row.FindAllStringSubmatch(table, -1) {
		if strings.Contains(m[1], target) {
			found = append(found, m[2])
		}
	}
	if len(found) != 1 || found[0] != result {
		t.Errorf("rows %q for %q: %v, want one %s", check, target, found, result)
	}
}

// startClusterDNSWithReverse runs the cluster-DNS Pod as simnode does, and also answers PTR queries for
// the Service range, as the kubernetes plugin does.
func startClusterDNSWithReverse(t *testing.T, n *simnode.Node, binary string) *simnode.Process {
	t.Helper()
	dir := t.TempDir()
	zone := filepath.Join(dir, "cluster.local.db")
	writeFile(t, zone, []byte(simnode.ClusterZone))
	conf := filepath.Join(dir, "Corefile")
	writeFile(t, conf, []byte(fmt.Sprintf(`cluster.local:53 {
    bind %[1]s
    file %[2]s
}
in-addr.arpa:53 {
    bind %[1]s
    template IN PTR 96.10.in-addr.arpa {
        answer "{{ .Name }} 30 IN PTR kubernetes.default.svc.cluster.local."
    }
}
`, simnode.ClusterDNSPodIP, zone)))
	p := n.Start(n.DNSNS, binary, "-conf", conf)
	if err := n.WaitForDNS(n.DNSNS, "udp", net.JoinHostPort(simnode.ClusterDNSPodIP, "53"), "kubernetes.default.svc.cluster.local", 20*time.Second); err != nil {
		t.Fatalf("cluster DNS: %v\n%s", err, p.Output())
	}
	return p
}
