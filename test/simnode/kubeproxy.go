//go:build linux

package simnode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nodelocaldns/nodelocaldns/internal/kubeapi"
	"github.com/nodelocaldns/nodelocaldns/internal/kubeproxy"
	"github.com/nodelocaldns/nodelocaldns/internal/privtest"
)

// The real kube-proxy's side of the node (NewWithKubeProxy).
const (
	// NodeName is the Node kube-proxy runs for (--hostname-override); NodeIP, the ext side of the node
	// namespace, is its InternalIP.
	NodeName = "simnode"
	NodeIP   = NodeExtSideIP
	// ClusterCIDR holds every Pod address; ServiceCIDR every ClusterIP.
	ClusterCIDR = "10.244.0.0/16"
	ServiceCIDR = "10.96.0.0/16"
	// SecondClusterDNSPodIP is the address of the cluster-DNS Pod AddClusterDNSPod adds: where the
	// cluster DNS moves to.
	SecondClusterDNSPodIP = "10.244.3.2"
	nodeDNS2SideIP        = "10.244.3.1"
	// KubeProxyMetrics and KubeProxyHealthz are kube-proxy's listeners, on the node namespace's loopback.
	KubeProxyMetrics = "127.0.0.1:10249"
	KubeProxyHealthz = "127.0.0.1:10256"
)

// The two DNS Services.
const (
	KubeDNSService  = "kube-dns"
	UpstreamService = "kube-dns-upstream"
)

// kubeProxyWait bounds each wait for kube-proxy (its start, a sync after a change): a failure bound for a
// busy machine, not an expectation.
const kubeProxyWait = 2 * time.Minute

// dnsPorts are the ports of both DNS Services and of their endpoints.
var dnsPorts = []kubeproxy.Port{{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53}, {Name: "dns-tcp", Protocol: corev1.ProtocolTCP, Port: 53}}

// KubeProxySetup is what the API server and kube-proxy of a node are given: each list has one entry per
// family, the primary first, so that a dual-stack node gives two.
type KubeProxySetup struct {
	// ServiceCIDRs are the API server's Service ClusterIP ranges.
	ServiceCIDRs []netip.Prefix
	// ClusterCIDRs are kube-proxy's Pod ranges.
	ClusterCIDRs []netip.Prefix
	// NodeIPs are the Node's InternalIPs.
	NodeIPs []netip.Addr
	// KubeDNS and Upstream are the ClusterIPs of kube-dns and kube-dns-upstream (SingleStack with one,
	// RequireDualStack with two).
	KubeDNS, Upstream []netip.Addr
	// ClusterDNSPods are the endpoints of both Services.
	ClusterDNSPods []netip.Addr
	// API, when set, holds the API server, shared with the test binary's other nodes; nil starts one for the
	// node alone (for a test that stops or restarts it).
	API *SharedAPI
	// SyncPeriod is kube-proxy's syncPeriod (kubeproxy.Config's; 0: its default). kube-proxy syncs on
	// changes, not periodically: Churn makes it sync.
	SyncPeriod time.Duration
}

// DefaultKubeProxySetup is the IPv4 node of the package doc.
func DefaultKubeProxySetup() KubeProxySetup {
	p, a := netip.MustParsePrefix, netip.MustParseAddr
	return KubeProxySetup{
		ServiceCIDRs:   []netip.Prefix{p(ServiceCIDR)},
		ClusterCIDRs:   []netip.Prefix{p(ClusterCIDR)},
		NodeIPs:        []netip.Addr{a(NodeIP)},
		KubeDNS:        []netip.Addr{a(KubeDNSClusterIP)},
		Upstream:       []netip.Addr{a(UpstreamClusterIP)},
		ClusterDNSPods: []netip.Addr{a(ClusterDNSPodIP)},
	}
}

