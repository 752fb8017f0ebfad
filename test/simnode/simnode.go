//go:build linux

// Package simnode builds a simulated Kubernetes node out of network namespaces, for end-to-end tests of the
// node cache that must not touch the machine's own network.
//
// The layout mirrors a node running kube-proxy in iptables mode:
//
//	pod  (10.244.0.2) --veth-- node (10.244.0.1)       ClusterFirst client; resolv.conf -> 10.96.0.10
//	dns  (10.244.1.2) --veth-- node (10.244.1.1)       the cluster-DNS Pod (CoreDNS serving cluster.local)
//	ext  (192.0.2.53) --veth-- node (192.0.2.1)        the node's upstream resolver, for names outside the cluster
//
// In the node namespace, kube-proxy's rules DNAT the kube-dns ClusterIP (10.96.0.10) and the
// kube-dns-upstream ClusterIP (10.96.0.11) to the cluster-DNS Pod, for Pod traffic (prerouting) and for
// host-network traffic (output): in iptables mode (IPTablesMode, the default) laid out as kube-proxy lays
// them out (KUBE-SERVICES with a rule per ClusterIP and port commented "NAMESPACE/NAME:PORT cluster IP", a
// KUBE-SVC-* chain per Service port, a KUBE-SEP-* chain per endpoint, masquerading by mark), in nftables
// mode (NFTablesMode) as kube-proxy's `table ip kube-proxy` with its services chain, service-ips verdict
// map, per-Service and per-endpoint chains, the masquerading chains and the cluster-ips-check that rejects
// new connections to a ClusterIP's other ports, and no KUBE-* iptables chain at all. Every address above
// exists only inside namespaces the test created, and every namespace, file and process is removed in
// t.Cleanup, also when the test fails.
//
// NewWithKubeProxy builds the same node with the rules of a real kube-proxy instead (kubeproxy.go):
// kube-proxy at kube-apiserver's version, built by scripts/build-kube-apiserver.sh, runs in the node
// namespace in either mode against a real kube-apiserver (package kubeapi, its Service range ServiceCIDR,
// reached through a relay on the node's loopback) that holds the Node, kube-dns and kube-dns-upstream with
// EndpointSlices for the cluster-DNS Pod. Node.KubeProxy then restarts it, reads its sync metrics, and
// changes the Services' endpoints (AddClusterDNSPod adds a second cluster-DNS Pod to move to), each change
// waiting until kube-proxy's rules show it; a kube-proxy that died or failed a sync fails the test. Its
// KubeProxySetup takes a list per family, for a dual-stack node. A SharedAPI keeps the API server for a
// test binary's later nodes, each starting from the same objects. The hand-written rules remain for tests of
// the cache alone, and for cases a real kube-proxy cannot be made to show.
//
// NewDualStack adds IPv6 beside all of it (ipv6.go), as on a dual-stack cluster: the Pod fd00:10:244::2,
// the cluster-DNS Pod fd00:10:244:1::2 and the node's resolver fd00:192:0:2::53, each on a /64 of its link,
// with duplicate address detection off in those namespaces so that the addresses are usable at once; the
// node forwards IPv6, and kube-proxy's IPv6 rules serve the kube-dns ClusterIP fd00:10:96::a and the
// kube-dns-upstream ClusterIP fd00:10:96::b, in ip6tables' nat table laid out as above (iptables mode) or in
// `table ip6 kube-proxy` (nftables mode, one table per family as kube-proxy's nftables proxier writes
// them). The node-local address of that family is the dual-stack manifest's fd00:169:254::10. The cluster
// DNS and the node's resolver listen on both families, and SetPodNameserver points the Pod at either.
// NewDualStackWithKubeProxy builds the same node with a real kube-proxy in dual-stack writing both
// families' rules (DualStackKubeProxySetup: the Services RequireDualStack, a ClusterIP and an endpoint of
// each family), the IPv6 links in place before it starts.
package simnode

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netns"

	"github.com/nodelocaldns/nodelocaldns/internal/privtest"
)

// Addresses of the simulated node. They live only inside the namespaces a Node creates.
const (
	PodIP             = "10.244.0.2"
	NodePodSideIP     = "10.244.0.1"
	ClusterDNSPodIP   = "10.244.1.2"
	NodeDNSSideIP     = "10.244.1.1"
	ExtResolverIP     = "192.0.2.53"
	NodeExtSideIP     = "192.0.2.1"
	KubeDNSClusterIP  = "10.96.0.10"
	UpstreamClusterIP = "10.96.0.11"
	LinkLocalIP       = "169.254.20.10"
	ClusterDomain     = "cluster.local"
)

