//go:build linux

package simnode

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/privtest"
)

// IPv6 addresses of a dual-stack Node (NewDualStack), beside the IPv4 ones: unique local ranges, a /64 per
// link, and the ClusterIPs and node-local address of the dual-stack manifest
// (examples/kubernetes/nodelocaldns-dualstack.yaml).
const (
	PodIP6             = "fd00:10:244::2"
	NodePodSideIP6     = "fd00:10:244::1"
	ClusterDNSPodIP6   = "fd00:10:244:1::2"
	NodeDNSSideIP6     = "fd00:10:244:1::1"
	ExtResolverIP6     = "fd00:192:0:2::53"
	NodeExtSideIP6     = "fd00:192:0:2::1"
	KubeDNSClusterIP6  = "fd00:10:96::a"
	UpstreamClusterIP6 = "fd00:10:96::b"
	LinkLocalIP6       = "fd00:169:254::10"
	// PodCIDR6 and ServiceCIDR6 are the cluster's IPv6 Pod and Service ranges, as kube-proxy is told them
	// (--cluster-cidr, the ServiceCIDR object).
	PodCIDR6     = "fd00:10:244::/56"
	ServiceCIDR6 = "fd00:10:96::/112"
)

// DualStackTools lists the commands a dual-stack Node in iptables mode needs on PATH (NFTablesTools in
// nftables mode, where one nft writes both families' tables).
var DualStackTools = append([]string{"ip6tables-restore"}, Tools...)

// NewDualStack builds a simulated node with kube-proxy in mode, as NewWithMode does, and gives it IPv6
// beside IPv4: every link gets an IPv6 address with duplicate address detection off in the namespaces, so
// that it is usable at once, the node forwards IPv6 and routes it to the ext namespace by default, and
// kube-proxy's rules serve both kube-dns ClusterIPs and both kube-dns-upstream ones, in ip6tables' nat
// table (iptables mode) or in `table ip6 kube-proxy` (nftables mode), as kube-proxy's IPv6 proxier writes
// them beside the IPv4 one. The Pod's resolv.conf keeps the IPv4 kube-dns ClusterIP until SetPodNameserver
// says otherwise; the cluster DNS and the node's resolver started afterwards listen on both families.
func NewDualStack(t testing.TB, mode KubeProxyMode) *Node {
	t.Helper()
	if mode == IPTablesMode {
		privtest.RequirePrivileged(t, DualStackTools...)
	}
	n := NewWithMode(t, mode)
	n.addIPv6Links()
	if n.Mode == NFTablesMode {
		n.applyNFT(kubeProxyNFTable(ipv6Family), "kube-proxy's ip6 table")
	} else {
		n.applyRestore("ip6tables-restore", kubeProxyIPTablesRules(ipv6Family), "kube-proxy's ip6tables rules")
	}
	return n
}

// addIPv6Links gives the node's links their IPv6 addresses and routes, and waits until they are usable.
func (n *Node) addIPv6Links() {
	n.t.Helper()
	n.DualStack = true
	// The node namespace's default accept_dad stays as the kernel sets it, so that the cache's own link meets
	// duplicate address detection as on a real node (the cache adds its addresses without it).
	for _, ns := range []string{n.PodNS, n.DNSNS, n.ExtNS} {
		n.mustIn(ns, "sysctl", "-qw", "net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0")
	}
	n.connect6(n.PodNS, "pod", PodIP6, NodePodSideIP6)
	n.connect6(n.DNSNS, "dns", ClusterDNSPodIP6, NodeDNSSideIP6)
	n.connect6(n.ExtNS, "ext", ExtResolverIP6, NodeExtSideIP6)
	n.mustIn(n.NodeNS, "ip", "-6", "route", "add", "default", "via", ExtResolverIP6)
	n.mustIn(n.NodeNS, "sysctl", "-qw", "net.ipv6.conf.all.forwarding=1")
	n.waitForIPv6()
}

