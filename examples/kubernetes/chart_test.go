package kubernetes

import (
	"bytes"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/nodelocaldns/nodelocaldns/corefile"
	"github.com/nodelocaldns/nodelocaldns/internal/helmtest"
)

var update = flag.Bool("update", false, "rewrite the manifests from the chart")

// chartDir is the Helm chart, from this package's directory.
const chartDir = "../../charts/node-local-dns"

// render is `helm template` of the chart as release node-local-dns in kube-system, with extra arguments.
func render(t *testing.T, args ...string) ([]byte, error) {
	t.Helper()
	return helmtest.Template(t, args...)
}

func mustRender(t *testing.T, args ...string) (*Objects, []byte) {
	t.Helper()
	out, err := render(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := Decode(out)
	if err != nil {
		t.Fatalf("decoding the rendered chart: %v\n%s", err, out)
	}
	return objs, out
}

// TestManifestsAreTheChart keeps the plain manifests and the chart from drifting apart: each manifest is
// its header followed by `helm template` with its values file. -update rewrites them.
func TestManifestsAreTheChart(t *testing.T) {
	for _, m := range Manifests {
		t.Run(m.File, func(t *testing.T) {
			// Without hooks: kubectl apply would run the uninstall hook's Job at once.
			out, err := render(t, "--no-hooks", "-f", filepath.Join(chartDir, m.Values))
			if err != nil {
				t.Fatal(err)
			}
			want := append([]byte(m.FullHeader()), out...)
			if *update {
				if err := os.WriteFile(m.File, want, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			got, err := os.ReadFile(m.File)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s is not the chart rendered with %s; edit the chart and run go test ./examples/kubernetes -run TestManifestsAreTheChart -update", m.File, m.Values)
			}
		})
	}
}

func TestChartLint(t *testing.T) {
	for _, v := range helmtest.CIValues(t) {
		if out, err := helmtest.Run(t, "lint", "--strict", chartDir, "--namespace", "kube-system", "-f", v); err != nil {
			t.Errorf("%s: %v\n%s", filepath.Base(v), err, out)
		}
	}
}

// TestChartAddressesGivenOnce renders the chart with other addresses, domain and ports than the defaults:
// every place that needs one follows the value, and no default is left anywhere.
func TestChartAddressesGivenOnce(t *testing.T) {
	for name, tt := range map[string]struct {
		args   []string
		config corefile.Config
	}{
		"iptables": {
			args: []string{"--set", "localIP={169.254.0.53}", "--set", "clusterDNS={10.32.0.10}"},
			config: corefile.Config{Mode: corefile.ModeIPTables, ClusterDomain: "corp.internal",
				LocalIPs: addrs("169.254.0.53"), ClusterDNSIPs: addrs("10.32.0.10"), HealthPort: 18080, ReadyPort: 18181},
		},
		"nftables": {
			args: []string{"--set", "kubeProxyMode=nftables", "--set", "localIP={169.254.0.53}", "--set", "clusterDNS={10.32.0.10}"},
			config: corefile.Config{Mode: corefile.ModeIPTables, ClusterDomain: "corp.internal",
				LocalIPs: addrs("169.254.0.53"), ClusterDNSIPs: addrs("10.32.0.10"), HealthPort: 18080, ReadyPort: 18181},
		},
		"ipvs, addresses as strings": {
			args: []string{"--set", "kubeProxyMode=ipvs", "--set-string", "localIP=169.254.0.53\\, fd00:169::53", "--set-string", "clusterDNS=10.32.0.10\\,fd00:10:32::a"},
			config: corefile.Config{Mode: corefile.ModeIPVS, ClusterDomain: "corp.internal",
				LocalIPs: addrs("169.254.0.53", "fd00:169::53"), ClusterDNSIPs: addrs("10.32.0.10", "fd00:10:32::a"), HealthPort: 18080, ReadyPort: 18181},
		},
	} {
		t.Run(name, func(t *testing.T) {
			args := append(tt.args, "--set", "domain=corp.internal", "--set", "ports.health=18080", "--set", "ports.ready=18181",
				"--set", "ports.metrics=19253", "--set", "ports.guardMetrics=19254")
			objs, out := mustRender(t, args...)
			for _, def := range []string{"169.254.20.10", "10.96.0.10", "cluster.local", "8080", "8181", "9253", "9254"} {
				if regexp.MustCompile(`\b` + regexp.QuoteMeta(def) + `\b`).Match(out) {
					t.Errorf("the default %s is still in the rendered chart", def)
				}
			}
			checkChartObjects(t, objs, tt.config, 19253, 19254)
		})
	}
}

// TestChartCacheMemory: the cache's byte budget follows cacheMemoryMiB, split over the blocks as
// corefile.Template splits Cache.Memory (40 MiB gives a reverse zone 2560 KiB, not a whole MiB).
func TestChartCacheMemory(t *testing.T) {
	objs, _ := mustRender(t, "--set", "cacheMemoryMiB=40")
	checkChartObjects(t, objs, corefile.Config{Mode: corefile.ModeIPTables, LocalIPs: addrs("169.254.20.10"),
		ClusterDNSIPs: addrs("10.96.0.10"), HealthPort: 8080, ReadyPort: 8181, Cache: corefile.Cache{Memory: 40 << 20}}, 9253, 9254)
}

// checkChartObjects checks a rendered chart against the configuration it was given.
func checkChartObjects(t *testing.T, objs *Objects, cfg corefile.Config, metricsPort, guardPort int32) {
	t.Helper()
	cm := objs.ConfigMap("node-local-dns")
	want, err := corefile.Template(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if cm == nil || cm.Data["Corefile"] != string(want) {
		t.Errorf("Corefile is not corefile.Template of the values:\n%v\nwant\n%s", cm, want)
	}
	ds := objs.DaemonSets[0]
	cache := ds.Spec.Template.Spec.Containers[0]
	checkProbe(t, "readiness", cache.ReadinessProbe, cfg.LocalIPs[0], "/ready", cfg.ReadyPort)
	checkProbe(t, "liveness", cache.LivenessProbe, cfg.LocalIPs[0], "/health", cfg.HealthPort)
	listen := ipList(cfg.LocalIPs)
	if cfg.Mode == corefile.ModeIPTables {
		listen += "," + ipList(cfg.ClusterDNSIPs)
	}
	if got := argValue(cache.Args, "-localip"); got != listen {
		t.Errorf("cache -localip %q, want %q", got, listen)
	}
	if got := argValue(cache.Args, "-prometheus-listen-address"); got != fmt.Sprintf("$(HOST_IP):%d", metricsPort) {
		t.Errorf("-prometheus-listen-address %q", got)
	}
	guard := guardContainer(t, ds)
	if got := argValue(guard.Args, "-localip"); got != listen {
		t.Errorf("guard -localip %q, want %q", got, listen)
	}
	wantServiceIPs := ""
	if cfg.Mode == corefile.ModeIPTables {
		wantServiceIPs = ipList(cfg.ClusterDNSIPs)
	}
	if got := argValue(guard.Args, "-guard.serviceips"); got != wantServiceIPs {
		t.Errorf("-guard.serviceips %q, want %q", got, wantServiceIPs)
	}
	if got := argValue(guard.Args, "-metrics-listen-address"); got != fmt.Sprintf("$(HOST_IP):%d", guardPort) {
		t.Errorf("guard -metrics-listen-address %q", got)
	}
	ms := objs.Service("node-local-dns")
	if ms == nil || len(ms.Spec.Ports) != 2 || ms.Spec.Ports[0].Port != metricsPort || ms.Spec.Ports[1].Port != guardPort {
		t.Errorf("metrics Service %+v: want the cache's and the guard's metrics ports", ms)
	}
	up := objs.Service("kube-dns-upstream")
	dual := len(cfg.ClusterDNSIPs) > 1
	if up == nil || dual != (up.Spec.IPFamilyPolicy != nil && *up.Spec.IPFamilyPolicy == corev1.IPFamilyPolicyPreferDualStack) {
		t.Errorf("kube-dns-upstream %+v for ClusterIPs %v", up, cfg.ClusterDNSIPs)
	}
}

func ipList(ips []netip.Addr) string {
	s := make([]string, len(ips))
	for i, ip := range ips {
		s[i] = ip.String()
	}
	return strings.Join(s, ",")
}

// guardContainer returns the DaemonSet's guard, a native sidecar or an ordinary container.
func guardContainer(t *testing.T, ds *appsv1.DaemonSet) corev1.Container {
	t.Helper()
	pod := ds.Spec.Template.Spec
	for _, c := range append(slices.Clone(pod.InitContainers), pod.Containers...) {
		if c.Name == "guard" {
			return c
		}
	}
	t.Fatal("no guard container")
	return corev1.Container{}
}

func TestChartOptions(t *testing.T) {
	t.Run("guard off", func(t *testing.T) {
		objs, _ := mustRender(t, "--set", "guard.enabled=false")
		pod := objs.DaemonSets[0].Spec.Template.Spec
		if len(pod.InitContainers) != 0 || len(pod.Containers) != 1 {
			t.Errorf("%d init containers, %d containers, want the cache only", len(pod.InitContainers), len(pod.Containers))
		}
		for _, v := range pod.Volumes {
			if v.Name == "guard-lock" {
				t.Error("guard-lock volume without a guard")
			}
		}
		if ms := objs.Service("node-local-dns"); len(ms.Spec.Ports) != 1 {
			t.Errorf("metrics Service ports %+v, want the cache's only", ms.Spec.Ports)
		}
	})
	t.Run("guard as an ordinary container", func(t *testing.T) {
		objs, _ := mustRender(t, "--set", "guard.nativeSidecar=false")
		pod := objs.DaemonSets[0].Spec.Template.Spec
		if len(pod.InitContainers) != 0 || len(pod.Containers) != 2 || pod.Containers[1].Name != "guard" || pod.Containers[1].RestartPolicy != nil {
			t.Errorf("init containers %d, containers %+v", len(pod.InitContainers), pod.Containers)
		}
	})
	t.Run("no clean-up on uninstall", func(t *testing.T) {
		objs, _ := mustRender(t, "--set", "cleanupOnUninstall=false")
		if rules := objs.Roles[0].Rules; len(rules) != 1 || !slices.Equal(rules[0].Resources, []string{"services"}) {
			t.Errorf("Role rules %+v, want the Service's only", rules)
		}
		pod := objs.DaemonSets[0].Spec.Template.Spec
		for _, c := range slices.Concat(pod.InitContainers, pod.Containers) {
			if slices.Contains(c.Args, "-daemonset") {
				t.Errorf("container %s watches its DaemonSet: %v", c.Name, c.Args)
			}
			// Still mounted: the guard watches it to learn at once that the cache died.
			if c.Name == "guard" && !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == "node-lock" }) {
				t.Error("the guard does not mount the cache's node lock, through which it learns that the cache died")
			}
		}
	})
	t.Run("selector as upstream's", func(t *testing.T) {
		// A DaemonSet's selector cannot change: with upstream's, applying over its node-local-dns works.
		objs, _ := mustRender(t)
		ds := objs.DaemonSets[0]
		if sel := ds.Spec.Selector.MatchLabels; len(sel) != 1 || sel["k8s-app"] != "node-local-dns" {
			t.Errorf("selector %v, want upstream's k8s-app: node-local-dns only", sel)
		}
		if ms := objs.Service("node-local-dns"); len(ms.Spec.Selector) != 1 || ms.Spec.Selector["k8s-app"] != "node-local-dns" {
			t.Errorf("metrics Service selector %v", ms.Spec.Selector)
		}
	})
	t.Run("native sidecar", func(t *testing.T) {
		objs, _ := mustRender(t)
		pod := objs.DaemonSets[0].Spec.Template.Spec
		if len(pod.InitContainers) != 1 || pod.InitContainers[0].RestartPolicy == nil || *pod.InitContainers[0].RestartPolicy != corev1.ContainerRestartPolicyAlways {
			t.Errorf("init containers %+v, want the guard with restartPolicy Always", pod.InitContainers)
		}
	})
	t.Run("scheduling and resources", func(t *testing.T) {
		objs, _ := mustRender(t, "--set", "image.repository=registry.example/nc", "--set", "image.tag=v9",
			"--set", "priorityClassName=node-dns", "--set", "resources.requests.memory=200Mi", "--set", "resources.limits.memory=400Mi",
			"--set", "updateStrategy.rollingUpdate.maxUnavailable=1", "--set", "tolerations[0].key=dedicated",
			"--set", "tolerations[0].operator=Exists", "--set", "nodeSelector.pool=canary")
		ds := objs.DaemonSets[0]
		pod := ds.Spec.Template.Spec
		c := pod.Containers[0]
		if c.Image != "registry.example/nc:v9" || guardContainer(t, ds).Image != c.Image {
			t.Errorf("image %q", c.Image)
		}
		if pod.PriorityClassName != "node-dns" || pod.NodeSelector["pool"] != "canary" || len(pod.Tolerations) != 1 || pod.Tolerations[0].Key != "dedicated" {
			t.Errorf("priority %q, nodeSelector %v, tolerations %+v", pod.PriorityClassName, pod.NodeSelector, pod.Tolerations)
		}
		if m := c.Resources.Limits[corev1.ResourceMemory]; m.Cmp(resource.MustParse("400Mi")) != 0 {
			t.Errorf("memory limit %s", m.String())
		}
		if u := ds.Spec.UpdateStrategy.RollingUpdate; u == nil || *u.MaxUnavailable != intstr.FromInt32(1) {
			t.Errorf("updateStrategy %+v", ds.Spec.UpdateStrategy)
		}
	})
	t.Run("another release name", func(t *testing.T) {
		out, err := helmtest.Run(t, "template", "dns", chartDir, "--namespace", "kube-system")
		if err != nil {
			t.Fatal(err)
		}
		objs, err := Decode(out)
		if err != nil {
			t.Fatal(err)
		}
		ds := objs.DaemonSets[0]
		pod := ds.Spec.Template.Spec
		if ds.Name != "dns-node-local-dns" || pod.ServiceAccountName != objs.ServiceAccounts[0].Name ||
			len(ds.Spec.Selector.MatchLabels) != 1 || ds.Spec.Selector.MatchLabels["k8s-app"] != ds.Spec.Template.Labels["k8s-app"] {
			t.Errorf("DaemonSet %s, ServiceAccount %s, selector %v", ds.Name, pod.ServiceAccountName, ds.Spec.Selector.MatchLabels)
		}
		var cmName string
		for _, v := range pod.Volumes {
			if v.Name == "config-volume" {
				cmName = v.ConfigMap.Name
			}
		}
		if objs.ConfigMap(cmName) == nil {
			t.Errorf("the DaemonSet mounts ConfigMap %q, which the chart does not create", cmName)
		}
	})
}

// TestChartRefuses checks that values which would break a node are refused at render time, with a message
// that says why.
func TestChartRefuses(t *testing.T) {
	for name, tt := range map[string]struct {
		args []string
		want string
	}{
		"unknown kube-proxy mode":                    {[]string{"--set", "kubeProxyMode=userspace"}, "kubeProxyMode"},
		"another namespace":                          {[]string{"--namespace", "dns"}, "install into kube-system"},
		"a short grace period":                       {[]string{"--set", "terminationGracePeriodSeconds=5"}, "terminationGracePeriodSeconds"},
		"no local address":                           {[]string{"--set-string", "localIP="}, "localIP"},
		"ServiceMonitor without prometheus-operator": {[]string{"--set", "serviceMonitor.enabled=true"}, "does not serve monitoring.coreos.com/v1"},
		"PrometheusRule without prometheus-operator": {[]string{"--set", "prometheusRule.enabled=true"}, "does not serve monitoring.coreos.com/v1"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := render(t, tt.args...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want an error saying %q", err, tt.want)
			}
		})
	}
	// With the API served, the same values render.
	objs, _ := mustRender(t, "--set", "serviceMonitor.enabled=true,prometheusRule.enabled=true", "--api-versions", MonitoringAPIVersion)
	if len(objs.ServiceMonitors) != 1 || len(objs.PrometheusRules) != 1 {
		t.Errorf("%d ServiceMonitors, %d PrometheusRules with the API served", len(objs.ServiceMonitors), len(objs.PrometheusRules))
	}
}