// Tools lists the commands a Node needs on PATH; NFTablesTools those of NFTablesMode.
var (
	Tools         = []string{"ip", "iptables", "conntrack", "sysctl"}
	NFTablesTools = []string{"ip", "nft", "conntrack", "sysctl"}
)

// KubeProxyMode is how the simulated kube-proxy writes its rules.
type KubeProxyMode string

// The modes.
const (
	IPTablesMode KubeProxyMode = "iptables"
	NFTablesMode KubeProxyMode = "nftables"
)

// sequence keeps namespace names unique among the Nodes of one test binary.
var sequence atomic.Int32

// Node is one simulated node: four namespaces, the links between them and kube-proxy's DNAT rules.
type Node struct {
	// NodeNS, PodNS, DNSNS and ExtNS are the `ip netns` names of the namespaces.
	NodeNS, PodNS, DNSNS, ExtNS string
	// Mode is the simulated kube-proxy's mode.
	Mode KubeProxyMode
	// DualStack is set on a node that has IPv6 beside IPv4 (NewDualStack).
	DualStack bool
	// KubeProxy is the real kube-proxy of a node built by NewWithKubeProxy, nil where the rules are
	// written by hand.
	KubeProxy *KubeProxy

	t testing.TB
	// extraNS are namespaces added after New (AddClusterDNSPod's), removed with the others.
	extraNS []string
}

// New builds a simulated node with kube-proxy in iptables mode and registers its removal with t.Cleanup.
func New(t testing.TB) *Node {
	t.Helper()
	return NewWithMode(t, IPTablesMode)
}

// NewWithMode builds a simulated node with kube-proxy in mode and registers its removal with t.Cleanup.
func NewWithMode(t testing.TB, mode KubeProxyMode) *Node {
	t.Helper()
	return newNode(t, mode, nil)
}