// NewWithKubeProxy builds a simulated node whose rules a real kube-proxy in mode writes, against a real
// API server holding kube-dns and kube-dns-upstream with the cluster-DNS Pod as their endpoint, and
// registers its removal with t.Cleanup. The API server is api's (KubeProxySetup.API).
func NewWithKubeProxy(t testing.TB, api *SharedAPI, mode KubeProxyMode) *Node {
	t.Helper()
	setup := DefaultKubeProxySetup()
	setup.API = api
	return NewWithKubeProxySetup(t, mode, setup)
}

// NewWithKubeProxySetup is NewWithKubeProxy with setup.
func NewWithKubeProxySetup(t testing.TB, mode KubeProxyMode, setup KubeProxySetup) *Node {
	t.Helper()
	tools := []string{"iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save", "ip6tables-restore"}
	if mode == NFTablesMode {
		tools = []string{"nft"}
	}
	privtest.RequirePrivileged(t, tools...)
	return newNode(t, mode, &setup)
}

// KubeProxy is the real kube-proxy of a node, its API server, and the API objects it serves.
type KubeProxy struct {
	// API is the API server (only a node's own, not a SharedAPI's, may be stopped); Admin a client of it
	// with every permission.
	API   *kubeapi.Server
	Admin kubernetes.Interface
	Setup KubeProxySetup

	n      *Node
	binary string
	config string
	proc   *Process
	// runs are the processes of every start, the current one last.
	runs []*Process
	// stopped is set while kube-proxy is stopped by Stop.
	stopped bool
	// churns counts Churn's changes; 0 before the first, which creates its Service.
	churns int
}

// ChurnService is the Service, in namespace default, whose endpoints Churn changes; nothing asks it.
const ChurnService = "churn"

// Churn makes kube-proxy sync n times, as the changes of a busy cluster do: each time it moves the one
// endpoint of ChurnService (created on first use) and waits until kube-proxy has seen the change and synced
// it. It returns kube-proxy's metrics then, and fails the test if a sync failed.
func (kp *KubeProxy) Churn(n int) kubeproxy.SyncMetrics {
	kp.n.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), kubeProxyWait)
	defer cancel()
	ports := []kubeproxy.Port{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}}
	if kp.churns == 0 {
		if err := kubeproxy.CreateService(ctx, kp.Admin, metav1.NamespaceDefault, ChurnService, nil, ports); err != nil {
			kp.n.t.Fatalf("simnode: %v", err)
		}
	}
	m, err := kp.Metrics()
	if err != nil {
		kp.n.t.Fatalf("simnode: %v", err)
	}
	for range n {
		before := m
		kp.churns++
		ep := netip.AddrFrom4([4]byte{10, 244, 2, byte(10 + kp.churns%200)})
		if err := kubeproxy.SetEndpoints(ctx, kp.Admin, metav1.NamespaceDefault, ChurnService, ports, []netip.Addr{ep}); err != nil {
			kp.n.t.Fatalf("simnode: %v", err)
		}
		kp.waitFor("kube-proxy's sync of a change", func() (bool, error) {
			m, err = kp.Metrics()
			if err != nil {
				return false, err
			}
			if m.Failures > before.Failures {
				kp.n.t.Fatalf("simnode: kube-proxy's sync failed (%v, before %v):\n%s", m, before, kp.tail())
			}
			return m.EndpointChanges > before.EndpointChanges && m.Syncs > before.Syncs && m.Synced(), nil
		})
	}
	return m
}

