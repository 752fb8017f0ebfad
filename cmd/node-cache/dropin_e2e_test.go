//go:build linux

package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns"
	"github.com/nodelocaldns/nodelocaldns/corefile"
	"github.com/nodelocaldns/nodelocaldns/test/simnode"
)

// TestUpstreamManifestOnSimulatedNode is the drop-in promise: node-cache started with the arguments of
// upstream's nodelocaldns.yaml, on a Corefile laid out like upstream's template, serves a simulated node in
// iptables mode. Pods keep asking the kube-dns ClusterIP and get answers from the node cache, which sends
// cluster names to the cluster DNS over TCP through kube-dns-upstream and other names to the node's resolver.
func TestUpstreamManifestOnSimulatedNode(t *testing.T) {
	if !nodelocaldns.RegisteredPlugins()["notrack"] {
		t.Skip("the notrack plugin is not compiled into node-cache yet; upstream's arguments turn into notrack directives")
	}
	n := simnode.New(t)
	u := newUpstreamManifestNode(t, n)
	clusterDNS := u.clusterDNS
	writeFile(t, u.base, u.configMap)
	conf := u.conf
	cache := u.start(t)
	u.waitRulesInPlace(t, cache)
	kubeDNS := net.JoinHostPort(simnode.KubeDNSClusterIP, "53")

	for _, q := range []struct{ ns, network, server, name, want string }{
		{n.PodNS, "udp", kubeDNS, "kubernetes.default.svc.cluster.local", "10.96.0.1"},
		{n.PodNS, "tcp", kubeDNS, "web.default.svc.cluster.local", "10.244.2.7"},
		{n.PodNS, "udp", kubeDNS, "www.example.org", simnode.ExternalAnswer},
		{n.NodeNS, "udp", net.JoinHostPort(simnode.LinkLocalIP, "53"), "kube-dns.kube-system.svc.cluster.local", "10.96.0.10"},
	} {
		r, err := n.Query(q.ns, q.network, q.server, q.name, dns.TypeA)
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != q.want {
			t.Errorf("%s from %s via %s: got %v, want %s", q.name, q.ns, q.server, r.Answer, q.want)
		}
	}
	written, err := os.ReadFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"notrack", "upstreamsvc kube-dns-upstream kube-system", "forward . /etc/resolv.conf"} {
		if !strings.Contains(string(written), want) {
			t.Errorf("written Corefile lacks %q:\n%s", want, written)
		}
	}
	// Every cluster name reached the cluster DNS over TCP, none over UDP.
	log := clusterDNS.Output()
	if got := simnode.CountQueries(log, "web.default.svc.cluster.local", "tcp"); got != 1 {
		t.Errorf("cluster DNS saw %d TCP queries for web.default.svc, want 1\n%s", got, log)
	}
	if got := simnode.CountQueries(log, "web.default.svc.cluster.local", "udp"); got != 0 {
		t.Errorf("cluster DNS saw %d UDP queries for web.default.svc, want 0", got)
	}
}

// upstreamManifestNode is a simulated node with the cluster DNS and the node's resolver running, and the files
// upstream's nodelocaldns.yaml gives node-cache: the ConfigMap's Corefile (base) and the Corefile it writes
// (conf).
type upstreamManifestNode struct {
	n          *simnode.Node
	binary     string // the image's /node-cache, with node-cache-full beside it
	clusterDNS *simnode.Process
	dir        string
	base, conf string
	// configMap is upstream's ConfigMap template after its install instructions substituted the domain and the
	// two addresses.
	configMap []byte
}

func newUpstreamManifestNode(t *testing.T, n *simnode.Node) *upstreamManifestNode {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	binary, err := simnode.BuildNodeCache(ctx, t.TempDir())
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	u := &upstreamManifestNode{n: n, binary: binary, dir: t.TempDir()}
	u.clusterDNS = n.StartClusterDNS(binary)
	n.StartExternalResolver(binary)

	// The node's resolv.conf, as the node cache sees it (dnsPolicy: Default).
	netnsDir := filepath.Join("/etc/netns", n.NodeNS)
	if err := os.MkdirAll(netnsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(netnsDir) })
	writeFile(t, filepath.Join(netnsDir, "resolv.conf"), []byte("nameserver "+simnode.ExtResolverIP+"\n"))

	template, err := os.ReadFile(filepath.Join("..", "..", "corefile", "testdata", "upstream-template.Corefile"))
	if err != nil {
		t.Fatal(err)
	}
	u.configMap = []byte(strings.NewReplacer(corefile.DNSDomainVar, simnode.ClusterDomain, corefile.LocalDNSVar, simnode.LinkLocalIP,
		corefile.DNSServerVar, simnode.KubeDNSClusterIP).Replace(string(template)))
	u.base, u.conf = filepath.Join(u.dir, "Corefile.base"), filepath.Join(u.dir, "Corefile")
	return u
}

