//go:build linux

package simnode

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/kubeapi"
)

var nodeCache string

// kubeAPI is the API server of the package's nodes with a real kube-proxy.
var kubeAPI SharedAPI

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "simnode")
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	nodeCache, err = BuildNodeCache(ctx, dir)
	cancel()
	if err != nil {
		os.RemoveAll(dir)
		panic(err)
	}
	code := m.Run()
	os.RemoveAll(dir)
	if err := kubeAPI.Stop(); err != nil {
		panic(err)
	}
	os.Exit(code)
}

// TestWithoutCacheLookupsAreDNATed checks the simulated node itself, with kube-proxy in each mode: with no
// node cache, a Pod's lookup to the kube-dns ClusterIP is DNATed to the cluster-DNS Pod and leaves a
// conntrack entry per lookup, which is the behaviour the node cache exists to remove.
func TestWithoutCacheLookupsAreDNATed(t *testing.T) {
	for _, mode := range []KubeProxyMode{IPTablesMode, NFTablesMode} {
		t.Run(string(mode), func(t *testing.T) { testWithoutCache(t, NewWithMode(t, mode)) })
		t.Run("real-"+string(mode), func(t *testing.T) { testWithoutCache(t, NewWithKubeProxy(t, &kubeAPI, mode)) })
	}
}

func testWithoutCache(t *testing.T, n *Node) {
	mode := n.Mode
	clusterDNS := n.StartClusterDNS(nodeCache)
	if mode == NFTablesMode {
		// kube-proxy's nftables mode leaves iptables alone, and rejects new connections to a ClusterIP's
		// other ports.
		for _, save := range []string{"iptables-nft-save", "iptables-legacy-save"} {
			if out, err := n.In(context.Background(), n.NodeNS, save); err == nil && strings.Contains(out, "KUBE-") {
				t.Errorf("%s in nftables mode:\n%s", save, out)
			}
		}
		if _, err := n.Query(n.PodNS, "tcp", KubeDNSClusterIP+":5353", "kubernetes.default.svc.cluster.local", dns.TypeA); err == nil ||
			!strings.Contains(err.Error(), "refused") {
			t.Errorf("a query to another port of the ClusterIP: %v, want connection refused (cluster-ips-check)", err)
		}
	}

	if err := n.FlushConntrack(); err != nil {
		t.Fatal(err)
	}
	const lookups = 3
	for range lookups {
		// getent in the Pod uses glibc's resolver with the Pod's resolv.conf: a fresh source port each time.
		out, err := n.In(context.Background(), n.PodNS, "getent", "hosts", "kubernetes.default")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(out, "10.96.0.1 ") {
			t.Fatalf("getent hosts kubernetes.default = %q, want 10.96.0.1", out)
		}
	}
	entries, err := n.ConntrackEntries("udp", KubeDNSClusterIP)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) < lookups {
		t.Errorf("conntrack has %d entries to %s:53, want at least %d (one per lookup):\n%s",
			len(entries), KubeDNSClusterIP, lookups, strings.Join(entries, "\n"))
	}
	if got := WaitForQueries(clusterDNS, "kubernetes.default.svc.cluster.local", "udp", lookups, 30*time.Second); got < lookups {
		t.Errorf("cluster DNS saw %d UDP queries, want at least %d", got, lookups)
	}

	// Host-network traffic to the kube-dns-upstream ClusterIP takes kube-proxy's OUTPUT path, as the node
	// cache's own TCP forwards will.
	r, err := n.Query(n.NodeNS, "tcp", UpstreamClusterIP+":53", "kubernetes.default.svc.cluster.local", dns.TypeA)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Answer) != 1 {
		t.Fatalf("answer through %s: %v", UpstreamClusterIP, r)
	}
}

func TestExternalResolverAnswersOutsideNames(t *testing.T) {
	n := New(t)
	ext := n.StartExternalResolver(nodeCache)
	r, err := n.Query(n.NodeNS, "udp", ExtResolverIP+":53", "example.org", dns.TypeA)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != ExternalAnswer {
		t.Fatalf("answer = %v, want %s", r.Answer, ExternalAnswer)
	}
	if got := WaitForQueries(ext, "example.org", "udp", 1, 30*time.Second); got != 1 {
		t.Errorf("external resolver logged %d queries for example.org, want 1:\n%s", got, ext.Output())
	}
}