// startKubeProxy starts the API server (or takes setup.API's), writes the objects kube-proxy reads, starts
// kube-proxy in the node namespace and waits until its rules serve both Services.
func (n *Node) startKubeProxy(setup KubeProxySetup) {
	n.t.Helper()
	binary := kubeproxy.RequireBinary(n.t)
	cidrs := make([]string, 0, len(setup.ServiceCIDRs))
	for _, p := range setup.ServiceCIDRs {
		cidrs = append(cidrs, p.String())
	}
	var api *kubeapi.Server
	if setup.API != nil {
		api = setup.API.acquire(n.t, kubeapi.Options{ServiceCIDRs: cidrs})
	} else {
		api = kubeapi.StartWith(n.t, kubeapi.Options{ServiceCIDRs: cidrs})
	}
	kp := &KubeProxy{API: api, Admin: kubernetes.NewForConfigOrDie(api.AdminConfig()), Setup: setup, n: n, binary: binary}
	ctx, cancel := context.WithTimeout(context.Background(), kubeProxyWait)
	defer cancel()
	if err := kp.writeObjects(ctx); err != nil {
		n.t.Fatalf("simnode: %v", err)
	}
	token, err := kubeproxy.Grant(ctx, kp.Admin, api)
	if err != nil {
		n.t.Fatalf("simnode: %v", err)
	}
	relay := n.Relay(n.NodeNS, strings.TrimPrefix(api.URL(), "https://"))
	dir := n.t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := api.WriteKubeconfig(kubeconfig, "https://"+relay, token); err != nil {
		n.t.Fatalf("simnode: %v", err)
	}
	mode := kubeproxy.IPTables
	if n.Mode == NFTablesMode {
		mode = kubeproxy.NFTables
	}
	file, err := kubeproxy.Config{
		Mode: mode, Kubeconfig: kubeconfig, NodeName: NodeName, ClusterCIDRs: setup.ClusterCIDRs,
		MetricsAddress: KubeProxyMetrics, HealthzAddress: KubeProxyHealthz, SyncPeriod: setup.SyncPeriod,
	}.File()
	if err != nil {
		n.t.Fatalf("simnode: %v", err)
	}
	kp.config = filepath.Join(dir, "kube-proxy.yaml")
	if err := os.WriteFile(kp.config, file, 0o644); err != nil {
		n.t.Fatalf("simnode: %v", err)
	}
	n.KubeProxy = kp
	// Before the API server stops: a kube-proxy that died or failed a sync during the test fails it, then
	// it is killed.
	n.t.Cleanup(kp.end)
	kp.Start()
	for _, svc := range []string{KubeDNSService, UpstreamService} {
		kp.WaitForEndpoints(svc, setup.ClusterDNSPods...)
	}
}

// writeObjects creates the Node, both Services and their EndpointSlices.
func (kp *KubeProxy) writeObjects(ctx context.Context) error {
	if err := kubeproxy.RegisterNode(ctx, kp.Admin, NodeName, kp.Setup.NodeIPs); err != nil {
		return err
	}
	for svc, ips := range map[string][]netip.Addr{KubeDNSService: kp.Setup.KubeDNS, UpstreamService: kp.Setup.Upstream} {
		if err := kubeproxy.CreateService(ctx, kp.Admin, metav1.NamespaceSystem, svc, ips, dnsPorts); err != nil {
			return err
		}
		if err := kubeproxy.SetEndpoints(ctx, kp.Admin, metav1.NamespaceSystem, svc, dnsPorts, kp.Setup.ClusterDNSPods); err != nil {
			return err
		}
	}
	return nil
}

// Start starts kube-proxy (again) and waits for its first successful sync. It is killed when the test
// ends.
func (kp *KubeProxy) Start() {
	kp.n.t.Helper()
	if kp.proc != nil && !kp.proc.Exited() {
		kp.n.t.Fatal("simnode: kube-proxy is already running")
	}
	kp.proc = kp.n.startProcess(kp.n.NodeNS, nil, kp.binary, "--config", kp.config)
	kp.runs = append(kp.runs, kp.proc)
	kp.stopped = false
	kp.WaitForSync()
}

// Stop stops kube-proxy with sig (SIGTERM, as the kubelet does; SIGKILL) and waits for it to exit. It
// leaves its rules behind, as a kube-proxy does.
func (kp *KubeProxy) Stop(sig syscall.Signal) {
	kp.n.t.Helper()
	kp.stopped = true
	if err := kp.proc.Signal(sig); err != nil {
		kp.n.t.Fatalf("simnode: signalling kube-proxy: %v", err)
	}
	if err := kp.proc.Wait(kubeProxyWait); err != nil && !kp.proc.Exited() {
		kp.n.t.Fatalf("simnode: kube-proxy did not exit after %v: %v", sig, err)
	}
}

