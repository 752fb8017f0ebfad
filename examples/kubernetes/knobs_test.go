package kubernetes

import (
	"encoding/json"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/hosts"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/nodelocaldns/nodelocaldns"
	"github.com/nodelocaldns/nodelocaldns/corefile"
	"github.com/nodelocaldns/nodelocaldns/internal/helmtest"
	_ "github.com/nodelocaldns/nodelocaldns/plugin/clamp"
	_ "github.com/nodelocaldns/nodelocaldns/plugin/health"
	_ "github.com/nodelocaldns/nodelocaldns/plugin/wirecache"
)

// knobsValues sets every knob of the chart; test/kubeapi creates what it renders with strict validation.
const knobsValues = chartDir + "/ci/knobs-values.yaml"

// TestChartKnobs renders the chart with every knob set and checks that each lands where it should.
func TestChartKnobs(t *testing.T) {
	objs, _ := mustRender(t, "-f", knobsValues)
	ds := objs.DaemonSets[0]
	pod := ds.Spec.Template
	if ds.Name != "node-dns" || ds.Labels["team"] != "dns" || ds.Annotations["example.com/owner"] != "dns-team" {
		t.Errorf("DaemonSet %s, labels %v, annotations %v", ds.Name, ds.Labels, ds.Annotations)
	}
	if sel := ds.Spec.Selector.MatchLabels; len(sel) != 1 || sel["k8s-app"] != "node-dns" {
		t.Errorf("selector %v, want k8s-app: node-dns (fullnameOverride) alone", sel)
	}
	if pod.Labels["team"] != "dns" || pod.Labels["app.kubernetes.io/name"] != "nld" || pod.Annotations["example.com/scrape"] != "false" {
		t.Errorf("Pod labels %v, annotations %v", pod.Labels, pod.Annotations)
	}
	if a := pod.Spec.Affinity; a == nil || a.NodeAffinity == nil ||
		a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions[0].Key != "node.example/no-node-dns" {
		t.Errorf("affinity %+v", a)
	}
	if sa := objs.ServiceAccounts[0]; sa.Name != "node-dns-sa" || pod.Spec.ServiceAccountName != "node-dns-sa" ||
		sa.Annotations["example.com/role"] != "node-dns" || objs.RoleBindings[0].Subjects[0].Name != "node-dns-sa" {
		t.Errorf("ServiceAccount %+v, the Pods' %q, bound %+v", sa, pod.Spec.ServiceAccountName, objs.RoleBindings[0].Subjects)
	}
	cache := pod.Spec.Containers[0]
	for _, c := range []corev1.Container{cache, guardContainer(t, ds)} {
		sc := c.SecurityContext
		if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) ||
			!slices.Equal(sc.Capabilities.Add, []corev1.Capability{"NET_ADMIN"}) {
			t.Errorf("%s securityContext %+v", c.Name, sc)
		}
	}
	if !slices.ContainsFunc(cache.Env, func(e corev1.EnvVar) bool { return e.Name == "GODEBUG" && e.Value == "netdns=go" }) {
		t.Errorf("cache env %+v", cache.Env)
	}
	if !slices.ContainsFunc(cache.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == "extra-zones" && m.MountPath == "/etc/coredns-extra" }) ||
		!slices.ContainsFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == "extra-zones" && v.ConfigMap != nil }) {
		t.Errorf("extra volume missing: mounts %+v", cache.VolumeMounts)
	}
	if got := argValue(cache.Args, "-daemonset"); got != "kube-system/node-dns" {
		t.Errorf("-daemonset %q, want the overridden name", got)
	}

	// The ConfigMap: the hosts file beside the Corefile, mounted where the Corefile's hosts reads it.
	cm := objs.ConfigMap("node-dns")
	if cm == nil || cm.Data["hosts"] != "10.0.0.10 registry.corp.example mirror.corp.example\nfd00::10 registry.corp.example\n" {
		t.Fatalf("ConfigMap %+v", cm)
	}
	var items []corev1.KeyToPath
	for _, v := range pod.Spec.Volumes {
		if v.Name == "config-volume" {
			items = v.ConfigMap.Items
		}
	}
	if !slices.Contains(items, corev1.KeyToPath{Key: "hosts", Path: "hosts"}) {
		t.Errorf("config-volume items %+v: no hosts", items)
	}

	up := objs.Service("kube-dns-upstream")
	if up == nil || up.Spec.TrafficDistribution == nil || *up.Spec.TrafficDistribution != corev1.ServiceTrafficDistributionPreferSameNode {
		t.Errorf("kube-dns-upstream %+v, want trafficDistribution PreferSameNode", up)
	}

	sm := objs.ServiceMonitors[0]
	if sm.Namespace != "monitoring" || !slices.Equal(sm.Spec.NamespaceSelector.MatchNames, []string{"kube-system"}) || len(sm.Spec.Endpoints) != 2 {
		t.Fatalf("ServiceMonitor %+v", sm)
	}
	for _, e := range sm.Spec.Endpoints {
		if len(e.Relabelings) != 1 || e.Relabelings[0].TargetLabel != "node" || len(e.MetricRelabelings) != 1 || e.MetricRelabelings[0].Action != "drop" {
			t.Errorf("endpoint %s relabelings %+v, metricRelabelings %+v", e.Port, e.Relabelings, e.MetricRelabelings)
		}
	}
	dash := objs.ConfigMap("node-dns-dashboard")
	if dash == nil || dash.Namespace != "monitoring" || dash.Annotations["grafana_folder"] != "DNS" || dash.Labels["grafana_dashboard"] != "1" {
		t.Errorf("dashboard %v", dash.ObjectMeta)
	}

	// The Corefile: every block, the knobs in them.
	f, err := corefile.Parse([]byte(cm.Data["Corefile"]))
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, b := range f.Blocks {
		keys = append(keys, strings.Join(b.Keys, " "))
	}
	if want := []string{"cluster.local:53", "in-addr.arpa:53", "ip6.arpa:53", ".:53", "corp.example:53 10.in-addr.arpa:53", "internal.example:53", "consul.example:53"}; !slices.Equal(keys, want) {
		t.Fatalf("blocks %q, want %q", keys, want)
	}
	for i, b := range f.Blocks[:6] {
		if d := directive(b, "hosts"); d == nil || !slices.Equal(d.Args, []string{"/etc/coredns/hosts"}) || d.Block[0].Name != "fallthrough" {
			t.Errorf("%s: hosts %+v", keys[i], d)
		}
	}
	// queryLog: the cluster domain logs, and the cache plugin caches it instead of wirecache, with the
	// capacities, TTLs, prefetch and serve_stale of the values; clamp keeps the TTL knobs' windows.
	cluster := f.Blocks[0]
	if directive(cluster, "log") == nil || directive(cluster, "wirecache") != nil {
		t.Error("queryLog: the cluster domain has no log, or keeps wirecache")
	}
	want := map[string][]string{"success": {"20000", "60"}, "denial": {"5000", "10"}, "prefetch": {"5", "2m", "20%"}, "serve_stale": {"30m", "verify", "2s", "10s"},
		"serve_stale_policy": {"prefer_positive"}}
	if c := directive(cluster, "cache"); c == nil || !sameOptions(c, want) {
		t.Errorf("cluster cache %s, want %v", dump(c), want)
	}
	if c := directive(cluster, "clamp"); c == nil || !sameOptions(c, map[string][]string{"success": {"5", "60"}, "denial": {"5", "10"}}) {
		t.Errorf("cluster clamp %s", dump(c))
	}
	// The other blocks and the zone with a cacheTTL: wirecache alone, with its share of cacheMemoryMiB (32:
	// 2 MiB a sixteenth) and serve_stale, and clamp with otherTTL or the zone's cacheTTL.
	for i, b := range f.Blocks[1:5] {
		kib, ttl := []int{2048, 2048, 8192, 8192}[i], []string{"120", "120", "120", "60"}[i]
		if c := directive(b, "cache"); c != nil {
			t.Errorf("%s: a cache plugin beside wirecache: %s", keys[i+1], dump(c))
		}
		want := map[string][]string{"capacity": {strconv.Itoa(kib * 1024 / 256)}, "max_memory": {strconv.Itoa(kib>>10) + "MiB"}, "serve_stale": {"30m", "10s", "2s", "prefer_positive"}}
		if w := directive(b, "wirecache"); w == nil || !sameOptions(w, want) {
			t.Errorf("%s: wirecache %s, want %v", keys[i+1], dump(w), want)
		}
		if c := directive(b, "clamp"); c == nil || !sameOptions(c, map[string][]string{"success": {"5", ttl}, "denial": {"5", ttl}}) {
			t.Errorf("%s: clamp %s, want 5 %s", keys[i+1], dump(c), ttl)
		}
	}
	// upstreamMaxAttempts: the retry budget of the cluster forward, which node-cache turns into upstreamsvc's
	// max_attempts.
	for i, b := range f.Blocks[:3] {
		want := map[string][]string{"force_tcp": nil, "max_connect_attempts": {"3"}}
		if fwd := directive(b, "forward"); fwd == nil || !slices.Equal(fwd.Args, []string{".", corefile.ClusterDNSVar}) || !sameOptions(fwd, want) {
			t.Errorf("%s: cluster forward %s, want %v", keys[i], dump(fwd), want)
		}
	}
	// serveStale.preferPositive: node-cache also adds the policy where it adds serve_stale.
	if got := argValue(cache.Args, "-servestalepolicy"); got != "prefer_positive" {
		t.Errorf("-servestalepolicy %q, want prefer_positive", got)
	}
	root := directive(f.Blocks[3], "forward")
	if !slices.Equal(root.Args, []string{".", "192.0.2.53", "192.0.2.54:5353"}) || len(root.Block) != 7 || directive(&corefile.Block{Directives: root.Block}, "prefer_udp") == nil {
		t.Errorf(". forward %+v", root)
	}
	if fwd := directive(f.Blocks[4], "forward"); !slices.Equal(fwd.Args, []string{".", "10.0.0.53", "10.0.1.53"}) || len(fwd.Block) != 2 {
		t.Errorf("zone forward %+v", fwd)
	}
	if directive(f.Blocks[5], "cache") != nil || directive(f.Blocks[5], "wirecache") != nil || directive(f.Blocks[5], "clamp") != nil {
		t.Error("cacheTTL 0 leaves a cache or clamp in internal.example")
	}
}

