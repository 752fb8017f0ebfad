package kubernetes

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	promql "github.com/prometheus/prometheus/promql/parser"
)

// externalMetrics are the series the alerts use that no code of the node-cache build exports, with where
// they come from.
var externalMetrics = map[string]string{
	"up":                              "Prometheus, for every scrape target",
	"kube_pod_container_status_ready": "kube-state-metrics",
}

// wantAlerts are the conditions issue 15 asks the PrometheusRule to cover.
var wantAlerts = []string{
	"NodeLocalDNSFailedOpen", "NodeLocalDNSGuardDown", "NodeLocalDNSSetupErrors", "NodeLocalDNSRulesNotInPlace",
	"NodeLocalDNSHighServfailRatio", "NodeLocalDNSUpstreamUnreachable", "NodeLocalDNSCacheDown", "NodeLocalDNSCacheNotReady",
}

// TestMonitoring renders the chart with the ServiceMonitor, the PrometheusRule and the dashboard on, and
// checks each: the ServiceMonitor scrapes both metrics ports of the Service, every alert and panel
// expression parses as PromQL, and every metric they name is exported by code compiled into node-cache.
func TestMonitoring(t *testing.T) {
	objs, _ := mustRender(t, "-f", filepath.Join(chartDir, "ci", "monitoring-values.yaml"))
	exported := exportedMetrics(t)

	if len(objs.ServiceMonitors) != 1 {
		t.Fatalf("%d ServiceMonitors", len(objs.ServiceMonitors))
	}
	sm := objs.ServiceMonitors[0]
	ms := objs.Service("node-local-dns")
	var scraped []string
	for _, e := range sm.Spec.Endpoints {
		scraped = append(scraped, e.Port)
	}
	var ports []string
	for _, p := range ms.Spec.Ports {
		ports = append(ports, p.Name)
	}
	if !slices.Equal(scraped, []string{"metrics", "guard-metrics"}) || !slices.Equal(ports, scraped) {
		t.Errorf("ServiceMonitor scrapes ports %v of the Service's %v, want the cache's and the guard's", scraped, ports)
	}
	for k, v := range sm.Spec.Selector.MatchLabels {
		if ms.Labels[k] != v {
			t.Errorf("ServiceMonitor selects %s=%s, which the metrics Service lacks", k, v)
		}
	}

	if len(objs.PrometheusRules) != 1 {
		t.Fatalf("%d PrometheusRules", len(objs.PrometheusRules))
	}
	var alerts []string
	for _, g := range objs.PrometheusRules[0].Spec.Groups {
		for _, r := range g.Rules {
			alerts = append(alerts, r.Alert)
			checkExpr(t, "alert "+r.Alert, r.Expr, exported)
			if r.Labels["severity"] == "" || r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("alert %s lacks a severity, summary or description", r.Alert)
			}
		}
	}
	for _, a := range wantAlerts {
		if !slices.Contains(alerts, a) {
			t.Errorf("no alert %s (have %v)", a, alerts)
		}
	}

	cm := objs.ConfigMap("node-local-dns-dashboard")
	if cm == nil || cm.Labels["grafana_dashboard"] != "1" {
		t.Fatalf("dashboard ConfigMap %+v", cm)
	}
	dash, err := ParseDashboard([]byte(cm.Data["node-local-dns.json"]))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, p := range dash.Panels {
		for _, target := range p.Targets {
			n++
			checkExpr(t, "panel "+p.Title, grafanaToPromQL(target.Expr), exported)
		}
	}
	for _, v := range dash.Templating.List {
		if v.Type != "query" {
			continue
		}
		m := labelValues.FindStringSubmatch(v.Definition)
		if m == nil {
			t.Errorf("variable %s: %q is not label_values(SELECTOR, LABEL)", v.Name, v.Definition)
			continue
		}
		checkExpr(t, "variable "+v.Name, grafanaToPromQL(m[1]), exported)
	}
	if n < 15 {
		t.Errorf("the dashboard has %d queries; did its panels lose their targets?", n)
	}
}

var labelValues = regexp.MustCompile(`^label_values\((.+), *[a-z_]+\)$`)

// grafanaToPromQL replaces the dashboard's variables with what Grafana would put there.
func grafanaToPromQL(expr string) string {
	return strings.NewReplacer("$__rate_interval", "5m", "$job", ".*", "$node", ".*").Replace(expr)
}