// Restart stops kube-proxy with sig and starts it again.
func (kp *KubeProxy) Restart(sig syscall.Signal) {
	kp.n.t.Helper()
	kp.Stop(sig)
	kp.Start()
}

// Log is what kube-proxy logged, of every start, each run headed by its number.
func (kp *KubeProxy) Log() string {
	var b strings.Builder
	for i, p := range kp.runs {
		fmt.Fprintf(&b, "--- kube-proxy run %d (pid %d)\n%s", i+1, p.Cmd.Process.Pid, p.Output())
	}
	return b.String()
}

// Metrics reads the running kube-proxy's sync metrics.
func (kp *KubeProxy) Metrics() (kubeproxy.SyncMetrics, error) {
	body, err := kp.n.HTTPGet(KubeProxyMetrics, "/metrics")
	if err != nil {
		return kubeproxy.SyncMetrics{}, err
	}
	return kubeproxy.ParseMetrics(body)
}

// WaitForSync waits until kube-proxy has synced every change it has seen, and returns its metrics then.
func (kp *KubeProxy) WaitForSync() kubeproxy.SyncMetrics {
	kp.n.t.Helper()
	var m kubeproxy.SyncMetrics
	kp.waitFor("kube-proxy synced", func() (bool, error) {
		var err error
		m, err = kp.Metrics()
		return err == nil && m.Synced(), err
	})
	return m
}

// SetUpstreamEndpoints makes ips the endpoints of kube-dns-upstream (none: it has no endpoint) and waits
// until kube-proxy's rules say so.
func (kp *KubeProxy) SetUpstreamEndpoints(ips ...string) {
	kp.n.t.Helper()
	kp.SetEndpoints(UpstreamService, ips...)
}

// SetEndpoints makes ips the endpoints of Service svc (kube-dns or kube-dns-upstream) and waits until
// kube-proxy's rules say so.
func (kp *KubeProxy) SetEndpoints(svc string, ips ...string) {
	kp.n.t.Helper()
	addrs := make([]netip.Addr, 0, len(ips))
	for _, ip := range ips {
		a, err := netip.ParseAddr(ip)
		if err != nil {
			kp.n.t.Fatalf("simnode: endpoint %q: %v", ip, err)
		}
		addrs = append(addrs, a)
	}
	ctx, cancel := context.WithTimeout(context.Background(), kubeProxyWait)
	defer cancel()
	if err := kubeproxy.SetEndpoints(ctx, kp.Admin, metav1.NamespaceSystem, svc, dnsPorts, addrs); err != nil {
		kp.n.t.Fatalf("simnode: %v", err)
	}
	kp.WaitForEndpoints(svc, addrs...)
}

// DeleteService deletes Service svc (kube-dns or kube-dns-upstream) and its EndpointSlices, and waits
// until kube-proxy's rules no longer send its ClusterIP anywhere.
func (kp *KubeProxy) DeleteService(svc string) {
	kp.n.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), kubeProxyWait)
	defer cancel()
	if err := kp.Admin.CoreV1().Services(metav1.NamespaceSystem).Delete(ctx, svc, metav1.DeleteOptions{}); err != nil {
		kp.n.t.Fatalf("simnode: deleting Service %s: %v", svc, err)
	}
	err := kp.Admin.DiscoveryV1().EndpointSlices(metav1.NamespaceSystem).DeleteCollection(ctx, metav1.DeleteOptions{},
		metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=" + svc})
	if err != nil {
		kp.n.t.Fatalf("simnode: deleting the EndpointSlices of %s: %v", svc, err)
	}
	kp.WaitForEndpoints(svc)
}

