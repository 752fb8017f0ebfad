// Package kubernetes holds ready-to-apply NodeLocal DNSCache manifests (iptables mode, IPVS mode,
// dual-stack), rendered from the Helm chart in charts/node-local-dns, the typed configuration each one
// implements, and a strict loader that reads them into Kubernetes API types. README.md is the operator's
// guide.
package kubernetes

import (
	"bytes"
	"embed"
	"fmt"
	"net/netip"
	"regexp"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/nodelocaldns/nodelocaldns/corefile"
)

//go:embed *.yaml
var files embed.FS

// Manifest is one manifest file and the node-cache configuration it implements: its ConfigMap holds
// corefile.Template(Config), and its DaemonSet's arguments give corefile.Render(Config). The file is Header
// followed by `helm template` of the chart with Values; the tests check that it still is.
type Manifest struct {
	File   string
	Config corefile.Config
	// Values is the chart's values file the manifest is rendered with, relative to the chart.
	Values string
	// Header is the comment the file starts with.
	Header string
}

func addrs(ss ...string) []netip.Addr {
	out := make([]netip.Addr, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParseAddr(s)
	}
	return out
}

// handover is node-cache's default in drop-in mode: at exit the node goes to the cluster DNS until the
// next start answers. Its addresses come from the Service variables of the container's environment, which
// a Config written here does not know.
var handover = corefile.Notrack{Handover: true}

// Manifests lists the manifests in this directory.
var Manifests = []Manifest{
	{File: "nodelocaldns-iptables.yaml", Values: "ci/iptables-values.yaml", Config: corefile.Config{
		Mode: corefile.ModeIPTables, LocalIPs: addrs("169.254.20.10"), ClusterDNSIPs: addrs("10.96.0.10"),
		Notrack: handover,
	}, Header: `# NodeLocal DNSCache: kube-proxy in iptables mode.
#
# The cache answers on the link-local 169.254.20.10 and on the kube-dns ClusterIP 10.96.0.10, which it puts
# on its own interface with NOTRACK rules, so Pods keep their resolv.conf and need no kubelet change. Cluster
# names go to the cluster DNS over TCP through kube-dns-upstream; other names to the node's resolvers.
`},
	{File: "nodelocaldns-ipvs.yaml", Values: "ci/ipvs-values.yaml", Config: corefile.Config{
		Mode: corefile.ModeIPVS, LocalIPs: addrs("169.254.20.10"), ClusterDNSIPs: addrs("10.96.0.10"),
		Notrack: handover,
	}, Header: `# NodeLocal DNSCache: kube-proxy in IPVS mode.
#
# IPVS already owns the kube-dns ClusterIP (it sits on kube-ipvs0), so the cache answers on the link-local
# 169.254.20.10 only, and once the cache is Ready on a node the kubelet's clusterDNS must point there
# (README.md). Cluster names go to the cluster DNS over TCP through kube-dns-upstream; other names to the
# node's resolvers.
`},
	{File: "nodelocaldns-dualstack.yaml", Values: "ci/dualstack-values.yaml", Config: corefile.Config{
		Mode: corefile.ModeIPTables, LocalIPs: addrs("169.254.20.10", "fd00:169:254::10"),
		ClusterDNSIPs: addrs("10.96.0.10", "fd00:10:96::a"),
		Notrack:       handover,
	}, Header: `# NodeLocal DNSCache: dual-stack cluster, kube-proxy in iptables mode.
#
# The cache answers on a link-local address of each family (169.254.20.10, fd00:169:254::10) and on both
# kube-dns ClusterIPs (10.96.0.10, fd00:10:96::a), so Pods of either family keep their resolv.conf.
`},
}

// generatedNote ends every manifest's header.
const generatedNote = `#
# Generated from charts/node-local-dns (helm template node-local-dns charts/node-local-dns --namespace
# kube-system --no-hooks -f charts/node-local-dns/%s); edit the chart, not this file, and regenerate with
# go test ./examples/kubernetes -run TestManifestsAreTheChart -update. It carries kubeadm's defaults
# (cluster domain cluster.local, kube-dns ClusterIP 10.96.0.10) and the image
# ghcr.io/nodelocaldns/node-cache; README.md says how to change them. Without helm's uninstall hook, delete
# the DaemonSet first and wait for its Pods (kubectl delete ds node-local-dns -n kube-system
# --cascade=foreground --wait), then the rest: README.md, "Uninstalling".
`

// FullHeader is the comment the manifest file starts with: Header and where the file comes from.
func (m Manifest) FullHeader() string { return m.Header + fmt.Sprintf(generatedNote, m.Values) }

// Objects are the API objects of a manifest, decoded strictly.
type Objects struct {
	ServiceAccounts []*corev1.ServiceAccount
	Roles           []*rbacv1.Role
	RoleBindings    []*rbacv1.RoleBinding
	Services        []*corev1.Service
	ConfigMaps      []*corev1.ConfigMap
	DaemonSets      []*appsv1.DaemonSet
	Jobs            []*batchv1.Job
	ServiceMonitors []*ServiceMonitor
	PrometheusRules []*PrometheusRule
}

// MonitoringAPIVersion is prometheus-operator's API, which ServiceMonitor and PrometheusRule belong to.
const MonitoringAPIVersion = "monitoring.coreos.com/v1"