// sameOptions reports whether d's block has exactly the options of want, by name, with those arguments.
func sameOptions(d *corefile.Directive, want map[string][]string) bool {
	if len(d.Block) != len(want) {
		return false
	}
	for _, o := range d.Block {
		if args, ok := want[o.Name]; !ok || !slices.Equal(o.Args, args) {
			return false
		}
	}
	return true
}

// dump writes a directive and its block as the Corefile has them, for a test's message.
func dump(d *corefile.Directive) string {
	if d == nil {
		return "<none>"
	}
	return string((&corefile.File{Blocks: []*corefile.Block{{Keys: []string{"."}, Directives: []*corefile.Directive{d}}}}).Format())
}

// directive returns b's first directive called name, or nil.
func directive(b *corefile.Block, name string) *corefile.Directive {
	for _, d := range b.Directives {
		if d.Name == name {
			return d
		}
	}
	return nil
}

// TestChartCorefileIsTemplate: with the Corefile values corefile.Config knows set, the chart's Corefile is
// still corefile.Template of that configuration.
func TestChartCorefileIsTemplate(t *testing.T) {
	base := corefile.Config{Mode: corefile.ModeIPTables, LocalIPs: addrs("169.254.20.10"), ClusterDNSIPs: addrs("10.96.0.10")}
	for name, tt := range map[string]struct {
		args  []string
		edit  func(*corefile.Config)
		check func(*testing.T, *Objects) // more to check on the rendered objects, if set
	}{
		"caches": {
			args: []string{"--set", "cache.success.capacity=20000,cache.success.ttl=60,cache.denial.capacity=5000,cache.denial.ttl=10,cache.otherTTL=120"},
			edit: func(c *corefile.Config) {
				c.Cache = corefile.Cache{SuccessCapacity: 20000, SuccessTTL: 60, DenialCapacity: 5000, DenialTTL: 10, OtherTTL: 120}
				c.Clamp = corefile.Clamp{SuccessMin: 5, SuccessMax: 60, DenialMin: 5, DenialMax: 10}
			},
		},
		"serve stale": {
			args: []string{"--set", "serveStale.for=30m,serveStale.ttl=10s,serveStale.verify=2s"},
			edit: func(c *corefile.Config) {
				c.ServeStale = corefile.ServeStale{For: 30 * time.Minute, TTL: 10 * time.Second, Verify: 2 * time.Second}
			},
		},
		"query log": {args: []string{"--set", "queryLog=true"}, edit: func(c *corefile.Config) { c.Log = true }},
		// The cluster domain's cache plugin, with the caches' and serve-stale knobs.
		"query log, caches and serve stale": {
			args: []string{"--set", "queryLog=true,cache.success.capacity=20000,cache.success.ttl=60,cache.denial.capacity=5000,cache.denial.ttl=10,cache.otherTTL=3",
				"--set", "serveStale.for=30m,serveStale.ttl=10s,serveStale.verify=500ms"},
			edit: func(c *corefile.Config) {
				c.Log = true
				c.Cache = corefile.Cache{SuccessCapacity: 20000, SuccessTTL: 60, DenialCapacity: 5000, DenialTTL: 10, OtherTTL: 3}
				c.ServeStale = corefile.ServeStale{For: 30 * time.Minute, TTL: 10 * time.Second, Verify: 500 * time.Millisecond}
			},
		},
		"serve stale off": {
			args: []string{"--set", "serveStale.enabled=false"},
			check: func(t *testing.T, objs *Objects) {
				// node-cache adds no serve_stale of its own either.
				args := objs.DaemonSets[0].Spec.Template.Spec.Containers[0].Args
				if !slices.Contains(args, "-servestale=false") || slices.Contains(args, "-servestalepolicy") {
					t.Errorf("cache args %q, want -servestale=false and no -servestalepolicy", args)
				}
			},
			edit: func(c *corefile.Config) { c.ServeStale = corefile.ServeStale{Disabled: true} },
		},
		"serve stale off, query log": {
			args: []string{"--set", "serveStale.enabled=false,queryLog=true"},
			edit: func(c *corefile.Config) { c.ServeStale = corefile.ServeStale{Disabled: true}; c.Log = true },
		},
		"prefer positive, query log": {
			args: []string{"--set", "serveStale.preferPositive=true,queryLog=true"},
			edit: func(c *corefile.Config) { c.ServeStale = corefile.ServeStale{PreferPositive: true}; c.Log = true },
		},
		"max attempts": {
			args: []string{"--set", "upstreamMaxAttempts=3"},
			edit: func(c *corefile.Config) { c.MaxAttempts = 3 },
		},
		"tcp connections": {
			args: []string{"--set", "tcpConnections.max=300,tcpConnections.perClient=40"},
			edit: func(c *corefile.Config) { c.WireCache.TCPConnections, c.WireCache.TCPConnectionsPerClient = 300, 40 },
		},
		"tcp connections per client": {
			args: []string{"--set", "tcpConnections.perClient=40"},
			edit: func(c *corefile.Config) { c.WireCache.TCPConnectionsPerClient = 40 },
		},
		"tcp connections in all": {
			args: []string{"--set", "tcpConnections.max=64"},
			edit: func(c *corefile.Config) { c.WireCache.TCPConnections = 64 },
		},
		// A budget whose shares are whole GiB (`.`'s) and MiB.
		"budget": {args: []string{"--set", "cacheMemoryMiB=4096"}, edit: func(c *corefile.Config) { c.Cache.Memory = 4 << 30 }},
	} {
		t.Run(name, func(t *testing.T) {
			objs, _ := mustRender(t, tt.args...)
			cfg := base
			tt.edit(&cfg)
			want, err := corefile.Template(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if got := objs.ConfigMap("node-local-dns").Data["Corefile"]; got != string(want) {
				t.Errorf("Corefile\n%s\nis not corefile.Template of %+v:\n%s", got, cfg, want)
			}
			if tt.check != nil {
				tt.check(t, objs)
			}
		})
	}
}

// TestChartCorefilesValid takes the Corefile of the defaults, of each ci values file and of every knob set
// through what node-cache does at start (corefile.Expand with the DaemonSet's addresses, the cluster DNS
// forwarded to directly at kube-dns-upstream's address, as upstreamsvc's fallback would), then checks it with
// corefile.Check (the memory request as the limit the caches must fit) and runs every directive's setup, CoreDNS's own
// parsers, as a start would (caddy's validation pass: nothing listens).
func TestChartCorefilesValid(t *testing.T) {
	cases := map[string][]string{"defaults": nil}
	for _, v := range helmtest.CIValues(t) {
		cases[filepath.Base(v)] = []string{"-f", v}
	}
	setupDNSServer(t)
	for _, name := range slices.Sorted(maps.Keys(cases)) {
		t.Run(name, func(t *testing.T) {
			objs, _ := mustRender(t, append(cases[name], "--api-versions", MonitoringAPIVersion)...)
			cm := objs.ConfigMaps[slices.IndexFunc(objs.ConfigMaps, func(c *corev1.ConfigMap) bool { return c.Data["Corefile"] != "" })]
			ds := objs.DaemonSets[0]
			var listen []netip.Addr
			for s := range strings.SplitSeq(argValue(ds.Spec.Template.Spec.Containers[0].Args, "-localip"), ",") {
				listen = append(listen, netip.MustParseAddr(s))
			}
			// As cmd/node-cache's flags, but for upstreamsvc and notrack, which need a cluster and a node.
			e := corefile.Expansion{LocalIPs: listen, DNSDomain: corefile.DefaultClusterDomain, ClusterDNS: []string{"10.96.0.11"},
				PrometheusEndpoint: "10.0.0.7:9253", Port: corefile.DefaultPort, ServeStale: &corefile.ServeStale{}}
			out, err := corefile.Expand([]byte(cm.Data["Corefile"]), e, corefile.KubeDNS{})
			if err != nil {
				t.Fatal(err)
			}
			// The memory request holds what the caches may take, as the manifests' does (TestManifests).
			req := ds.Spec.Template.Spec.Containers[0].Resources.Requests[corev1.ResourceMemory]
			hazards, err := corefile.Check(out, corefile.CheckOptions{ResolvConf: []byte("nameserver 10.0.0.2\n"), MemoryLimit: req.Value()})
			if err != nil || len(hazards) > 0 {
				t.Errorf("Check: %v %v\n%s", hazards, err, out)
			}
			input := caddy.CaddyfileInput{Contents: out, Filepath: "Corefile", ServerTypeName: "dns"}
			if err := caddy.ValidateAndExecuteDirectives(input, nil, true); err != nil {
				t.Errorf("CoreDNS refuses the Corefile: %v\n%s", err, out)
			}
		})
	}
}

var dnsServerOnce sync.Once

// setupDNSServer registers CoreDNS's server type with the directives compiled into this test, in
// plugin.cfg's order.
func setupDNSServer(t *testing.T) {
	t.Helper()
	var err error
	dnsServerOnce.Do(func() {
		if err = dnsserver.Register(); err != nil {
			return
		}
		var directives []string
		if directives, err = nodelocaldns.CompiledDirectives(); err == nil {
			err = dnsserver.SetDirectives(directives)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestChartUninstallHook: the pre-delete hook deletes the DaemonSet with foreground propagation and waits,
// with a Role for that one DaemonSet; the shipped manifests, which kubectl applies, have no hook.
func TestChartUninstallHook(t *testing.T) {
	objs, _ := mustRender(t)
	if len(objs.Jobs) != 1 {
		t.Fatalf("%d Jobs, want the uninstall hook", len(objs.Jobs))
	}
	job := objs.Jobs[0]
	if job.Annotations["helm.sh/hook"] != "pre-delete" {
		t.Errorf("Job annotations %v", job.Annotations)
	}
	args := job.Spec.Template.Spec.Containers[0].Args
	for _, want := range []string{"delete", "daemonset", "node-local-dns", "--namespace=kube-system", "--cascade=foreground", "--wait=true", "--timeout=120s"} {
		if !slices.Contains(args, want) {
			t.Errorf("hook args %q lack %q", args, want)
		}
	}
	var role, binding bool
	for _, r := range objs.Roles {
		if r.Name == job.Spec.Template.Spec.ServiceAccountName {
			role = r.Annotations["helm.sh/hook"] == "pre-delete" && len(r.Rules) == 1 &&
				slices.Equal(r.Rules[0].ResourceNames, []string{"node-local-dns"}) && slices.Contains(r.Rules[0].Verbs, "delete")
		}
	}
	for _, b := range objs.RoleBindings {
		binding = binding || b.Subjects[0].Name == job.Spec.Template.Spec.ServiceAccountName && b.Annotations["helm.sh/hook"] == "pre-delete"
	}
	if !role || !binding {
		t.Errorf("hook Role for the DaemonSet %v, RoleBinding %v", role, binding)
	}
	if objs, _ := mustRender(t, "--set", "uninstallHook.enabled=false"); len(objs.Jobs) != 0 {
		t.Error("uninstallHook.enabled=false renders a Job")
	}
	for _, m := range Manifests {
		if objs, err := Load(m.File); err != nil || len(objs.Jobs) != 0 {
			t.Errorf("%s: %v, %d Jobs: kubectl apply would run the uninstall hook at once", m.File, err, len(objs.Jobs))
		}
	}
}

// TestChartKnobsRefused: knob values that would break the release are refused at render time.
func TestChartKnobsRefused(t *testing.T) {
	for name, tt := range map[string]struct {
		args []string
		want string
	}{
		"reused ServiceAccount without a name": {[]string{"--set", "serviceAccount.create=false"}, "serviceAccount.name"},
		"podLabels over the selector":          {[]string{"--set", "podLabels.k8s-app=x"}, "k8s-app is the DaemonSet's selector"},
		"hook shorter than the grace period":   {[]string{"--set", "uninstallHook.timeoutSeconds=30"}, "uninstallHook.timeoutSeconds"},
		"unknown forward option":               {[]string{"--set", "forward.options.polcy=sequential"}, "policy"},
		"unknown trafficDistribution":          {[]string{"--set", "upstreamTrafficDistribution=PreferSameRack"}, "PreferSameNode"},
		"zone without servers":                 {[]string{"--set", "zones[0].zones=corp.example"}, "servers"},
		"unknown top-level value":              {[]string{"--set", "podAnotations.a=b"}, "podAnotations"},
		"prefetch without the cache plugin":    {[]string{"--set", "cache.prefetch.enabled=true"}, "cache.prefetch.enabled"},
		"no cache budget":                      {[]string{"--set", "cacheMemoryMiB=0"}, "cacheMemoryMiB"},
		"no attempt at all":                    {[]string{"--set", "upstreamMaxAttempts=0"}, "upstreamMaxAttempts"},
		"prefer positive without serve stale":  {[]string{"--set", "serveStale.enabled=false,serveStale.preferPositive=true"}, "serveStale.preferPositive"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := render(t, tt.args...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want an error saying %q", err, tt.want)
			}
		})
	}
	// A reused ServiceAccount: none created, the Pods and the RoleBinding name it.
	objs, _ := mustRender(t, "--set", "serviceAccount.create=false,serviceAccount.name=dns")
	if len(objs.ServiceAccounts) != 1 || objs.ServiceAccounts[0].Name != "node-local-dns-uninstall" ||
		objs.DaemonSets[0].Spec.Template.Spec.ServiceAccountName != "dns" {
		t.Errorf("ServiceAccounts %d (want the hook's only), the Pods' %q", len(objs.ServiceAccounts), objs.DaemonSets[0].Spec.Template.Spec.ServiceAccountName)
	}
}

// TestChartREADMEListsEveryValue: the chart's README has a row for every key of values.yaml, down into every
// value whose keys the schema closes (cache.prefetch.amount, not resources.requests).
func TestChartREADMEListsEveryValue(t *testing.T) {
	read := func(name string, into any) []byte {
		data, err := os.ReadFile(filepath.Join(chartDir, name))
		if err != nil {
			t.Fatal(err)
		}
		if into != nil {
			if err := yaml.Unmarshal(data, into); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
		}
		return data
	}
	var values map[string]any
	var schema schemaNode
	read("values.yaml", &values)
	read("values.schema.json", &schema)
	readme := string(read("README.md", nil))
	var walk func(prefix string, v map[string]any, s schemaNode)
	walk = func(prefix string, v map[string]any, s schemaNode) {
		for k, sub := range v {
			path := prefix + k
			if m, ok := sub.(map[string]any); ok && string(s.Properties[k].AdditionalProperties) == "false" {
				walk(path+".", m, s.Properties[k]) // rows for its keys, not for it
				continue
			}
			// A row names the key in full, or after the key before it in the same cell (`, .duration`).
			if !strings.Contains(readme, "`"+path+"`") && !strings.Contains(readme, "`"+path+",") && !strings.Contains(readme, "`."+k+"`") {
				t.Errorf("README.md has no row for %s", path)
			}
		}
	}
	walk("", values, schema)
}

// schemaNode is the part of a JSON schema TestChartREADMEListsEveryValue reads.
type schemaNode struct {
	Properties           map[string]schemaNode `json:"properties"`
	AdditionalProperties json.RawMessage       `json:"additionalProperties"`
}