// WaitForEndpoints waits until kube-proxy has synced and its rules send svc's ClusterIP, on UDP and TCP
// port 53, to exactly addrs.
func (kp *KubeProxy) WaitForEndpoints(svc string, addrs ...netip.Addr) {
	kp.n.t.Helper()
	want := make([]string, 0, len(addrs))
	for _, a := range addrs {
		want = append(want, a.String())
	}
	slices.Sort(want)
	kp.waitFor(fmt.Sprintf("kube-proxy's rules sending %s to %v", svc, want), func() (bool, error) {
		m, err := kp.Metrics()
		if err != nil || !m.Synced() {
			return false, err
		}
		for _, proto := range []corev1.Protocol{corev1.ProtocolUDP, corev1.ProtocolTCP} {
			got, err := kp.Endpoints(svc, proto)
			if err != nil {
				return false, err
			}
			if !slices.Equal(got, want) {
				return false, fmt.Errorf("%s over %s goes to %v", svc, proto, got)
			}
		}
		return true, nil
	})
}

// The rules that name a Service port's endpoints. In iptables mode, the comment on the Service chain's jump
// to each endpoint's chain ("NS/NAME:PORT -> IP:PORT"). In nftables mode, in the Service chain: one endpoint is DNATed to directly
// ("dnat to IP:PORT"), several through a numgen map ("0 : IP . PORT, ..."), and with session affinity each
// has its chain ("goto endpoint-HASH-NS/NAME/PROTO/PORT__IP/PORT"); an endpoint chain outlives its endpoint
// for a while, so only the Service chain says what is in use.
var (
	iptablesEndpoint = regexp.MustCompile(`--comment "?kube-system/([^:]+):(\S+) -> \[?([0-9a-f.:]+?)\]?:53"? `)
	nftablesService  = regexp.MustCompile(`(?s)chain service-[A-Z0-9]+-kube-system/([^/]+)/(udp|tcp)/\S+ \{(.*?)\n\s*\}`)
	nftablesEndpoint = regexp.MustCompile(`dnat to \[?([0-9a-f.:]+?)\]?:53\b|\d+ : ([0-9a-f.:]+) \. 53\b|goto endpoint-\S+__(\S+)/53\b`)
)

// Rules dumps kube-proxy's rules: its nftables tables (nftables mode) or the nat tables of iptables and
// ip6tables (iptables mode).
func (kp *KubeProxy) Rules() (string, error) {
	ctx := context.Background()
	if kp.n.Mode == NFTablesMode {
		var tables []string
		for _, family := range []string{"ip", "ip6"} {
			if out, err := kp.n.In(ctx, kp.n.NodeNS, "nft", "list", "table", family, "kube-proxy"); err == nil {
				tables = append(tables, out)
			}
		}
		if len(tables) == 0 {
			return "", errors.New("no kube-proxy table")
		}
		return strings.Join(tables, "\n"), nil
	}
	out4, err := kp.n.In(ctx, kp.n.NodeNS, "iptables-save", "-t", "nat")
	if err != nil {
		return "", err
	}
	out6, err := kp.n.In(ctx, kp.n.NodeNS, "ip6tables-save", "-t", "nat")
	if err != nil {
		return "", err
	}
	return out4 + out6, nil
}

// Endpoints returns the addresses kube-proxy's rules send svc's port 53 over proto to, sorted.
func (kp *KubeProxy) Endpoints(svc string, proto corev1.Protocol) ([]string, error) {
	dump, err := kp.Rules()
	if err != nil {
		return nil, err
	}
	port := "dns"
	if proto == corev1.ProtocolTCP {
		port = "dns-tcp"
	}
	var got []string
	if kp.n.Mode != NFTablesMode {
		for _, m := range iptablesEndpoint.FindAllStringSubmatch(dump, -1) {
			if m[1] == svc && m[2] == port {
				got = append(got, m[3])
			}
		}
	}
	for _, chain := range nftablesService.FindAllStringSubmatch(dump, -1) {
		if chain[1] != svc || chain[2] != strings.ToLower(string(proto)) {
			continue
		}
		for _, m := range nftablesEndpoint.FindAllStringSubmatch(chain[3], -1) {
			ip := m[1] + m[2] + m[3]
			if m[3] != "" && strings.Count(ip, ".") != 3 {
				ip = strings.ReplaceAll(ip, ".", ":") // an IPv6 address in a chain name
			}
			got = append(got, ip)
		}
	}
	slices.Sort(got)
	return slices.Compact(got), nil
}