// ServiceMonitor is the part of prometheus-operator's ServiceMonitor the chart writes; strict decoding
// into it refuses any field the chart should not be writing.
type ServiceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector          metav1.LabelSelector `json:"selector"`
		NamespaceSelector struct {
			MatchNames []string `json:"matchNames"`
		} `json:"namespaceSelector"`
		Endpoints []struct {
			Port              string          `json:"port"`
			Interval          string          `json:"interval"`
			Relabelings       []RelabelConfig `json:"relabelings,omitempty"`
			MetricRelabelings []RelabelConfig `json:"metricRelabelings,omitempty"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// RelabelConfig is a Prometheus relabeling as prometheus-operator's RelabelConfig spells it.
type RelabelConfig struct {
	SourceLabels []string `json:"sourceLabels,omitempty"`
	Separator    string   `json:"separator,omitempty"`
	TargetLabel  string   `json:"targetLabel,omitempty"`
	Regex        string   `json:"regex,omitempty"`
	Modulus      uint64   `json:"modulus,omitempty"`
	Replacement  *string  `json:"replacement,omitempty"`
	Action       string   `json:"action,omitempty"`
}

// PrometheusRule is the part of prometheus-operator's PrometheusRule the chart writes.
type PrometheusRule struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Groups []RuleGroup `json:"groups"`
	} `json:"spec"`
}

// RuleGroup is a group of Prometheus alerting rules.
type RuleGroup struct {
	Name  string `json:"name"`
	Rules []Rule `json:"rules"`
}

// Rule is a Prometheus alerting rule.
type Rule struct {
	Alert       string            `json:"alert"`
	Expr        string            `json:"expr"`
	For         string            `json:"for,omitempty"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

// Load reads one of the embedded manifests.
func Load(file string) (*Objects, error) {
	data, err := files.ReadFile(file)
	if err != nil {
		return nil, err
	}
	objs, err := Decode(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return objs, nil
}

var documentSeparator = regexp.MustCompile(`(?m)^---[ \t]*$`)

// Decode splits a multi-document YAML manifest and decodes every document into its API type with
// sigs.k8s.io/yaml's strict mode: an unknown or duplicate field is an error, as is a kind this package does
// not expect or an apiVersion that is not the kind's.
func Decode(data []byte) (*Objects, error) {
	objs := &Objects{}
	for i, doc := range documentSeparator.Split(string(data), -1) {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			return nil, fmt.Errorf("document %d: %w", i+1, err)
		}
		if tm.Kind == "" && tm.APIVersion == "" && isEmpty([]byte(doc)) {
			continue
		}
		var obj any
		var want string
		switch tm.Kind {
		case "ServiceAccount":
			o := &corev1.ServiceAccount{}
			objs.ServiceAccounts, obj, want = append(objs.ServiceAccounts, o), o, "v1"
		case "Service":
			o := &corev1.Service{}
			objs.Services, obj, want = append(objs.Services, o), o, "v1"
		case "ConfigMap":
			o := &corev1.ConfigMap{}
			objs.ConfigMaps, obj, want = append(objs.ConfigMaps, o), o, "v1"
		case "Role":
			o := &rbacv1.Role{}
			objs.Roles, obj, want = append(objs.Roles, o), o, rbacv1.SchemeGroupVersion.String()
		case "RoleBinding":
			o := &rbacv1.RoleBinding{}
			objs.RoleBindings, obj, want = append(objs.RoleBindings, o), o, rbacv1.SchemeGroupVersion.String()
		case "DaemonSet":
			o := &appsv1.DaemonSet{}
			objs.DaemonSets, obj, want = append(objs.DaemonSets, o), o, appsv1.SchemeGroupVersion.String()
		case "Job":
			o := &batchv1.Job{}
			objs.Jobs, obj, want = append(objs.Jobs, o), o, batchv1.SchemeGroupVersion.String()
		case "ServiceMonitor":
			o := &ServiceMonitor{}
			objs.ServiceMonitors, obj, want = append(objs.ServiceMonitors, o), o, MonitoringAPIVersion
		case "PrometheusRule":
			o := &PrometheusRule{}
			objs.PrometheusRules, obj, want = append(objs.PrometheusRules, o), o, MonitoringAPIVersion
		default:
			return nil, fmt.Errorf("document %d: unexpected kind %q", i+1, tm.Kind)
		}
		if tm.APIVersion != want {
			return nil, fmt.Errorf("document %d: %s has apiVersion %q, want %q", i+1, tm.Kind, tm.APIVersion, want)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			return nil, fmt.Errorf("document %d (%s): %w", i+1, tm.Kind, err)
		}
	}
	return objs, nil
}

// isEmpty reports whether a YAML document has nothing but comments and blank lines.
func isEmpty(doc []byte) bool {
	for line := range bytes.SplitSeq(doc, []byte("\n")) {
		line = bytes.TrimSpace(line)
		if len(line) > 0 && line[0] != '#' {
			return false
		}
	}
	return true
}

// ConfigMap returns the object's ConfigMap named name, or nil.
func (o *Objects) ConfigMap(name string) *corev1.ConfigMap {
	for _, c := range o.ConfigMaps {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// Service returns the object's Service named name, or nil.
func (o *Objects) Service(name string) *corev1.Service {
	for _, s := range o.Services {
		if s.Name == name {
			return s
		}
	}
	return nil
}

// RulesFile is the PrometheusRule's groups as a Prometheus rules file (rule_files, promtool check rules):
// what prometheus-operator hands its Prometheus.
func (r *PrometheusRule) RulesFile() ([]byte, error) {
	out, err := yaml.Marshal(r.Spec)
	if err != nil {
		return nil, fmt.Errorf("writing the rules file of PrometheusRule %s: %w", r.Name, err)
	}
	return out, nil
}
