package kubernetes

import (
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/nodelocaldns/nodelocaldns/corefile"
)

func TestEveryManifestIsListed(t *testing.T) {
	yamls, err := filepath.Glob("*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var listed []string
	for _, m := range Manifests {
		listed = append(listed, m.File)
	}
	slices.Sort(yamls)
	slices.Sort(listed)
	if !slices.Equal(yamls, listed) {
		t.Errorf("manifests on disk %v, listed %v", yamls, listed)
	}
}

func TestManifests(t *testing.T) {
	for _, m := range Manifests {
		t.Run(m.File, func(t *testing.T) {
			objs, err := Load(m.File)
			if err != nil {
				t.Fatal(err)
			}
			cfg := m.Config
			if len(objs.ServiceAccounts) != 1 || len(objs.Roles) != 1 || len(objs.RoleBindings) != 1 ||
				len(objs.Services) != 2 || len(objs.ConfigMaps) != 1 || len(objs.DaemonSets) != 1 {
				t.Fatalf("objects: %d ServiceAccounts, %d Roles, %d RoleBindings, %d Services, %d ConfigMaps, %d DaemonSets",
					len(objs.ServiceAccounts), len(objs.Roles), len(objs.RoleBindings), len(objs.Services),
					len(objs.ConfigMaps), len(objs.DaemonSets))
			}
			ds := objs.DaemonSets[0]
			pod := ds.Spec.Template.Spec
			sa := objs.ServiceAccounts[0]
			if pod.ServiceAccountName != sa.Name {
				t.Errorf("DaemonSet runs as %q, the ServiceAccount is %q", pod.ServiceAccountName, sa.Name)
			}

			// RBAC: upstreamsvc lists and watches kube-dns-upstream in kube-system, the cache kube-dns where it
			// holds the kube-dns ClusterIP (its ClusterIPs of both families, for the hand-over), the cache and
			// the guard their own DaemonSet, nothing else.
			rb := objs.RoleBindings[0]
			if rb.RoleRef.Name != objs.Roles[0].Name || len(rb.Subjects) != 1 || rb.Subjects[0].Name != sa.Name ||
				rb.Subjects[0].Namespace != sa.Namespace {
				t.Errorf("RoleBinding %+v does not bind the ServiceAccount to the Role", rb)
			}
			services := []string{"kube-dns-upstream"}
			if m.Config.Mode != corefile.ModeIPVS {
				services = append(services, "kube-dns")
			}
			wantRules := []rbacv1.PolicyRule{
				{APIGroups: []string{""}, Resources: []string{"services"}, ResourceNames: services, Verbs: []string{"list", "watch"}},
				{APIGroups: []string{"apps"}, Resources: []string{"daemonsets"}, ResourceNames: []string{ds.Name}, Verbs: []string{"list", "watch"}},
			}
			if !reflect.DeepEqual(objs.Roles[0].Rules, wantRules) {
				t.Errorf("Role rules %+v, want %+v", objs.Roles[0].Rules, wantRules)
			}
			// The cache and the guard watch that DaemonSet: its deletion is an uninstall. The guard then
			// cleans up once the cache has let go of the node lock, which it mounts.
			for _, c := range slices.Concat(pod.InitContainers, pod.Containers) {
				if i := slices.Index(c.Args, "-daemonset"); i < 0 || i+1 == len(c.Args) || c.Args[i+1] != ds.Namespace+"/"+ds.Name {
					t.Errorf("container %s: args %v, want -daemonset %s/%s", c.Name, c.Args, ds.Namespace, ds.Name)
				}
				if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == "/run/nodelocaldns.lock" }) {
					t.Errorf("container %s does not mount the node lock", c.Name)
				}
			}

			// The Corefile: the typed configuration's template, free of hazards.
			cm := objs.ConfigMap("node-local-dns")
			if cm == nil {
				t.Fatal("no node-local-dns ConfigMap")
			}
			want, err := corefile.Template(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if cm.Data["Corefile"] != string(want) {
				t.Errorf("ConfigMap Corefile is not corefile.Template of %s's configuration:\n%s\nwant\n%s", m.File, cm.Data["Corefile"], want)
			}
			hazards, err := corefile.Check([]byte(cm.Data["Corefile"]), corefile.CheckOptions{ClusterDomain: corefile.DefaultClusterDomain})
			if err != nil || len(hazards) > 0 {
				t.Errorf("Check(ConfigMap Corefile): %v %v", hazards, err)
			}

			// kube-dns-upstream selects the cluster DNS Pods on both protocols.
			up := objs.Service("kube-dns-upstream")
			if up == nil || up.Spec.Selector["k8s-app"] != "kube-dns" || len(up.Spec.Ports) != 2 {
				t.Fatalf("kube-dns-upstream: %+v", up)
			}
			for i, proto := range []corev1.Protocol{corev1.ProtocolUDP, corev1.ProtocolTCP} {
				if p := up.Spec.Ports[i]; p.Protocol != proto || p.Port != 53 || p.TargetPort != intstr.FromInt32(53) {
					t.Errorf("kube-dns-upstream port %d: %+v", i, p)
				}
			}
			if len(cfg.LocalIPs) > 1 && (up.Spec.IPFamilyPolicy == nil || *up.Spec.IPFamilyPolicy == corev1.IPFamilyPolicySingleStack) {
				t.Error("dual-stack manifest with a single-stack kube-dns-upstream")
			}

			// The DaemonSet's pod.
			if !pod.HostNetwork || pod.DNSPolicy != corev1.DNSDefault || pod.PriorityClassName != "system-node-critical" {
				t.Errorf("hostNetwork %v, dnsPolicy %q, priority %q", pod.HostNetwork, pod.DNSPolicy, pod.PriorityClassName)
			}
			if ds.Spec.Selector.MatchLabels["k8s-app"] != ds.Spec.Template.Labels["k8s-app"] {
				t.Error("DaemonSet selector does not match its pods")
			}
			if len(pod.Containers) != 1 {
				t.Fatalf("%d containers", len(pod.Containers))
			}
			c := pod.Containers[0]
			if c.SecurityContext == nil || c.SecurityContext.Capabilities == nil || !slices.Contains(c.SecurityContext.Capabilities.Add, "NET_ADMIN") {
				t.Error("no NET_ADMIN")
			}
			checkMounts(t, pod, c)
			full := withDefaults(cfg)
			checkProbe(t, "readiness", c.ReadinessProbe, full.LocalIPs[0], "/ready", full.ReadyPort)
			checkProbe(t, "liveness", c.LivenessProbe, full.LocalIPs[0], "/health", full.HealthPort)

			// -localip: what the cache binds, which depends on kube-proxy's mode.
			var listen []string
			for _, ip := range full.LocalIPs {
				listen = append(listen, ip.String())
			}
			if full.Mode == corefile.ModeIPTables {
				for _, ip := range full.ClusterDNSIPs {
					listen = append(listen, ip.String())
				}
			}
			if got := argValue(c.Args, "-localip"); got != strings.Join(listen, ",") {
				t.Errorf("-localip %q, want %q", got, strings.Join(listen, ","))
			}
			if argValue(c.Args, "-upstreamsvc") != full.Upstream.Service {
				t.Errorf("-upstreamsvc %q", argValue(c.Args, "-upstreamsvc"))
			}

			// Memory: the request, and a limit if ever set, hold the bound corefile.Check computes for the
			// Corefile (README, Memory: about 24 MiB plus twice the caches' byte budget).
			rendered, err := corefile.Render(cfg)
			if err != nil {
				t.Fatal(err)
			}
			req := c.Resources.Requests[corev1.ResourceMemory]
			if hazards, _ := corefile.Check(rendered, corefile.CheckOptions{MemoryLimit: req.Value()}); len(hazards) > 0 {
				t.Errorf("memory request %s is below the bound of the caches' budget: %v", req.String(), hazards)
			}
			if limit, ok := c.Resources.Limits[corev1.ResourceMemory]; ok {
				hazards, _ := corefile.Check(rendered, corefile.CheckOptions{MemoryLimit: limit.Value()})
				if len(hazards) > 0 {
					t.Errorf("memory limit %s: %v", limit.String(), hazards)
				}
			}

			// Metrics: a headless Service on the metrics ports the cache and the guard expose, so that both
			// are scraped: the guard's state is what says a node failed open.
			ms := objs.Service("node-local-dns")
			if ms == nil || ms.Spec.ClusterIP != corev1.ClusterIPNone || ms.Spec.Selector["k8s-app"] != "node-local-dns" ||
				len(ms.Spec.Ports) != 2 || ms.Spec.Ports[0].Port != corefile.DefaultMetricsPort || ms.Spec.Ports[1].Port != 9254 {
				t.Errorf("metrics Service %+v", ms)
			}
			if tp := ms.Spec.Ports[0].TargetPort; tp.IntValue() != corefile.DefaultMetricsPort {
				t.Errorf("metrics Service targets %s, want port %d by number: the containers name no ports", tp.String(), corefile.DefaultMetricsPort)
			}

			// The rolling update surges, using the hand-off: with hostNetwork a declared container port is a
			// host port, which would keep the surge Pod off the node.
			ru := ds.Spec.UpdateStrategy.RollingUpdate
			if ru == nil || ru.MaxSurge == nil || ru.MaxSurge.IntValue() != 1 || ru.MaxUnavailable == nil || ru.MaxUnavailable.IntValue() != 0 {
				t.Errorf("update strategy %+v, want maxSurge 1 and maxUnavailable 0", ds.Spec.UpdateStrategy)
			}
			for _, ct := range append(slices.Clone(pod.InitContainers), pod.Containers...) {
				if len(ct.Ports) > 0 {
					t.Errorf("container %s declares ports %v: host ports under hostNetwork, they block the surge Pod", ct.Name, ct.Ports)
				}
			}
			if g := pod.TerminationGracePeriodSeconds; g == nil || *g < 15 {
				t.Errorf("terminationGracePeriodSeconds %v: the drain and CoreDNS's own shutdown need up to 15 s", g)
			}
			guard := pod.InitContainers[0]
			if !strings.HasSuffix(argValue(guard.Args, "-metrics-listen-address"), ":9254") || ms.Spec.Ports[1].TargetPort.IntValue() != 9254 {
				t.Errorf("the guard does not serve its metrics on the Service's port 9254: %v", guard.Args)
			}
			if !slices.Contains(guard.Args, "-guard.wait") {
				t.Errorf("the guard does not wait for the old Pod's: %v", guard.Args)
			}
			if !strings.HasSuffix(argValue(c.Args, "-prometheus-listen-address"), ":9253") {
				t.Errorf("-prometheus-listen-address %q", argValue(c.Args, "-prometheus-listen-address"))
			}
		})
	}
}