// TestLoadCountsEveryLookup runs the Pod-side load client against the cluster DNS through kube-proxy's
// DNAT, and against an address nobody serves: every lookup is counted, answered or failed.
func TestLoadCountsEveryLookup(t *testing.T) {
	n := New(t)
	n.StartClusterDNS(nodeCache)
	ctx := context.Background()
	res, err := n.RunLoad(ctx, n.PodNS, Load{
		Server: KubeDNSClusterIP + ":53", Name: "kubernetes.default.svc.cluster.local",
		Rate: 500, Duration: time.Second, Timeout: time.Second, Sockets: 16, SocketReuse: 10,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kube-dns ClusterIP: %v", res)
	if res.Sent != 500 || res.Answered != 500 || res.Failed() != 0 {
		t.Errorf("through kube-proxy: %v, want 500 answered", res)
	}
	// The link-local address is not on the node: the lookups time out (nothing answers) or are refused.
	res, err = n.RunLoad(ctx, n.PodNS, Load{
		Server: LinkLocalIP + ":53", Name: "kubernetes.default.svc.cluster.local",
		Rate: 50, Duration: time.Second, Timeout: 200 * time.Millisecond, Sockets: 4, SocketReuse: 5,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("unserved address: %v", res)
	if res.Sent != 50 || res.Answered != 0 || res.Failed() != 50 || len(res.Failures) != 50 {
		t.Errorf("to an address nobody serves: %v, want 50 failed", res)
	}
}

// TestRealKubeProxyFollowsTheEndpointSlice: on a node with the real kube-proxy, SetUpstreamEndpoint changes
// kube-dns-upstream's EndpointSlice and returns once kube-proxy's rules send the ClusterIP to the new Pod;
// with no endpoint at all kube-proxy rejects lookups to it, and kube-dns keeps its endpoint throughout.
func TestRealKubeProxyFollowsTheEndpointSlice(t *testing.T) {
	for _, mode := range []KubeProxyMode{IPTablesMode, NFTablesMode} {
		t.Run(string(mode), func(t *testing.T) {
			n := NewWithKubeProxy(t, &kubeAPI, mode)
			n.StartClusterDNS(nodeCache)
			second := n.AddClusterDNSPod()
			moved := n.StartClusterDNSIn(nodeCache, second, SecondClusterDNSPodIP)
			n.SetUpstreamEndpoint(SecondClusterDNSPodIP)
			// A name the start's probe does not ask for.
			const name = "kube-dns.kube-system.svc.cluster.local"
			if _, err := n.Query(n.NodeNS, "udp", UpstreamClusterIP+":53", name, dns.TypeA); err != nil {
				t.Fatalf("kube-dns-upstream once it moved: %v", err)
			}
			if got := WaitForQueries(moved, name, "udp", 1, 30*time.Second); got != 1 {
				t.Errorf("the second cluster-DNS Pod saw %d queries, want 1:\n%s", got, moved.Output())
			}
			n.KubeProxy.SetUpstreamEndpoints()
			if _, err := n.Query(n.NodeNS, "tcp", UpstreamClusterIP+":53", "kubernetes.default.svc.cluster.local", dns.TypeA); err == nil {
				t.Errorf("kube-dns-upstream without endpoints answered over TCP")
			}
			if _, err := n.Query(n.PodNS, "udp", KubeDNSClusterIP+":53", "kubernetes.default.svc.cluster.local", dns.TypeA); err != nil {
				t.Errorf("kube-dns while kube-dns-upstream has no endpoint: %v", err)
			}
			n.SetUpstreamEndpoint(ClusterDNSPodIP)
			if _, err := n.Query(n.NodeNS, "tcp", UpstreamClusterIP+":53", "kubernetes.default.svc.cluster.local", dns.TypeA); err != nil {
				t.Errorf("kube-dns-upstream once its endpoint is back: %v", err)
			}
			m := n.KubeProxy.WaitForSync()
			t.Logf("kube-proxy: %v", m)
		})
	}
}

// TestSharedAPIStartsEachNodeClean: a node on the shared API server finds the objects writeObjects writes,
// not what the previous node's test left (kube-dns-upstream deleted, the churn Service created).
func TestSharedAPIStartsEachNodeClean(t *testing.T) {
	t.Run("leaves", func(t *testing.T) {
		n := NewWithKubeProxy(t, &kubeAPI, IPTablesMode)
		n.KubeProxy.Churn(1)
		n.KubeProxy.DeleteService(UpstreamService)
	})
	t.Run("finds", func(t *testing.T) {
		// Building the node waits until kube-proxy's rules send both DNS Services to the cluster-DNS Pod.
		n := NewWithKubeProxy(t, &kubeAPI, IPTablesMode)
		// The churn Service is created again on first use.
		n.KubeProxy.Churn(1)
	})
}

// refusingTB is t where Fatalf records its message and ends the goroutine.
type refusingTB struct {
	testing.TB
	msg string
}

func (r *refusingTB) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// TestSharedAPIRefusesASecondNode: while a node uses the shared API server, another cannot have it.
func TestSharedAPIRefusesASecondNode(t *testing.T) {
	NewWithKubeProxy(t, &kubeAPI, IPTablesMode)
	second := &refusingTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		kubeAPI.acquire(second, kubeapi.Options{ServiceCIDRs: []string{ServiceCIDR}})
		t.Error("a second node got the shared API server while the first used it")
	}()
	<-done
	if !strings.Contains(second.msg, "in use by the node of "+t.Name()) {
		t.Errorf("the second node's failure is %q, want one naming %s", second.msg, t.Name())
	}
}
