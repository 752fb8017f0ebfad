package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/corefile"
	"github.com/nodelocaldns/nodelocaldns/test/simnode"
)

// TestUpstreamManifestOnSimulatedNode is the drop-in promise: node-cache started with the arguments of
// upstream's nodelocaldns.yaml, on a Corefile laid out like upstream's template, serves a simulated node in
// iptables mode. Pods keep asking the kube-dns ClusterIP and get answers from the node cache, which sends
// cluster names to the cluster DNS over TCP through kube-dns-upstream and other names to the node's resolver.
func TestUpstreamManifestOnSimulatedNode(t *testing.T) {
	if !registeredDNSPlugins()["notrack"] {
		t.Skip("the notrack plugin is not compiled into node-cache yet; upstream's arguments turn into notrack directives")
	}
	n := simnode.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	binary, err := simnode.BuildNodeCache(ctx, t.TempDir())
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	clusterDNS := n.StartClusterDNS(binary)
	n.StartExternalResolver(binary)

	// The node's resolv.conf, as the node cache sees it (dnsPolicy: Default).
	netnsDir := filepath.Join("/etc/netns", n.NodeNS)
	if err := os.MkdirAll(netnsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(netnsDir) })
	writeFile(t, filepath.Join(netnsDir, "resolv.conf"), []byte("nameserver "+simnode.ExtResolverIP+"\n"))

	// The ConfigMap after upstream's install instructions substituted the domain and the two addresses.
	template, err := os.ReadFile(filepath.Join("..", "..", "corefile", "testdata", "upstream-template.Corefile"))
	if err != nil {
		t.Fatal(err)
	}
	applied := strings.NewReplacer(corefile.DNSDomainVar, simnode.ClusterDomain, corefile.LocalDNSVar, simnode.LinkLocalIP,
		corefile.DNSServerVar, simnode.KubeDNSClusterIP).Replace(string(template))
	dir := t.TempDir()
	base, conf := filepath.Join(dir, "Corefile.base"), filepath.Join(dir, "Corefile")
	writeFile(t, base, []byte(applied))
	// What the kubelet puts in every Pod's environment for the kube-dns-upstream Service, and an xtables
	// lock of this test's own so that tests running beside it never wait for each other.
	env := append(os.Environ(), "KUBE_DNS_UPSTREAM_SERVICE_HOST="+simnode.UpstreamClusterIP, "KUBE_DNS_UPSTREAM_SERVICE_PORT=53",
		"XTABLES_LOCKFILE="+filepath.Join(dir, "xtables.lock"))
	cache := n.StartEnv(n.NodeNS, env, binary, "-localip", simnode.LinkLocalIP+","+simnode.KubeDNSClusterIP, "-conf", conf,
		"-upstreamsvc", "kube-dns-upstream", "-pidfile", filepath.Join(dir, "node-cache.pid"), "-basecorefile", base,
		"-lockfile", filepath.Join(dir, "nodelocaldns.lock"))
	t.Cleanup(func() {
		if !cache.Exited() {
			_ = cache.Signal(syscall.SIGTERM)
			_ = cache.Wait(10 * time.Second)
		}
	})
	// kube-proxy's DNAT answers 10.96.0.10 before the cache exists, so an answer proves nothing: the rules
	// are in place once notrack says so, and only then do Pod lookups stop at the node.
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