// newNode builds the node; with setup, a real kube-proxy writes the rules (kubeproxy.go), else they are
// written here.
func newNode(t testing.TB, mode KubeProxyMode, setup *KubeProxySetup) *Node {
	t.Helper()
	if mode == NFTablesMode {
		privtest.RequirePrivileged(t, NFTablesTools...)
	} else {
		privtest.RequirePrivileged(t, Tools...)
	}
	prefix := fmt.Sprintf("sn%d-%d", os.Getpid()%100000, sequence.Add(1))
	n := &Node{
		NodeNS: prefix + "-node",
		PodNS:  prefix + "-pod",
		DNSNS:  prefix + "-dns",
		ExtNS:  prefix + "-ext",
		Mode:   mode,
		t:      t,
	}
	t.Cleanup(n.remove)
	for _, ns := range []string{n.NodeNS, n.PodNS, n.DNSNS, n.ExtNS} {
		n.mustIP("netns", "add", ns)
		n.mustIn(ns, "ip", "link", "set", "lo", "up")
	}
	n.connect(n.PodNS, "pod", PodIP, NodePodSideIP)
	n.connect(n.DNSNS, "dns", ClusterDNSPodIP, NodeDNSSideIP)
	n.connect(n.ExtNS, "ext", ExtResolverIP, NodeExtSideIP)
	// The node's default route points at the ext namespace, as a real node's points at its gateway: the
	// ClusterIPs need a route for host-network traffic before nat OUTPUT rewrites them.
	n.mustIn(n.NodeNS, "ip", "route", "add", "default", "via", ExtResolverIP)
	n.mustIn(n.NodeNS, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	if setup != nil && setup.dualStack() {
		n.addIPv6Links() // before kube-proxy starts, as on a dual-stack node
	}
	switch {
	case setup != nil:
		n.startKubeProxy(*setup)
	case mode == NFTablesMode:
		n.applyNFT(kubeProxyNFTable(ipv4Family), "kube-proxy's nftables table")
	default:
		n.applyRestore("iptables-restore", kubeProxyIPTablesRules(ipv4Family), "kube-proxy's iptables rules")
	}
	n.writePodResolvConf()
	return n
}

// AddPod adds the network namespace of another Pod, removed with the node's: a Pod of its own (its own
// sockets and ports, as every Pod on a node has), joined to the node by a veth, ip/24 on its side and nodeIP
// on the node's, its default route through the node. name tells it from the others (the namespace's suffix
// and the node side's interface, to-NAME); AddPod returns the namespace.
func (n *Node) AddPod(name, ip, nodeIP string) string {
	n.t.Helper()
	ns := strings.TrimSuffix(n.NodeNS, "-node") + "-" + name
	n.mustIP("netns", "add", ns)
	n.extraNS = append(n.extraNS, ns)
	n.mustIn(ns, "ip", "link", "set", "lo", "up")
	n.connect(ns, name, ip, nodeIP)
	return ns
}

// connect joins namespace ns to the node namespace with a veth pair: ns gets ip/24 and a default route via
// nodeIP, the node side gets nodeIP/24.
func (n *Node) connect(ns, name, ip, nodeIP string) {
	// Interface names are per namespace, but the pair is created in the node namespace first.
	nodeSide, otherSide := "to-"+name, "eth0"
	n.mustIn(n.NodeNS, "ip", "link", "add", nodeSide, "type", "veth", "peer", "name", "tmp-"+name)
	n.mustIn(n.NodeNS, "ip", "link", "set", "tmp-"+name, "netns", ns)
	n.mustIn(ns, "ip", "link", "set", "tmp-"+name, "name", otherSide)
	n.mustIn(n.NodeNS, "ip", "addr", "add", nodeIP+"/24", "dev", nodeSide)
	n.mustIn(ns, "ip", "addr", "add", ip+"/24", "dev", otherSide)
	n.mustIn(n.NodeNS, "ip", "link", "set", nodeSide, "up")
	n.mustIn(ns, "ip", "link", "set", otherSide, "up")
	n.mustIn(ns, "ip", "route", "add", "default", "via", nodeIP)
}

// KubeProxyServiceChains names kube-proxy's chains of the two DNS Services' ports, by Service port and
// protocol, as kube-proxy's iptables mode names them: a hash of the port's name and protocol (made up here).
var KubeProxyServiceChains = map[string]string{
	"kube-system/kube-dns:dns":              "KUBE-SVC-TCOU7JCQXEZGVUNU",
	"kube-system/kube-dns:dns-tcp":          "KUBE-SVC-ERIFXISQEP7F7OF4",
	"kube-system/kube-dns-upstream:dns":     "KUBE-SVC-N5IPSSKZ3KE3JVRC",
	"kube-system/kube-dns-upstream:dns-tcp": "KUBE-SVC-WQZ3LKXWNPLR4YB2",
}

// SetUpstreamEndpoint makes kube-proxy's rules send kube-dns-upstream's ClusterIP to ip:53 (UDP and TCP),
// as kube-proxy rewrites them when the cluster-DNS Pods behind the Service move; kube-dns keeps its
// endpoint. An ip no Pod has makes lookups through kube-dns-upstream time out. With a real kube-proxy it
// changes the Service's EndpointSlice and waits until kube-proxy has synced the change.
func (n *Node) SetUpstreamEndpoint(ip string) {
	n.t.Helper()
	if n.KubeProxy != nil {
		n.KubeProxy.SetUpstreamEndpoints(ip)
		return
	}
	var b strings.Builder
	var name string
	var cmd []string
	if n.Mode == NFTablesMode {
		for _, proto := range []string{"udp", "tcp"} {
			svc := fmt.Sprintf("kube-system/kube-dns-upstream/%s/dns", proto)
			svcChain := "service-" + strings.ToUpper(proto) + "DNS" + strings.ReplaceAll(UpstreamClusterIP, ".", "") + "-" + svc
			epChain := "endpoint-" + strings.ToUpper(proto) + "EP" + strings.ReplaceAll(UpstreamClusterIP, ".", "") + "-" + svc + "__" + ip + "/53"
			fmt.Fprintf(&b, "add chain ip kube-proxy %s\nflush chain ip kube-proxy %s\n", epChain, epChain)
			fmt.Fprintf(&b, "add rule ip kube-proxy %s ip saddr %s jump mark-for-masquerade\nadd rule ip kube-proxy %s meta l4proto %s dnat to %s:53\n", epChain, ip, epChain, proto, ip)
			fmt.Fprintf(&b, "flush chain ip kube-proxy %s\n", svcChain)
			fmt.Fprintf(&b, "add rule ip kube-proxy %s ip daddr %s %s dport 53 ip saddr != 10.244.0.0/16 jump mark-for-masquerade\n", svcChain, UpstreamClusterIP, proto)
			fmt.Fprintf(&b, "add rule ip kube-proxy %s numgen random mod 1 vmap { 0 : goto %s }\n", svcChain, epChain)
		}
		name, cmd = "nft", []string{"-f", "-"}
	} else {
		b.WriteString("*nat\n")
		for _, port := range []struct{ name, proto string }{{"dns", "udp"}, {"dns-tcp", "tcp"}} {
			svc := "kube-system/kube-dns-upstream:" + port.name
			chain := KubeProxyServiceChains[svc]
			sep := "KUBE-SEP-UPSTREAM" + strings.ToUpper(port.proto) + strings.ReplaceAll(ip, ".", "")
			fmt.Fprintf(&b, ":%s - [0:0]\n-F %s\n", sep, sep)
			fmt.Fprintf(&b, "-A %s -s %s/32 -j KUBE-MARK-MASQ\n-A %s -p %s -m %s -j DNAT --to-destination %s:53\n", sep, ip, sep, port.proto, port.proto, ip)
			fmt.Fprintf(&b, "-F %s\n", chain)
			fmt.Fprintf(&b, "-A %s ! -s 10.244.0.0/16 -d %s/32 -p %s -m comment --comment \"%s cluster IP\" -m %s --dport 53 -j KUBE-MARK-MASQ\n",
				chain, UpstreamClusterIP, port.proto, svc, port.proto)
			fmt.Fprintf(&b, "-A %s -m comment --comment \"%s -> %s:53\" -j %s\n", chain, svc, ip, sep)
		}
		b.WriteString("COMMIT\n")
		name, cmd = "iptables-restore", []string{"--noflush"}
	}
	if out, err := n.InWithInput(context.Background(), n.NodeNS, b.String(), name, cmd...); err != nil {
		n.t.Fatalf("simnode: moving kube-dns-upstream's endpoint to %s: %v\n%s\ninput:\n%s", ip, err, out, b.String())
	}
}

// writePodResolvConf gives the Pod namespace the resolv.conf of a ClusterFirst Pod; `ip netns exec` mounts
// /etc/netns/<ns>/resolv.conf over /etc/resolv.conf for every command it runs there. An nsswitch.conf that
// resolves hosts by files and DNS only, as a Pod's does, keeps glibc in the Pod from asking a resolver of
// the machine (systemd-resolved, mDNS) through a socket outside the namespace.
func (n *Node) writePodResolvConf() {
	dir := filepath.Join("/etc/netns", n.PodNS)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		n.t.Fatalf("simnode: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "nsswitch.conf"), []byte("hosts: files dns\n"), 0o644); err != nil {
		n.t.Fatalf("simnode: %v", err)
	}
	n.SetPodNameserver(KubeDNSClusterIP)
}

// SetPodNameserver rewrites the Pod's resolv.conf with nameserver ip, keeping a ClusterFirst Pod's search
// list and ndots. Commands started in the Pod afterwards use it.
func (n *Node) SetPodNameserver(ip string) {
	n.t.Helper()
	n.SetPodResolvConf(ip, "default")
}

// remove deletes the namespaces and the Pod's /etc/netns directory. Processes started with Start are
// killed by their own cleanups, which run before this one.
func (n *Node) remove() {
	for _, ns := range append(append([]string{n.PodNS, n.DNSNS, n.ExtNS}, n.extraNS...), n.NodeNS) {
		if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil &&
			!strings.Contains(string(out), "No such file") {
			n.t.Errorf("simnode: deleting namespace %s: %v: %s", ns, err, out)
		}
	}
	_ = os.RemoveAll(filepath.Join("/etc/netns", n.PodNS))
}

// command returns a command that runs name in namespace ns. `ip netns exec` execs name in place, so the
// command's PID is name's PID.
func (n *Node) command(ctx context.Context, ns, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns, name}, args...)...)
}