func checkMounts(t *testing.T, pod corev1.PodSpec, c corev1.Container) {
	t.Helper()
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		volumes[v.Name] = v
	}
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m
		if _, ok := volumes[m.Name]; !ok {
			t.Errorf("mount %s: no volume %q", m.MountPath, m.Name)
		}
	}
	xt, ok := mounts["/run/xtables.lock"]
	if v := volumes[xt.Name]; !ok || xt.ReadOnly || v.HostPath == nil || v.HostPath.Path != "/run/xtables.lock" ||
		v.HostPath.Type == nil || *v.HostPath.Type != corev1.HostPathFileOrCreate {
		t.Errorf("xtables lock mount %+v, volume %+v", xt, v)
	}
	// The base Corefile where -basecorefile's default expects it.
	base, ok := mounts["/etc/coredns"]
	if v := volumes[base.Name]; !ok || v.ConfigMap == nil || v.ConfigMap.Name != "node-local-dns" ||
		len(v.ConfigMap.Items) != 1 || v.ConfigMap.Items[0].Key != "Corefile" || v.ConfigMap.Items[0].Path != "Corefile.base" {
		t.Errorf("Corefile.base mount %+v, volume %+v", base, v)
	}
	// The kube-dns ConfigMap where node-cache looks for it by default, optional as kube-dns's own is.
	kd, ok := mounts["/etc/kube-dns"]
	if v := volumes[kd.Name]; !ok || v.ConfigMap == nil || v.ConfigMap.Name != "kube-dns" || v.ConfigMap.Optional == nil || !*v.ConfigMap.Optional {
		t.Errorf("kube-dns mount %+v, volume %+v", kd, v)
	}
}

