// Package kubeproxy gives tests a real kube-proxy: the binary scripts/build-kube-apiserver.sh builds from
// k8s.io/kubernetes at kube-apiserver's version (internal/kubeapi), its configuration file, the API objects
// it needs from a kubeapi server (a ServiceAccount bound to system:node-proxier, its Node, Services and
// EndpointSlices without a controller behind them), and what it says about its syncs on /metrics.
//
// Starting it is the caller's: test/simnode runs it in the simulated node's namespace, where the metrics and
// healthz addresses of Config are on that namespace's loopback.
//
// Without the binary a test skips, and fails under `make test` and CI (see package privtest).
package kubeproxy

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/nodelocaldns/nodelocaldns/internal/kubeapi"
	"github.com/nodelocaldns/nodelocaldns/internal/privtest"
)

// Mode is kube-proxy's proxy mode.
type Mode string

// The modes a simulated node runs (the kernel here has no ip_vs).
const (
	IPTables Mode = "iptables"
	NFTables Mode = "nftables"
)

// FindBinary returns the pinned kube-proxy, or an error that says how to build it.
func FindBinary() (string, error) {
	dir, err := kubeapi.BinDir()
	if err != nil {
		return "", err
	}
	p := filepath.Join(dir, "kube-proxy-"+kubeapi.KubernetesVersion)
	if st, err := os.Stat(p); err != nil || st.Mode()&0o111 == 0 {
		return "", fmt.Errorf("no %s (run scripts/build-kube-apiserver.sh, or `make test-deps`)", p)
	}
	return p, nil
}

// RequireBinary returns kube-proxy's path, or stops the test: it fails under `make test` and CI
// (privtest.Required) and skips otherwise.
func RequireBinary(t testing.TB) string {
	t.Helper()
	p, err := FindBinary()
	if err == nil {
		return p
	}
	if privtest.Required() {
		t.Fatalf("a real kube-proxy is needed: %v; %s is set, so this is a failure, not a skip", err, privtest.RequireEnv)
	}
	t.Skipf("a real kube-proxy is needed: %v; set %s=1 to make this a failure", err, privtest.RequireEnv)
	return ""
}

// Config is what one kube-proxy is told, through its configuration file (a KubeProxyConfiguration).
type Config struct {
	Mode Mode
	// Kubeconfig is the file kube-proxy reaches the API server with.
	Kubeconfig string
	// NodeName is --hostname-override: the Node kube-proxy reads its IPs from.
	NodeName string
	// ClusterCIDRs are the Pod ranges, one per family; traffic from outside them to a ClusterIP is
	// masqueraded.
	ClusterCIDRs []netip.Prefix
	// MetricsAddress and HealthzAddress are host:port in kube-proxy's network namespace.
	MetricsAddress, HealthzAddress string
	// SyncPeriod is the mode's syncPeriod (0: kube-proxy's default, 30s). Since kube-proxy 1.32 it is not
	// a period of syncs without changes (a full resync is hourly): it is how soon a failed sync is retried
	// and, in iptables mode, how often kube-proxy checks that its canary chains still exist.
	SyncPeriod time.Duration
}

// kubeProxyConfiguration is the part of kubeproxy.config.k8s.io/v1alpha1 KubeProxyConfiguration a Config
// sets; kube-proxy defaults the rest.
type kubeProxyConfiguration struct {
	APIVersion       string `json:"apiVersion"`
	Kind             string `json:"kind"`
	ClientConnection struct {
		Kubeconfig string `json:"kubeconfig"`
	} `json:"clientConnection"`
	HostnameOverride   string         `json:"hostnameOverride"`
	Mode               Mode           `json:"mode"`
	ClusterCIDR        string         `json:"clusterCIDR"`
	DetectLocalMode    string         `json:"detectLocalMode"`
	MetricsBindAddress string         `json:"metricsBindAddress"`
	HealthzBindAddress string         `json:"healthzBindAddress"`
	NodePortAddresses  []string       `json:"nodePortAddresses"`
	OOMScoreAdj        int32          `json:"oomScoreAdj"`
	IPTables           *modeConf      `json:"iptables,omitempty"`
	NFTables           *modeConf      `json:"nftables,omitempty"`
	Conntrack          conntrackConf  `json:"conntrack"`
	Logging            map[string]any `json:"logging"`
}

// modeConf is the part of a mode's settings a Config sets.
type modeConf struct {
	SyncPeriod string `json:"syncPeriod"`
}