// In runs name in namespace ns and returns its combined output.
func (n *Node) In(ctx context.Context, ns, name string, args ...string) (string, error) {
	out, err := n.command(ctx, ns, name, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s in %s: %w: %s", strings.Join(append([]string{name}, args...), " "), ns, err, out)
	}
	return string(out), nil
}

// InWithInput is In with stdin as the command's standard input (an iptables-restore payload, say).
func (n *Node) InWithInput(ctx context.Context, ns, stdin, name string, args ...string) (string, error) {
	cmd := n.command(ctx, ns, name, args...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s in %s: %w: %s", strings.Join(append([]string{name}, args...), " "), ns, err, out)
	}
	return string(out), nil
}

func (n *Node) mustIn(ns, name string, args ...string) string {
	n.t.Helper()
	out, err := n.In(context.Background(), ns, name, args...)
	if err != nil {
		n.t.Fatalf("simnode: %v", err)
	}
	return out
}

func (n *Node) mustIP(args ...string) {
	n.t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		n.t.Fatalf("simnode: ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// Process is a command started in one of the node's namespaces.
type Process struct {
	Cmd *exec.Cmd

	mu     sync.Mutex
	output bytes.Buffer
	done   chan struct{}
	err    error
}

// Output returns everything the process printed so far, stdout and stderr interleaved.
func (p *Process) Output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.output.String()
}

// Write lets the process's stdout and stderr land in its buffer.
func (p *Process) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.output.Write(b)
}

