//go:build linux

package simnode

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// TestDualStackWithoutCacheLookupsAreDNATed checks the dual-stack simulated node itself, with kube-proxy in
// each mode, its rules written by hand and by a real kube-proxy in dual-stack: with no node cache, a Pod's
// lookups to either kube-dns ClusterIP are DNATed to the cluster-DNS Pod in the same family, each leaving a
// conntrack entry, and the node's own lookups to either kube-dns-upstream ClusterIP take kube-proxy's
// output path.
func TestDualStackWithoutCacheLookupsAreDNATed(t *testing.T) {
	for _, mode := range []KubeProxyMode{IPTablesMode, NFTablesMode} {
		t.Run(string(mode), func(t *testing.T) { testDualStackWithoutCache(t, NewDualStack(t, mode)) })
		t.Run(string(mode)+"/kube-proxy", func(t *testing.T) { testDualStackWithoutCache(t, NewDualStackWithKubeProxy(t, &kubeAPI, mode)) })
	}
}

func testDualStackWithoutCache(t *testing.T, n *Node) {
	mode := n.Mode
	clusterDNS := n.StartClusterDNS(nodeCache)
	if mode == NFTablesMode {
		out, err := n.In(context.Background(), n.NodeNS, "nft", "list", "tables")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out, "table ip kube-proxy") || !strings.Contains(out, "table ip6 kube-proxy") {
			t.Errorf("kube-proxy's tables in nftables mode, want ip and ip6 kube-proxy:\n%s", out)
		}
		if _, err := n.Query(n.PodNS, "tcp", net.JoinHostPort(KubeDNSClusterIP6, "5353"), "kubernetes.default.svc.cluster.local", dns.TypeA); err == nil ||
			!strings.Contains(err.Error(), "refused") {
			t.Errorf("a query to another port of the IPv6 ClusterIP: %v, want connection refused (cluster-ips-check)", err)
		}
	}
	if err := n.FlushConntrack(); err != nil {
		t.Fatal(err)
	}
	const lookups = 3
	n.SetPodNameserver(KubeDNSClusterIP6)
	for range lookups {
		out, err := n.In(context.Background(), n.PodNS, "getent", "ahosts", "web")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out, "fd00:10:244:2::7 ") || !strings.Contains(out, "10.244.2.7 ") {
			t.Fatalf("getent ahosts web through %s = %q, want its AAAA and A", KubeDNSClusterIP6, out)
		}
	}
	for _, family := range []struct{ clusterIP, endpoint string }{{KubeDNSClusterIP6, ClusterDNSPodIP6}, {KubeDNSClusterIP, ""}} {
		entries, err := n.ConntrackEntries("udp", family.clusterIP)
		if err != nil {
			t.Fatal(err)
		}
		if family.endpoint == "" {
			if len(entries) != 0 {
				t.Errorf("a Pod whose nameserver is %s made conntrack entries to %s:\n%s", KubeDNSClusterIP6, family.clusterIP, strings.Join(entries, "\n"))
			}
			continue
		}
		if len(entries) < lookups {
			t.Errorf("conntrack has %d entries to [%s]:53, want at least %d (one per lookup):\n%s",
				len(entries), family.clusterIP, lookups, strings.Join(entries, "\n"))
		}
		for _, e := range entries {
			if !strings.Contains(e, "src="+family.endpoint+" ") {
				t.Errorf("a lookup to %s was not DNATed to %s: %s", family.clusterIP, family.endpoint, e)
			}
		}
	}
	// The cluster DNS logs its client: Pod lookups reach it over IPv6, from the Pod's address.
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(clusterDNS.Output(), "["+PodIP6+"]:") && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(clusterDNS.Output(), "["+PodIP6+"]:") {
		t.Errorf("the cluster DNS never logged a query from the Pod's IPv6 address:\n%s", clusterDNS.Output())
	}

	// Host-network traffic to either kube-dns-upstream ClusterIP takes kube-proxy's OUTPUT path.
	for _, upstream := range []string{UpstreamClusterIP6, UpstreamClusterIP} {
		for _, proto := range []string{"udp", "tcp"} {
			r, err := n.Query(n.NodeNS, proto, net.JoinHostPort(upstream, "53"), "kubernetes.default.svc.cluster.local", dns.TypeA)
			if err != nil {
				t.Fatal(err)
			}
			if len(r.Answer) != 1 {
				t.Fatalf("answer through %s over %s: %v", upstream, proto, r)
			}
		}
	}
}