// conntrackConf leaves the kernel's connection tracking settings alone: kube-proxy would raise
// nf_conntrack_max (a setting of the whole machine, not of a namespace) and the TCP timeouts.
type conntrackConf struct {
	MaxPerCore            int32  `json:"maxPerCore"`
	Min                   int32  `json:"min"`
	TCPEstablishedTimeout string `json:"tcpEstablishedTimeout"`
	TCPCloseWaitTimeout   string `json:"tcpCloseWaitTimeout"`
}

// File returns the configuration file's content.
func (c Config) File() ([]byte, error) {
	if c.Mode != IPTables && c.Mode != NFTables {
		return nil, fmt.Errorf("kube-proxy mode %q: want %s or %s", c.Mode, IPTables, NFTables)
	}
	if c.Kubeconfig == "" || c.NodeName == "" || len(c.ClusterCIDRs) == 0 || c.MetricsAddress == "" || c.HealthzAddress == "" {
		return nil, errors.New("a kube-proxy Config needs Kubeconfig, NodeName, ClusterCIDRs, MetricsAddress and HealthzAddress")
	}
	cidrs := make([]string, 0, len(c.ClusterCIDRs))
	for _, p := range c.ClusterCIDRs {
		cidrs = append(cidrs, p.String())
	}
	k := kubeProxyConfiguration{
		APIVersion:         "kubeproxy.config.k8s.io/v1alpha1",
		Kind:               "KubeProxyConfiguration",
		HostnameOverride:   c.NodeName,
		Mode:               c.Mode,
		ClusterCIDR:        strings.Join(cidrs, ","),
		DetectLocalMode:    "ClusterCIDR",
		MetricsBindAddress: c.MetricsAddress,
		HealthzBindAddress: c.HealthzAddress,
		// NodePorts on the Node's IPs only, as kube-proxy recommends (unset, it warns).
		NodePortAddresses: []string{"primary"},
		// The default, -999, would make a test's process the last the kernel picks when memory runs out.
		OOMScoreAdj: 0,
		Conntrack:   conntrackConf{TCPEstablishedTimeout: "0s", TCPCloseWaitTimeout: "0s"},
		// Verbosity 2 logs each sync ("SyncProxyRules complete"), which the tests report.
		Logging: map[string]any{"verbosity": 2},
	}
	k.ClientConnection.Kubeconfig = c.Kubeconfig
	if c.SyncPeriod > 0 {
		mc := &modeConf{SyncPeriod: c.SyncPeriod.String()}
		if c.Mode == IPTables {
			k.IPTables = mc
		} else {
			k.NFTables = mc
		}
	}
	b, err := json.MarshalIndent(k, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("writing kube-proxy's configuration: %w", err)
	}
	return append(b, '\n'), nil
}

// ServiceAccount is the identity kube-proxy runs as, kube-system/kube-proxy, as kubeadm sets it up.
const ServiceAccount = "kube-proxy"

// Grant creates the ServiceAccount kube-system/kube-proxy, binds it to the ClusterRole system:node-proxier
// (which kube-apiserver bootstraps), waits until the authorizer lets it watch EndpointSlices, and returns a
// token of it.
func Grant(ctx context.Context, admin kubernetes.Interface, s *kubeapi.Server) (string, error) {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, Name: ServiceAccount}}
	if _, err := admin.CoreV1().ServiceAccounts(sa.Namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("creating kube-proxy's ServiceAccount: %w", err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "nodelocaldns-test:node-proxier"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:node-proxier"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: sa.Namespace, Name: sa.Name}},
	}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("binding kube-proxy's ServiceAccount to system:node-proxier: %w", err)
	}
	// kube-proxy's tokens are bound to no object and last as long as the server lets them (a test is shorter).
	tr, err := admin.CoreV1().ServiceAccounts(sa.Namespace).CreateToken(ctx, sa.Name, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("requesting a token of kube-proxy's ServiceAccount: %w", err)
	}
	// The authorizer learns of the binding from its own watch, a moment after the create returns.
	client, err := kubernetes.NewForConfig(s.TokenConfig(tr.Status.Token))
	if err != nil {
		return "", err
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		_, err := client.DiscoveryV1().EndpointSlices(metav1.NamespaceAll).List(ctx, metav1.ListOptions{Limit: 1})
		if err == nil {
			return tr.Status.Token, nil
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("kube-proxy's ServiceAccount may not list EndpointSlices: %w (%w)", err, ctx.Err())
		case <-tick.C:
		}
	}
}