// start runs node-cache in the node namespace with upstream's arguments.
func (u *upstreamManifestNode) start(t *testing.T) *simnode.Process {
	t.Helper()
	// What the kubelet puts in every Pod's environment for the kube-dns-upstream Service, and an xtables
	// lock of this test's own so that tests running beside it never wait for each other.
	env := append(os.Environ(), "KUBE_DNS_UPSTREAM_SERVICE_HOST="+simnode.UpstreamClusterIP, "KUBE_DNS_UPSTREAM_SERVICE_PORT=53",
		"XTABLES_LOCKFILE="+filepath.Join(u.dir, "xtables.lock"))
	cache := u.n.StartEnv(u.n.NodeNS, env, u.binary, "-localip", simnode.LinkLocalIP+","+simnode.KubeDNSClusterIP, "-conf", u.conf,
		"-upstreamsvc", "kube-dns-upstream", "-pidfile", filepath.Join(u.dir, "node-cache.pid"), "-basecorefile", u.base,
		"-lockfile", filepath.Join(u.dir, "nodelocaldns.lock"))
	t.Cleanup(func() {
		if !cache.Exited() {
			_ = cache.Signal(syscall.SIGTERM)
			_ = cache.Wait(10 * time.Second)
		}
	})
	return cache
}

// waitRulesInPlace waits until notrack reports its rules in place for both addresses. kube-proxy's DNAT
// answers 10.96.0.10 before the cache exists, so an answer proves nothing: only then do Pod lookups stop at
// the node.
func (u *upstreamManifestNode) waitRulesInPlace(t *testing.T, cache *simnode.Process) {
	t.Helper()
	rulesInPlace := func() bool {
		for line := range strings.SplitSeq(cache.Output(), "\n") {
			if strings.Contains(line, "plugin/notrack: rules in place for") &&
				strings.Contains(line, simnode.LinkLocalIP+":53") && strings.Contains(line, simnode.KubeDNSClusterIP+":53") {
				return true
			}
		}
		return false
	}
	deadline := time.Now().Add(20 * time.Second)
	for !rulesInPlace() {
		if cache.Exited() || time.Now().After(deadline) {
			t.Fatalf("notrack did not report rules in place for both addresses:\n%s", cache.Output())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestUpstreamConfigMapWithTrace is the drop-in promise for a ConfigMap that uses trace, which the image's
// lean build leaves out: a ConfigMap change that brings trace in stops the lean build, as SIGTERM does, and
// started again, as the kubelet restarts the container, the lean build runs the full one, which serves.
func TestUpstreamConfigMapWithTrace(t *testing.T) {
	if !nodelocaldns.RegisteredPlugins()["notrack"] {
		t.Skip("the notrack plugin is not compiled into node-cache yet")
	}
	n := simnode.New(t)
	u := newUpstreamManifestNode(t, n)
	writeFile(t, u.base, u.configMap)
	cache := u.start(t)
	u.waitRulesInPlace(t, cache)
	if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", cache.Cmd.Process.Pid)); err != nil || exe != u.binary {
		t.Fatalf("without trace the cache runs %q (%v), want the lean build %s", exe, err, u.binary)
	}

	// trace in the cluster block, sending spans nowhere that answers (a closed loopback port).
	traced := strings.Replace(string(u.configMap), "  errors\n", "  errors\n  trace zipkin 127.0.0.1:9\n", 1)
	if traced == string(u.configMap) {
		t.Fatal("no errors line in upstream's template to put trace after")
	}
	writeFile(t, u.base, []byte(traced))
	if err := cache.Wait(2 * time.Minute); err != nil {
		t.Fatalf("the lean build did not stop cleanly for trace: %v\n%s", err, cache.Output())
	}
	if !strings.Contains(cache.Output(), "the Corefile now uses trace, which this lean build leaves out") {
		t.Errorf("no log line saying why the lean build stopped:\n%s", cache.Output())
	}

	restarted := u.start(t)
	u.waitRulesInPlace(t, restarted)
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", restarted.Cmd.Process.Pid))
	if err != nil || exe != u.binary+fullBuildSuffix {
		t.Errorf("with trace the cache runs %q (%v), want the full build %s", exe, err, u.binary+fullBuildSuffix)
	}
	r, err := n.Query(n.PodNS, "udp", net.JoinHostPort(simnode.KubeDNSClusterIP, "53"), "web.default.svc.cluster.local", dns.TypeA)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != "10.244.2.7" {
		t.Errorf("web.default.svc from the Pod through the full build: got %v", r.Answer)
	}
	if written, err := os.ReadFile(u.conf); err != nil || !strings.Contains(string(written), "trace zipkin") {
		t.Errorf("the Corefile the full build serves lacks trace: %v\n%s", err, written)
	}
}