// checkExpr parses expr with Prometheus's own parser and checks every metric it selects.
func checkExpr(t *testing.T, what, expr string, exported map[string]bool) {
	t.Helper()
	e, err := promql.NewParser(promql.Options{}).ParseExpr(expr)
	if err != nil {
		t.Errorf("%s: %q does not parse: %v", what, expr, err)
		return
	}
	promql.Inspect(e, func(node promql.Node, _ []promql.Node) error {
		vs, ok := node.(*promql.VectorSelector)
		if !ok {
			return nil
		}
		name := vs.Name
		for _, m := range vs.LabelMatchers {
			if m.Name == model.MetricNameLabel && m.Type == labels.MatchEqual {
				name = m.Value
			}
		}
		if _, ok := externalMetrics[name]; !ok && !exported[name] {
			t.Errorf("%s: metric %q is exported by no code compiled into node-cache", what, name)
		}
		return nil
	})
}

// exportedMetrics returns the names of the metrics defined in the packages compiled into node-cache: every
// prometheus.*Opts literal, with its Namespace, Subsystem and Name resolved from string literals, package
// constants and plugin.Namespace, plus the _bucket, _sum and _count series of histograms and summaries.
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}} {{.Dir}}", "../../cmd/node-cache").Output()
	if err != nil {
		t.Fatalf("go list -deps ../../cmd/node-cache: %v", err)
	}
	names := map[string]bool{}
	for line := range strings.SplitSeq(strings.TrimSpace(string(out)), "\n") {
		pkg, dir, _ := strings.Cut(line, " ")
		if !strings.HasPrefix(pkg, "github.com/coredns/coredns/") && !strings.HasPrefix(pkg, "github.com/nodelocaldns/nodelocaldns/") {
			continue
		}
		for name, kind := range packageMetrics(t, dir) {
			names[name] = true
			if kind == "HistogramOpts" || kind == "SummaryOpts" {
				for _, suffix := range []string{"_sum", "_count"} {
					names[name+suffix] = true
				}
			}
			if kind == "HistogramOpts" {
				names[name+"_bucket"] = true
			}
		}
	}
	for _, must := range []string{"coredns_dns_requests_total", "coredns_nodecache_setup_errors_total", "coredns_nodecache_guard_state"} {
		if !names[must] {
			t.Fatalf("the metric scan missed %s: found %d names", must, len(names))
		}
	}
	return names
}

// packageMetrics returns the metrics the non-test Go files of dir define, by the kind of Opts.
func packageMetrics(t *testing.T, dir string) map[string]string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var parsed []*ast.File
	consts := map[string]string{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		file, err := parser.ParseFile(fset, f, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		parsed = append(parsed, file)
		for _, d := range file.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, n := range vs.Names {
					if i < len(vs.Values) {
						if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
							consts[n.Name], _ = strconv.Unquote(lit.Value)
						}
					}
				}
			}
		}
	}
	value := func(e ast.Expr) (string, bool) {
		switch v := e.(type) {
		case *ast.BasicLit:
			s, err := strconv.Unquote(v.Value)
			return s, err == nil
		case *ast.Ident:
			s, ok := consts[v.Name]
			return s, ok
		case *ast.SelectorExpr:
			if x, ok := v.X.(*ast.Ident); ok && x.Name == "plugin" && v.Sel.Name == "Namespace" {
				return "coredns", true
			}
		}
		return "", false
	}
	metrics := map[string]string{}
	for _, file := range parsed {
		ast.Inspect(file, func(n ast.Node) bool {
			lit, ok := n.(*ast.CompositeLit)
			if !ok {
				return true
			}
			sel, ok := lit.Type.(*ast.SelectorExpr)
			if !ok || !strings.HasSuffix(sel.Sel.Name, "Opts") {
				return true
			}
			if x, ok := sel.X.(*ast.Ident); !ok || x.Name != "prometheus" {
				return true
			}
			parts := map[string]string{}
			for _, elt := range lit.Elts {
				kv, ok := elt.(*ast.KeyValueExpr)
				if !ok {
					continue
				}
				key, ok := kv.Key.(*ast.Ident)
				if !ok || (key.Name != "Namespace" && key.Name != "Subsystem" && key.Name != "Name") {
					continue
				}
				v, ok := value(kv.Value)
				if !ok {
					t.Logf("%s: cannot resolve %s of a metric", fset.Position(kv.Pos()), key.Name)
					return true
				}
				parts[key.Name] = v
			}
			if parts["Name"] == "" {
				return true
			}
			var name []string
			for _, p := range []string{parts["Namespace"], parts["Subsystem"], parts["Name"]} {
				if p != "" {
					name = append(name, p)
				}
			}
			metrics[strings.Join(name, "_")] = sel.Sel.Name
			return true
		})
	}
	return metrics
}