// RegisterNode creates the Node name with ips as its InternalIPs (the primary family first), which
// kube-proxy takes as the node's IPs.
func RegisterNode(ctx context.Context, admin kubernetes.Interface, name string, ips []netip.Addr) error {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelHostname: name}}}
	for _, ip := range ips {
		node.Status.Addresses = append(node.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip.String()})
	}
	created, err := admin.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating Node %s: %w", name, err)
	}
	// A Node's status is not written by a create.
	created.Status.Addresses = node.Status.Addresses
	if _, err := admin.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("writing Node %s's addresses: %w", name, err)
	}
	return nil
}

// Port is one port of a Service and of its endpoints.
type Port struct {
	Name     string
	Protocol corev1.Protocol
	Port     int32
}

// CreateService creates a Service without a selector (its EndpointSlices are SetEndpoints'), on
// clusterIPs, one per family with the primary first: SingleStack with one, RequireDualStack with two;
// none lets the API server pick one of the primary family.
func CreateService(ctx context.Context, admin kubernetes.Interface, namespace, name string, clusterIPs []netip.Addr, ports []Port) error {
	if len(clusterIPs) > 2 {
		return fmt.Errorf("creating Service %s/%s: %d ClusterIPs, want one per family at most", namespace, name, len(clusterIPs))
	}
	policy := corev1.IPFamilyPolicySingleStack
	if len(clusterIPs) == 2 {
		policy = corev1.IPFamilyPolicyRequireDualStack
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, IPFamilyPolicy: &policy},
	}
	for _, ip := range clusterIPs {
		svc.Spec.ClusterIPs = append(svc.Spec.ClusterIPs, ip.String())
		svc.Spec.IPFamilies = append(svc.Spec.IPFamilies, familyOf(ip))
	}
	if len(clusterIPs) > 0 {
		svc.Spec.ClusterIP = svc.Spec.ClusterIPs[0]
	}
	for _, p := range ports {
		svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: p.Name, Protocol: p.Protocol, Port: p.Port, TargetPort: intstr.FromInt32(p.Port)})
	}
	if _, err := admin.CoreV1().Services(namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating Service %s/%s: %w", namespace, name, err)
	}
	return nil
}

// ManagedBy is the endpointslice.kubernetes.io/managed-by label of the EndpointSlices SetEndpoints writes.
const ManagedBy = "nodelocaldns-test"

// SetEndpoints makes the Service's endpoints addrs, each ready, on ports: one EndpointSlice per family
// (NAME-ipv4, NAME-ipv6), created or replaced; a family without an address keeps a slice with no endpoint,
// so that no address at all is a Service without endpoints.
func SetEndpoints(ctx context.Context, admin kubernetes.Interface, namespace, service string, ports []Port, addrs []netip.Addr) error {
	byFamily := map[discoveryv1.AddressType][]discoveryv1.Endpoint{discoveryv1.AddressTypeIPv4: nil}
	for _, a := range addrs {
		t := discoveryv1.AddressTypeIPv4
		if a.Is6() {
			t = discoveryv1.AddressTypeIPv6
		}
		ready := true
		byFamily[t] = append(byFamily[t], discoveryv1.Endpoint{Addresses: []string{a.String()}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}})
	}
	slicePorts := make([]discoveryv1.EndpointPort, 0, len(ports))
	for _, p := range ports {
		slicePorts = append(slicePorts, discoveryv1.EndpointPort{Name: &p.Name, Protocol: &p.Protocol, Port: &p.Port})
	}
	slices := admin.DiscoveryV1().EndpointSlices(namespace)
	for t, endpoints := range byFamily {
		slice := &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{
				Namespace: namespace,
				Name:      service + "-" + strings.ToLower(string(t)),
				Labels:    map[string]string{discoveryv1.LabelServiceName: service, discoveryv1.LabelManagedBy: ManagedBy},
			},
			AddressType: t,
			Endpoints:   endpoints,
			Ports:       slicePorts,
		}
		old, err := slices.Get(ctx, slice.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			_, err = slices.Create(ctx, slice, metav1.CreateOptions{})
		case err == nil:
			slice.ResourceVersion = old.ResourceVersion
			_, err = slices.Update(ctx, slice, metav1.UpdateOptions{})
		}
		if err != nil {
			return fmt.Errorf("writing EndpointSlice %s/%s: %w", namespace, slice.Name, err)
		}
	}
	return nil
}

func familyOf(ip netip.Addr) corev1.IPFamily {
	if ip.Is6() && !ip.Is4In6() {
		return corev1.IPv6Protocol
	}
	return corev1.IPv4Protocol
}