// Signal sends sig to the process.
func (p *Process) Signal(sig os.Signal) error { return p.Cmd.Process.Signal(sig) }

// Wait waits up to timeout for the process to exit and returns its exit error.
func (p *Process) Wait(timeout time.Duration) error {
	select {
	case <-p.done:
		return p.err
	case <-time.After(timeout):
		return fmt.Errorf("pid %d still running after %v", p.Cmd.Process.Pid, timeout)
	}
}

// Exited reports whether the process has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Start runs name in namespace ns in the background. A cleanup kills it (by its PID) if it is still running
// when the test ends, and logs its output when the test failed.
func (n *Node) Start(ns, name string, args ...string) *Process {
	n.t.Helper()
	return n.StartEnv(ns, nil, name, args...)
}

// StartEnv is Start with env as the process's whole environment (nil: this process's).
func (n *Node) StartEnv(ns string, env []string, name string, args ...string) *Process {
	n.t.Helper()
	p := n.startProcess(ns, env, name, args...)
	n.t.Cleanup(func() {
		if !p.Exited() {
			_ = p.Cmd.Process.Signal(syscall.SIGKILL)
			<-p.done
		}
		if n.t.Failed() {
			n.t.Logf("output of %s in %s (pid %d):\n%s", name, ns, p.Cmd.Process.Pid, p.Output())
		}
	})
	return p
}

// startProcess starts name in namespace ns, with no cleanup: the caller's.
func (n *Node) startProcess(ns string, env []string, name string, args ...string) *Process {
	n.t.Helper()
	p := &Process{done: make(chan struct{})}
	p.Cmd = n.command(context.Background(), ns, name, args...)
	p.Cmd.Env = env
	p.Cmd.Stdout, p.Cmd.Stderr = p, p
	if err := p.Cmd.Start(); err != nil {
		n.t.Fatalf("simnode: starting %s in %s: %v", name, ns, err)
	}
	go func() {
		p.err = p.Cmd.Wait()
		close(p.done)
	}()
	return p
}