// connect6 puts IPv6 addresses on the veth pair connect made between ns and the node namespace: ip/64 in
// ns with a default route via nodeIP, nodeIP/64 on the node side.
func (n *Node) connect6(ns, name, ip, nodeIP string) {
	n.t.Helper()
	nodeSide, otherSide := "to-"+name, "eth0"
	n.mustIn(n.NodeNS, "sysctl", "-qw", "net.ipv6.conf."+nodeSide+".accept_dad=0")
	n.mustIn(ns, "sysctl", "-qw", "net.ipv6.conf."+otherSide+".accept_dad=0")
	n.mustIn(n.NodeNS, "ip", "-6", "addr", "add", nodeIP+"/64", "dev", nodeSide, "nodad")
	n.mustIn(ns, "ip", "-6", "addr", "add", ip+"/64", "dev", otherSide, "nodad")
	n.mustIn(ns, "ip", "-6", "route", "add", "default", "via", nodeIP)
}

// waitForIPv6 waits until no address of the namespaces is tentative: the links' own fe80:: addresses were
// made when connect brought them up, before duplicate address detection was off, and neighbour discovery
// answers from them.
func (n *Node) waitForIPv6() {
	n.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for _, ns := range []string{n.NodeNS, n.PodNS, n.DNSNS, n.ExtNS} {
		for {
			out := n.mustIn(ns, "ip", "-6", "addr", "show", "tentative")
			if strings.TrimSpace(out) == "" {
				break
			}
			if time.Now().After(deadline) {
				n.t.Fatalf("simnode: IPv6 addresses of %s still tentative after a minute:\n%s", ns, out)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// ipFamily holds what kube-proxy's rules of one family name: its table and match keywords and the
// simulated cluster's addresses in that family.
type ipFamily struct {
	// nft is the nftables family and address match keyword ("ip", "ip6"); addrType its set type.
	nft, addrType string
	// prefixLen is a host route's length (32, 128).
	prefixLen                                              int
	kubeDNS, upstream, clusterDNSPod, podCIDR, serviceCIDR string
}

// ipv4Family and ipv6Family are the simulated cluster's two families.
var ipv4Family = ipFamily{
	nft: "ip", addrType: "ipv4_addr", prefixLen: 32,
	kubeDNS: KubeDNSClusterIP, upstream: UpstreamClusterIP, clusterDNSPod: ClusterDNSPodIP,
	podCIDR: ClusterCIDR, serviceCIDR: ServiceCIDR,
}

var ipv6Family = ipFamily{
	nft: "ip6", addrType: "ipv6_addr", prefixLen: 128,
	kubeDNS: KubeDNSClusterIP6, upstream: UpstreamClusterIP6, clusterDNSPod: ClusterDNSPodIP6,
	podCIDR: PodCIDR6, serviceCIDR: ServiceCIDR6,
}

// hostPort joins an address and port, bracketing IPv6 addresses.
func hostPort(ip string, port int) string { return net.JoinHostPort(ip, strconv.Itoa(port)) }

// chainPart is an address as kube-proxy's nftables mode puts it into a chain name (an IPv6 address's
// colons become dots, which chain names allow), and without separators into the made-up hash.
func chainPart(ip string) (name, hash string) {
	return strings.ReplaceAll(ip, ":", "."), strings.NewReplacer(".", "", ":", "").Replace(ip)
}

// kubeProxyIPTablesRules renders the nat rules of kube-proxy's iptables mode for the two DNS Services in
// family f: a rule per ClusterIP and port in KUBE-SERVICES, commented "NAMESPACE/NAME:PORT cluster IP",
// jumping to the Service port's chain, which jumps to the endpoint's chain, which DNATs; masquerading by
// mark. The Service port chains have the same names in both families (kube-proxy hashes the port's name and
// protocol), the endpoint chains do not.
func kubeProxyIPTablesRules(f ipFamily) string {
	var rules strings.Builder
	rules.WriteString("*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n:KUBE-POSTROUTING - [0:0]\n")
	_, hash := chainPart(f.clusterDNSPod)
	sep := func(proto string) string { return fmt.Sprintf("KUBE-SEP-%s%.16s", strings.ToUpper(proto), hash) }
	for _, proto := range []string{"udp", "tcp"} {
		fmt.Fprintf(&rules, ":%s - [0:0]\n", sep(proto))
	}
	for _, chain := range KubeProxyServiceChains {
		fmt.Fprintf(&rules, ":%s - [0:0]\n", chain)
	}
	rules.WriteString("-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n")
	rules.WriteString("-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n")
	rules.WriteString("-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n")
	rules.WriteString("-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\n")
	rules.WriteString("-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN\n")
	rules.WriteString("-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0\n")
	rules.WriteString("-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE\n")
	for _, svc := range []struct{ name, ip string }{{"kube-dns", f.kubeDNS}, {"kube-dns-upstream", f.upstream}} {
		for _, port := range []struct{ name, proto string }{{"dns", "udp"}, {"dns-tcp", "tcp"}} {
			name := "kube-system/" + svc.name + ":" + port.name
			chain := KubeProxyServiceChains[name]
			fmt.Fprintf(&rules, "-A KUBE-SERVICES -d %s/%d -p %s -m comment --comment \"%s cluster IP\" -m %s --dport 53 -j %s\n",
				svc.ip, f.prefixLen, port.proto, name, port.proto, chain)
			fmt.Fprintf(&rules, "-A %s ! -s %s -d %s/%d -p %s -m comment --comment \"%s cluster IP\" -m %s --dport 53 -j KUBE-MARK-MASQ\n",
				chain, f.podCIDR, svc.ip, f.prefixLen, port.proto, name, port.proto)
			fmt.Fprintf(&rules, "-A %s -m comment --comment \"%s -> %s\" -j %s\n", chain, name, hostPort(f.clusterDNSPod, 53), sep(port.proto))
		}
	}
	for _, proto := range []string{"udp", "tcp"} {
		fmt.Fprintf(&rules, "-A %s -s %s/%d -j KUBE-MARK-MASQ\n", sep(proto), f.clusterDNSPod, f.prefixLen)
		fmt.Fprintf(&rules, "-A %s -p %s -m %s -j DNAT --to-destination %s\n", sep(proto), proto, proto, hostPort(f.clusterDNSPod, 53))
	}
	rules.WriteString("COMMIT\n")
	return rules.String()
}

// kubeProxyNFTable renders kube-proxy's nftables-mode table of family f (pkg/proxy/nftables: one table per
// family, `table ip kube-proxy` and `table ip6 kube-proxy`) for the two DNS Services, each with the
// cluster-DNS Pod as its one endpoint, over UDP and TCP.
func kubeProxyNFTable(f ipFamily) string {
	var b strings.Builder
	fmt.Fprintf(&b, `table %[1]s kube-proxy {
	comment "rules for kube-proxy"
	set cluster-ips { type %[2]s; comment "Active ClusterIPs"; }
	map service-ips { type %[2]s . inet_proto . inet_service : verdict; comment "ClusterIP, ExternalIP and LoadBalancer IP traffic"; }
	chain mark-for-masquerade { mark set mark or 0x4000; }
	chain masquerading {
		mark and 0x4000 == 0 return
		mark set mark xor 0x4000
		masquerade fully-random
	}
	chain services { %[1]s daddr . meta l4proto . th dport vmap @service-ips; }
	chain cluster-ips-check {
		%[1]s daddr @cluster-ips reject comment "Reject traffic to invalid ports of ClusterIPs"
		%[1]s daddr %[3]s drop comment "Drop traffic to unallocated ClusterIPs"
	}
	chain filter-forward { type filter hook forward priority -110; policy accept; ct state new jump cluster-ips-check; }
	chain filter-output-post-dnat { type filter hook output priority -90; policy accept; ct state new jump cluster-ips-check; }
	chain nat-prerouting { type nat hook prerouting priority dstnat; policy accept; jump services; }
	chain nat-output { type nat hook output priority -100; policy accept; jump services; }
	chain nat-postrouting { type nat hook postrouting priority srcnat; policy accept; jump masquerading; }
`, f.nft, f.addrType, f.serviceCIDR)
	services := map[string]string{f.kubeDNS: "kube-dns", f.upstream: "kube-dns-upstream"}
	epName, _ := chainPart(f.clusterDNSPod)
	elements := make([]string, 0, 4)
	for _, ip := range []string{f.kubeDNS, f.upstream} {
		_, ipHash := chainPart(ip)
		for _, proto := range []string{"udp", "tcp"} {
			name := fmt.Sprintf("kube-system/%s/%s/dns", services[ip], proto)
			svcChain := "service-" + strings.ToUpper(proto) + "DNS" + ipHash + "-" + name
			epChain := "endpoint-" + strings.ToUpper(proto) + "EP" + ipHash + "-" + name + "__" + epName + "/53"
			fmt.Fprintf(&b, "\tchain %s {\n\t\t%s saddr %s jump mark-for-masquerade\n\t\tmeta l4proto %s dnat to %s\n\t}\n",
				epChain, f.nft, f.clusterDNSPod, proto, hostPort(f.clusterDNSPod, 53))
			fmt.Fprintf(&b, "\tchain %[1]s {\n\t\t%[2]s daddr %[3]s %[4]s dport 53 %[2]s saddr != %[5]s jump mark-for-masquerade\n\t\tnumgen random mod 1 vmap { 0 : goto %[6]s }\n\t}\n",
				svcChain, f.nft, ip, proto, f.podCIDR, epChain)
			elements = append(elements, fmt.Sprintf("%s . %s . 53 : goto %s", ip, proto, svcChain))
		}
	}
	b.WriteString("}\n")
	fmt.Fprintf(&b, "add element %s kube-proxy cluster-ips { %s, %s }\n", f.nft, f.kubeDNS, f.upstream)
	fmt.Fprintf(&b, "add element %s kube-proxy service-ips { %s }\n", f.nft, strings.Join(elements, ", "))
	return b.String()
}

// applyNFT loads an nft script in the node namespace.
func (n *Node) applyNFT(script, what string) {
	n.t.Helper()
	if out, err := n.InWithInput(context.Background(), n.NodeNS, script, "nft", "-f", "-"); err != nil {
		n.t.Fatalf("simnode: installing %s: %v\n%s\ninput:\n%s", what, err, out, script)
	}
}

// applyRestore loads rules with restore (iptables-restore, ip6tables-restore) in the node namespace,
// keeping the tables' other rules.
func (n *Node) applyRestore(restore, rules, what string) {
	n.t.Helper()
	if out, err := n.InWithInput(context.Background(), n.NodeNS, rules, restore, "--noflush"); err != nil {
		n.t.Fatalf("simnode: installing %s: %v\n%s\ninput:\n%s", what, err, out, rules)
	}
}

// listenAddrs returns ip, and ip6 beside it on a dual-stack node: where a server of the node listens.
func (n *Node) listenAddrs(ip, ip6 string) []string {
	if n.DualStack {
		return []string{ip, ip6}
	}
	return []string{ip}
}

// DualStackKubeProxySetup is the setup of a dual-stack node with a real kube-proxy
// (NewDualStackWithKubeProxy): DefaultKubeProxySetup's IPv4 entries, each followed by its IPv6 one.
func DualStackKubeProxySetup() KubeProxySetup {
	p, a := netip.MustParsePrefix, netip.MustParseAddr
	s := DefaultKubeProxySetup()
	s.ServiceCIDRs = append(s.ServiceCIDRs, p(ServiceCIDR6))
	s.ClusterCIDRs = append(s.ClusterCIDRs, p(PodCIDR6))
	s.NodeIPs = append(s.NodeIPs, a(NodeExtSideIP6))
	s.KubeDNS = append(s.KubeDNS, a(KubeDNSClusterIP6))
	s.Upstream = append(s.Upstream, a(UpstreamClusterIP6))
	s.ClusterDNSPods = append(s.ClusterDNSPods, a(ClusterDNSPodIP6))
	return s
}

// NewDualStackWithKubeProxy builds the dual-stack node of NewDualStack with a real kube-proxy in mode
// writing both families' rules (NewWithKubeProxySetup with DualStackKubeProxySetup): the Services are
// RequireDualStack, each with a ClusterIP of each family, and the cluster-DNS Pod has an endpoint in each.
// api is the test binary's SharedAPI, or nil for an API server of the node's own.
func NewDualStackWithKubeProxy(t testing.TB, api *SharedAPI, mode KubeProxyMode) *Node {
	t.Helper()
	setup := DualStackKubeProxySetup()
	setup.API = api
	return NewWithKubeProxySetup(t, mode, setup)
}

// dualStack reports whether the setup gives the Services a ClusterIP of each family.
func (s KubeProxySetup) dualStack() bool { return len(s.KubeDNS) > 1 }