// SyncMetrics are kube-proxy's kubeproxy_sync_proxy_rules_* metrics.
type SyncMetrics struct {
	// Syncs counts the syncs that ran (the duration histogram's count, of every family), successful or not.
	Syncs float64
	// LastSync is when the last successful sync of each family (its ip_family label: IPv4, IPv6) ended,
	// LastQueued when a change last asked for one (Unix seconds).
	LastSync, LastQueued map[string]float64
	// EndpointChanges and ServiceChanges count the changes seen; the pending ones wait for a sync.
	EndpointChanges, ServiceChanges               float64
	EndpointChangesPending, ServiceChangesPending float64
	// Failures counts failed syncs of every family: iptables-restore failures (full and partial) or
	// nftables transactions that failed.
	Failures float64
}

// counters maps the names kube-proxy exports to the fields of SyncMetrics that add up across labels.
func (m *SyncMetrics) counters() map[string]*float64 {
	return map[string]*float64{
		"kubeproxy_sync_proxy_rules_duration_seconds_count":                  &m.Syncs,
		"kubeproxy_sync_proxy_rules_endpoint_changes_total":                  &m.EndpointChanges,
		"kubeproxy_sync_proxy_rules_service_changes_total":                   &m.ServiceChanges,
		"kubeproxy_sync_proxy_rules_endpoint_changes_pending":                &m.EndpointChangesPending,
		"kubeproxy_sync_proxy_rules_service_changes_pending":                 &m.ServiceChangesPending,
		"kubeproxy_sync_proxy_rules_iptables_restore_failures_total":         &m.Failures,
		"kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total": &m.Failures,
		"kubeproxy_sync_proxy_rules_nftables_sync_failures_total":            &m.Failures,
	}
}

// ParseMetrics reads SyncMetrics from kube-proxy's /metrics text. It fails when kube-proxy has not
// exported the sync duration yet.
func ParseMetrics(text string) (SyncMetrics, error) {
	m := SyncMetrics{LastSync: map[string]float64{}, LastQueued: map[string]float64{}}
	counters := m.counters()
	perFamily := map[string]map[string]float64{
		"kubeproxy_sync_proxy_rules_last_timestamp_seconds":        m.LastSync,
		"kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds": m.LastQueued,
	}
	seen := false
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name, labels := line, ""
		if i := strings.IndexAny(line, "{ "); i >= 0 {
			name = line[:i]
			if line[i] == '{' {
				if j := strings.IndexByte(line, '}'); j > i {
					labels = line[i+1 : j]
				}
			}
		}
		counter, isCounter := counters[name]
		family, isFamily := perFamily[name]
		if !isCounter && !isFamily {
			continue
		}
		parts := strings.Fields(line[strings.LastIndex(line, "}")+1:])
		if len(parts) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(parts[len(parts)-1], 64)
		if err != nil {
			return SyncMetrics{}, fmt.Errorf("kube-proxy metric line %q: %w", line, err)
		}
		if isCounter {
			*counter += v
		} else {
			family[labelValue(labels, "ip_family")] = v
		}
		seen = seen || name == "kubeproxy_sync_proxy_rules_duration_seconds_count"
	}
	if err := sc.Err(); err != nil {
		return SyncMetrics{}, err
	}
	if !seen {
		return SyncMetrics{}, errors.New("kube-proxy's /metrics has no kubeproxy_sync_proxy_rules_duration_seconds yet")
	}
	return m, nil
}

// labelValue returns the value of label name in a series' labels (a="x",b="y").
func labelValue(labels, name string) string {
	for l := range strings.SplitSeq(labels, ",") {
		k, v, ok := strings.Cut(l, "=")
		if ok && strings.TrimSpace(k) == name {
			return strings.Trim(v, `"`)
		}
	}
	return ""
}

// Synced reports whether every change kube-proxy has seen is in a sync that succeeded: none pending, and
// each family's last successful sync ended after the last change asked for one.
func (m SyncMetrics) Synced() bool {
	if len(m.LastSync) == 0 || m.EndpointChangesPending != 0 || m.ServiceChangesPending != 0 {
		return false
	}
	for f, queued := range m.LastQueued {
		if m.LastSync[f] < queued {
			return false
		}
	}
	return true
}

func (m SyncMetrics) String() string {
	var last []string
	for _, f := range []string{"IPv4", "IPv6"} {
		if v, ok := m.LastSync[f]; ok {
			last = append(last, f+" "+time.Unix(0, int64(v*1e9)).UTC().Format("15:04:05.000"))
		}
	}
	return fmt.Sprintf("%.0f syncs (%.0f failed), last successful %s; %.0f endpoint and %.0f service changes seen, %.0f and %.0f pending",
		m.Syncs, m.Failures, strings.Join(last, ", "), m.EndpointChanges, m.ServiceChanges, m.EndpointChangesPending, m.ServiceChangesPending)
}