func checkProbe(t *testing.T, what string, p *corev1.Probe, host netip.Addr, path string, port uint16) {
	t.Helper()
	if p == nil || p.HTTPGet == nil {
		t.Errorf("no %s probe", what)
		return
	}
	g := p.HTTPGet
	if g.Host != host.String() || g.Path != path || g.Port != intstr.FromInt32(int32(port)) {
		t.Errorf("%s probe %s:%s%s, want %s:%d%s", what, g.Host, g.Port.String(), g.Path, host, port, path)
	}
}

func argValue(args []string, name string) string {
	if i := slices.Index(args, name); i >= 0 && i+1 < len(args) {
		return args[i+1]
	}
	return ""
}

// withDefaults fills in the documented defaults of the fields this test reads.
func withDefaults(c corefile.Config) corefile.Config {
	if c.HealthPort == 0 {
		c.HealthPort = corefile.DefaultHealthPort
	}
	if c.ReadyPort == 0 {
		c.ReadyPort = corefile.DefaultReadyPort
	}
	if c.Upstream.Service == "" {
		c.Upstream.Service = corefile.DefaultUpstreamService
	}
	if c.Mode == "" {
		c.Mode = corefile.ModeIPTables
	}
	return c
}

func TestDecodeIsStrict(t *testing.T) {
	data, err := os.ReadFile("nodelocaldns-iptables.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for name, tt := range map[string]struct{ from, to, want string }{
		"unknown field":       {"      hostNetwork: true\n", "      hostNetwork: true\n      hostNetwrok: true\n", "unknown field"},
		"duplicate field":     {"      hostNetwork: true\n", "      hostNetwork: true\n      hostNetwork: false\n", "already set"},
		"wrong apiVersion":    {"apiVersion: apps/v1\nkind: DaemonSet", "apiVersion: extensions/v1beta1\nkind: DaemonSet", `want "apps/v1"`},
		"unexpected kind":     {"kind: ServiceAccount", "kind: ClusterRole", `unexpected kind "ClusterRole"`},
		"wrong type":          {"            port: 8181\n", "            port: [8181]\n", "document"},
		"misplaced field":     {"      priorityClassName: system-node-critical\n", "      priorityClassName: system-node-critical\n      replicas: 3\n", "unknown field"},
		"probe host as array": {"            host: \"169.254.20.10\"\n", "            host: [\"169.254.20.10\"]\n", "document"},
	} {
		t.Run(name, func(t *testing.T) {
			if !strings.Contains(string(data), tt.from) {
				t.Fatalf("manifest lacks %q", tt.from)
			}
			_, err := Decode([]byte(strings.Replace(string(data), tt.from, tt.to, 1)))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want an error containing %q", err, tt.want)
			}
		})
	}
}