// Do runs fn on an OS thread that has entered namespace ns. Sockets created inside fn belong to ns and may
// be used from any goroutine afterwards.
func (n *Node) Do(ns string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		// The thread is never unlocked: the Go runtime then retires it instead of reusing it for other
		// goroutines, so no other code ever runs in ns by accident, even if restoring the namespace fails.
		runtime.LockOSThread()
		target, err := netns.GetFromName(ns)
		if err != nil {
			errc <- fmt.Errorf("opening namespace %s: %w", ns, err)
			return
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			errc <- fmt.Errorf("entering namespace %s: %w", ns, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// Exchange sends m to server (ip:port) from namespace ns, over UDP or TCP as network says.
func (n *Node) Exchange(ns, network string, m *dns.Msg, server string) (*dns.Msg, error) {
	var conn *dns.Conn
	err := n.Do(ns, func() error {
		c, err := net.DialTimeout(network, server, 2*time.Second)
		if err != nil {
			return err
		}
		conn = &dns.Conn{Conn: c}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("dialing %s/%s from %s: %w", server, network, ns, err)
	}
	defer conn.Close()
	client := &dns.Client{Net: network, Timeout: 2 * time.Second}
	r, _, err := client.ExchangeWithConn(m, conn)
	if err != nil {
		return nil, fmt.Errorf("query %s to %s/%s from %s: %w", m.Question[0].Name, server, network, ns, err)
	}
	return r, nil
}

// Query asks server for name and qtype from namespace ns.
func (n *Node) Query(ns, network, server, name string, qtype uint16) (*dns.Msg, error) {
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	return n.Exchange(ns, network, m, server)
}

// ConntrackEntries returns the conntrack entries of the node namespace whose original direction goes to
// dst:53 over proto.
func (n *Node) ConntrackEntries(proto, dst string) ([]string, error) {
	out, err := n.In(context.Background(), n.NodeNS, "conntrack", "-L", "-p", proto, "--orig-dst", dst, "--dport", "53")
	if err != nil {
		return nil, err
	}
	var entries []string
	for line := range strings.SplitSeq(out, "\n") {
		if strings.HasPrefix(line, proto) {
			entries = append(entries, line)
		}
	}
	return entries, nil
}

// DeleteConntrack deletes the node namespace's conntrack entries whose original direction goes to dst,
// and keeps the others: flushing every entry would also drop the NAT state of connections that stay open,
// such as a node cache's TCP connections to kube-dns-upstream, which a real node never does.
func (n *Node) DeleteConntrack(dst string) error {
	out, err := n.In(context.Background(), n.NodeNS, "conntrack", "-D", "--orig-dst", dst)
	if err != nil && strings.Contains(out, "0 flow entries have been deleted") {
		return nil
	}
	return err
}

// FlushConntrack empties the node namespace's conntrack table.
func (n *Node) FlushConntrack() error {
	_, err := n.In(context.Background(), n.NodeNS, "conntrack", "-F")
	return err
}

// WaitForDNS polls server from namespace ns until it answers a query for name or the timeout passes.
func (n *Node) WaitForDNS(ns, network, server, name string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		_, err := n.Query(ns, network, server, name, dns.TypeA)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no answer from %s within %v: %w", server, timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// BuildNodeCache builds cmd/node-cache into dir as its image holds it, the lean build as node-cache and
// the full one beside it as node-cache-full, and returns the lean one's path: the binary the manifests start,
// which runs the full one for a Corefile that needs it. Tests call it once, from TestMain, and use the binary
// for the cluster-DNS Pod, the node's resolver and the node cache alike.
func BuildNodeCache(ctx context.Context, dir string) (string, error) {
	gomod, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("finding the module root: %w", err)
	}
	root := filepath.Dir(strings.TrimSpace(string(gomod)))
	binary := filepath.Join(dir, "node-cache")
	for _, args := range [][]string{
		{"build", "-tags", "nodecache_lean", "-o", binary, "./cmd/node-cache"},
		{"build", "-o", binary + "-full", "./cmd/node-cache"},
	} {
		build := exec.CommandContext(ctx, "go", args...)
		build.Dir = root
		if out, err := build.CombinedOutput(); err != nil {
			return "", fmt.Errorf("building cmd/node-cache (go %s): %w: %s", strings.Join(args, " "), err, out)
		}
	}
	return binary, nil
}

// ClusterZone is the cluster.local zone the cluster-DNS Pod serves. kubernetes.default.svc has a long TTL so
// that a node cache in front answers repeats from its cache.
const ClusterZone = `$ORIGIN cluster.local.
@                          3600 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 1 7200 1800 86400 30
@                          3600 IN NS  ns.dns.cluster.local.
ns.dns                     3600 IN A   10.96.0.10
kubernetes.default.svc     3600 IN A   10.96.0.1
kube-dns.kube-system.svc   3600 IN A   10.96.0.10
web.default.svc            3600 IN A   10.244.2.7
web.default.svc            3600 IN AAAA fd00:10:244:2::7
`

// ExternalAnswer is the address the node's upstream resolver gives every A query outside the cluster.
const ExternalAnswer = "192.0.2.80"

// StartClusterDNS runs the cluster-DNS Pod: binary (a node-cache build) serving ClusterZone on
// ClusterDNSPodIP:53, logging every query so tests can count what reached it.
func (n *Node) StartClusterDNS(binary string) *Process {
	n.t.Helper()
	return n.StartClusterDNSZone(binary, ClusterZone)
}

// StartClusterDNSZone is StartClusterDNS serving zone, a cluster.local zone file, instead of ClusterZone:
// a cluster DNS that comes back with changed records. The zone must hold kubernetes.default.svc, which
// the start waits for.
func (n *Node) StartClusterDNSZone(binary, zone string) *Process {
	n.t.Helper()
	return n.startClusterDNS(binary, zone, "log")
}

// StartQuietClusterDNS is StartClusterDNS without the query log, for load: a cluster DNS that answers
// thousands of lookups a second should not spend its time writing about them. It reads its UDP queries
// from quietClusterDNSSockets sockets (CoreDNS's multisocket): the lookups a node's Pods sent to the cache
// all come to it while the node is diverted, and one socket's receive buffer (the kernel's default, 208
// KiB) holds about 200 of them, a tenth of a second of a hand-over test's load, which a process that
// shares two busy cores loses the CPU for at times (with 4 sockets, 96 lookups were still dropped there
// in one of 5 hand-over runs at load average 6); a cluster DNS of several Pods has more room.
func (n *Node) StartQuietClusterDNS(binary string) *Process {
	n.t.Helper()
	return n.startClusterDNS(binary, ClusterZone, fmt.Sprintf("multisocket %d", quietClusterDNSSockets))
}

// quietClusterDNSSockets is how many UDP sockets StartQuietClusterDNS's cluster DNS reads.
const quietClusterDNSSockets = 16

// startClusterDNS runs the cluster DNS serving zone, with directive (a line of its server block) if any.
func (n *Node) startClusterDNS(binary, zone, directive string) *Process {
	n.t.Helper()
	dir := n.t.TempDir()
	path := filepath.Join(dir, "cluster.local.db")
	bind := strings.Join(n.listenAddrs(ClusterDNSPodIP, ClusterDNSPodIP6), " ")
	corefile := fmt.Sprintf("cluster.local:53 {\n    bind %s\n    %s\n    file %s\n}\n", bind, directive, path)
	return n.startCoreDNS(binary, n.DNSNS, dir, corefile, map[string]string{path: zone}, ClusterDNSPodIP)
}

// StartExternalResolver runs the node's upstream resolver in the ext namespace: it answers every A query
// with ExternalAnswer and logs every query.
func (n *Node) StartExternalResolver(binary string) *Process {
	n.t.Helper()
	dir := n.t.TempDir()
	corefile := fmt.Sprintf(".:53 {\n    bind %s\n    log\n    template IN A {\n        answer \"{{ .Name }} 60 IN A %s\"\n    }\n}\n",
		strings.Join(n.listenAddrs(ExtResolverIP, ExtResolverIP6), " "), ExternalAnswer)
	return n.startCoreDNS(binary, n.ExtNS, dir, corefile, nil, ExtResolverIP)
}

func (n *Node) startCoreDNS(binary, ns, dir, corefile string, files map[string]string, listen string) *Process {
	n.t.Helper()
	if files == nil {
		files = map[string]string{}
	}
	files[filepath.Join(dir, "Corefile")] = corefile
	for path, content := range files {
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			n.t.Fatalf("simnode: %v", err)
		}
	}
	p := n.Start(ns, binary, "-conf", filepath.Join(dir, "Corefile"))
	probe := "kubernetes.default.svc.cluster.local"
	if err := n.WaitForDNS(ns, "udp", net.JoinHostPort(listen, "53"), probe, 10*time.Second); err != nil {
		n.t.Fatalf("simnode: CoreDNS in %s: %v\n%s", ns, err, p.Output())
	}
	return p
}

// CountQueries counts the queries for name (a FQDN) over proto ("udp" or "tcp") in a CoreDNS log.
func CountQueries(log, name, proto string) int {
	return strings.Count(strings.ToLower(log), " in "+strings.ToLower(dns.Fqdn(name))+" "+proto+" ")
}

// WaitForQueries waits up to timeout for p's CoreDNS log to count at least atLeast queries for name over
// proto, and returns the count then. CoreDNS logs a query after it has answered it, so a client that has
// its answer may read the log before the line is there.
func WaitForQueries(p *Process, name, proto string, atLeast int, timeout time.Duration) int {
	deadline := time.Now().Add(timeout)
	for {
		got := CountQueries(p.Output(), name, proto)
		if got >= atLeast || time.Now().After(deadline) {
			return got
		}
		time.Sleep(10 * time.Millisecond)
	}
}