// waitFor polls cond every 100 ms until it holds, failing the test after kubeProxyWait or when kube-proxy
// exits.
func (kp *KubeProxy) waitFor(what string, cond func() (bool, error)) {
	kp.n.t.Helper()
	deadline := time.Now().Add(kubeProxyWait)
	for {
		ok, err := cond()
		if ok {
			return
		}
		if kp.proc.Exited() {
			kp.n.t.Fatalf("simnode: kube-proxy exited (%v) before %s:\n%s", kp.proc.Wait(0), what, kp.tail())
		}
		if time.Now().After(deadline) {
			rules, rerr := kp.Rules()
			kp.n.t.Fatalf("simnode: not within %v: %s (last: %v); kube-proxy's rules (%v):\n%s\nits log:\n%s", kubeProxyWait, what, err, rerr, rules, kp.tail())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// tail is the end of the current run's log, for failures.
func (kp *KubeProxy) tail() string {
	out := kp.proc.Output()
	const limit = 6000
	if len(out) > limit {
		out = "..." + out[len(out)-limit:]
	}
	return out
}

// end, at the end of the test, fails it when kube-proxy died without being stopped or a sync of it failed,
// kills it, and logs what it logged when the test failed.
func (kp *KubeProxy) end() {
	t := kp.n.t
	if kp.proc == nil {
		return
	}
	switch {
	case kp.proc.Exited() && !kp.stopped:
		t.Errorf("simnode: kube-proxy exited during the test (%v)", kp.proc.Wait(0))
	case !kp.proc.Exited():
		if m, err := kp.Metrics(); err != nil {
			t.Errorf("simnode: reading kube-proxy's metrics at the end of the test: %v", err)
		} else if m.Failures > 0 {
			t.Errorf("simnode: kube-proxy's syncs failed during the test: %v", m)
		}
		_ = kp.proc.Signal(syscall.SIGKILL)
		<-kp.proc.done
	}
	if t.Failed() {
		t.Logf("kube-proxy's log:\n%s", kp.Log())
	}
}

// AddClusterDNSPod adds a second cluster-DNS Pod's namespace, at SecondClusterDNSPodIP, and returns its
// name; StartClusterDNSIn runs the cluster DNS there.
func (n *Node) AddClusterDNSPod() string {
	n.t.Helper()
	return n.AddPod("dns2", SecondClusterDNSPodIP, nodeDNS2SideIP)
}

// StartClusterDNSIn runs the cluster DNS of StartClusterDNS in namespace ns, on ip:53.
func (n *Node) StartClusterDNSIn(binary, ns, ip string) *Process {
	n.t.Helper()
	dir := n.t.TempDir()
	path := filepath.Join(dir, "cluster.local.db")
	corefile := fmt.Sprintf("cluster.local:53 {\n    bind %s\n    log\n    file %s\n}\n", ip, path)
	return n.startCoreDNS(binary, ns, dir, corefile, map[string]string{path: ClusterZone}, ip)
}

// HTTPGet gets path from addr (host:port) in the node namespace and returns the body of a 200 answer.
func (n *Node) HTTPGet(addr, path string) (string, error) {
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, address string) (net.Conn, error) {
			var c net.Conn
			err := n.Do(n.NodeNS, func() (err error) {
				var d net.Dialer
				c, err = d.DialContext(ctx, network, address)
				return err
			})
			return c, err
		},
		DisableKeepAlives: true,
	}}
	resp, err := client.Get("http://" + addr + path)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return string(b), fmt.Errorf("GET %s%s in %s: %s", addr, path, n.NodeNS, resp.Status)
	}
	return string(b), nil
}
