//go:build linux

package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/common/model"
	promql "github.com/prometheus/prometheus/promql/parser"

	manifests "github.com/nodelocaldns/nodelocaldns/examples/kubernetes"
	"github.com/nodelocaldns/nodelocaldns/internal/helmtest"
	"github.com/nodelocaldns/nodelocaldns/internal/privtest"
	"github.com/nodelocaldns/nodelocaldns/test/simnode"
)

// promListen is the Prometheus server's address, inside the simulated node's namespace.
const promListen = "127.0.0.1:9090"

// goneEndpoint is an address of the cluster-DNS Pods' subnet that no Pod has.
const goneEndpoint = "10.244.1.99"

// timeScale shrinks the chart's alert timing for the test: every rule's `for` and every range of its
// expression is divided by it (5m becomes 10s), so that an alert fires and clears in seconds with a 1 s
// scrape and evaluation interval. Nothing else of an expression changes; one without a range is left
// byte-identical.
const timeScale = 30

// promAlerts are the chart's alerts the test drives through the real Prometheus.
const (
	alertFailedOpen  = "NodeLocalDNSFailedOpen"
	alertCacheDown   = "NodeLocalDNSCacheDown"
	alertUnreachable = "NodeLocalDNSUpstreamUnreachable"
)

// TestPrometheusAlerts runs a real Prometheus (Debian's prometheus) in the simulated node, scraping the
// cache (the shipped configuration) and the guard as the chart's ServiceMonitor labels them, with the
// chart's PrometheusRule loaded (its timing shrunk by timeScale). On a healthy node no alert is active.
// When the cache is SIGKILLed the guard fails the node open and NodeLocalDNSFailedOpen fires (with
// NodeLocalDNSCacheDown); both clear once the restarted cache has taken the node back. While
// kube-dns-upstream is down (the cluster DNS killed, then its endpoint gone), Pods asking new cluster names
// make the cache's health checks fail and NodeLocalDNSUpstreamUnreachable fires; it clears after recovery.
// At the end every panel of the dashboard must show data for the shipped configuration.
func TestPrometheusAlerts(t *testing.T) {
	privtest.RequirePrivileged(t, "prometheus")
	bin := binary(t)
	n := simnode.New(t)
	r := &rig{t: t, n: n, bin: bin, dir: t.TempDir(), backend: "nft", listen: []string{simnode.LinkLocalIP, simnode.KubeDNSClusterIP}}
	r.clusterDNS = n.StartClusterDNS(bin)
	n.StartExternalResolver(bin)
	r.writeShippedCorefile()
	r.startShippedCache()
	r.startGuard()
	p := r.startPrometheus(scaledRules(t))

	// A healthy node: both targets up, some lookups through the cache, several rounds of rule evaluations
	// on those samples, and no alert active.
	p.waitQuery(t, `count(up{job="node-local-dns"} == 1) == 2`, "both targets scraped")
	for _, name := range []string{"kubernetes.default.svc.cluster.local", "example.org"} {
		if err := n.Do(n.PodNS, func() error { _, _, err := lookup(kubeDNS, name, dns.TypeA, clientTimeout); return err }); err != nil {
			t.Fatalf("the cache does not answer %s: %v", name, err)
		}
	}
	p.waitEvaluations(t, 5)
	if active := p.alerts(t); len(active) > 0 {
		t.Fatalf("alerts active on a healthy node: %v", active)
	}

	// The cache dies: the guard fails the node open.
	kill(t, r.cache, syscall.SIGKILL)
	r.waitLog(r.guard, "failed open in", 1, eventually)
	took := p.waitAlert(t, alertFailedOpen, "firing", eventually)
	t.Logf("%s firing %v after the guard failed open; active: %v", alertFailedOpen, took.Round(time.Millisecond), p.alerts(t))
	p.waitAlert(t, alertCacheDown, "firing", eventually)
	r.startShippedCache()
	took = p.waitAlert(t, alertFailedOpen, "", eventually)
	t.Logf("%s gone %v after the cache's restart", alertFailedOpen, took.Round(time.Millisecond))
	p.waitAlert(t, alertCacheDown, "", eventually)
	if got := r.mustScrape(guardMetrics, "coredns_nodecache_guard_state", ""); got != 0 {
		t.Fatalf("guard state %v with the alert gone", got)
	}

	outages := []struct {
		name        string
		down, again func()
	}{
		{"the cluster DNS killed", func() { kill(t, r.clusterDNS, syscall.SIGKILL) }, func() { r.clusterDNS = n.StartClusterDNS(bin) }},
		// kube-dns-upstream's endpoint moves to goneEndpoint.
		{"kube-dns-upstream's endpoint gone", func() {
			n.SetUpstreamEndpoint(goneEndpoint)
			// The cache's connection to the old endpoint dies with it (its NAT state goes, so its next
			// segments go where the rules now say).
			if err := n.DeleteConntrack(simnode.UpstreamClusterIP); err != nil {
				t.Fatal(err)
			}
		}, func() { n.SetUpstreamEndpoint(simnode.ClusterDNSPodIP) }},
	}
	for _, o := range outages {
		stop := r.askNewNames(t)
		o.down()
		took := p.waitAlert(t, alertUnreachable, "firing", eventually)
		active := p.alerts(t)
		t.Logf("%s: %s firing %v into the outage; active: %v", o.name, alertUnreachable, took.Round(time.Millisecond), active)
		for _, a := range active {
			if a.Labels["alertname"] == alertFailedOpen || a.Labels["alertname"] == alertCacheDown {
				t.Errorf("%s: %s is active while only the upstream is down", o.name, a.Labels["alertname"])
			}
			if a.Labels["alertname"] == alertUnreachable && a.Labels["to"] != net.JoinHostPort(simnode.UpstreamClusterIP, "53") {
				t.Errorf("%s: %s names upstream %q, want kube-dns-upstream's %s:53", o.name, alertUnreachable, a.Labels["to"], simnode.UpstreamClusterIP)
			}
		}
		o.again()
		took = p.waitAlert(t, alertUnreachable, "", eventually)
		t.Logf("%s: %s gone %v after recovery", o.name, alertUnreachable, took.Round(time.Millisecond))
		stop()
	}

	p.checkDashboard(t)
}

// scaledRules is the chart's PrometheusRule (ci/monitoring-values.yaml) as a rules file, its timing divided
// by timeScale.
func scaledRules(t *testing.T) []byte {
	t.Helper()
	out, err := helmtest.Template(t, "-f", filepath.Join(helmtest.ChartDir(t), "ci", "monitoring-values.yaml"), "--show-only", "templates/prometheusrule.yaml")
	if err != nil {
		t.Fatal(err)
	}
	objs, err := manifests.Decode(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(objs.PrometheusRules) != 1 {
		t.Fatalf("%d PrometheusRules", len(objs.PrometheusRules))
	}
	pr := objs.PrometheusRules[0]
	for _, g := range pr.Spec.Groups {
		for i := range g.Rules {
			rule := &g.Rules[i]
			if rule.For != "" {
				d, err := model.ParseDuration(rule.For)
				if err != nil {
					t.Fatalf("alert %s: for %q: %v", rule.Alert, rule.For, err)
				}
				rule.For = (time.Duration(d) / timeScale).String()
			}
			expr, err := promql.NewParser(promql.Options{}).ParseExpr(rule.Expr)
			if err != nil {
				t.Fatalf("alert %s: %v", rule.Alert, err)
			}
			scaled := false
			promql.Inspect(expr, func(node promql.Node, _ []promql.Node) error {
				switch m := node.(type) {
				case *promql.MatrixSelector:
					m.Range /= timeScale
					scaled = true
				case *promql.SubqueryExpr:
					m.Range /= timeScale
					m.Step /= timeScale
					scaled = true
				}
				return nil
			})
			if scaled {
				rule.Expr = expr.String()
			}
			t.Logf("alert %s as loaded: for %q, expr %s", rule.Alert, rule.For, rule.Expr)
		}
	}
	file, err := pr.RulesFile()
	if err != nil {
		t.Fatal(err)
	}
	return file
}

// prometheus is a Prometheus server in the simulated node, and a client of its HTTP API.
type prometheus struct {
	proc   *simnode.Process
	client *http.Client
}

// startPrometheus runs Prometheus in the node namespace with rules loaded, scraping the cache and the guard
// every second with the labels prometheus-operator gives the chart's ServiceMonitor targets (job: the
// metrics Service, endpoint: the port's name), its TSDB in a temporary directory, and waits until it is
// ready.
func (r *rig) startPrometheus(rules []byte) *prometheus {
	r.t.Helper()
	dir := r.t.TempDir()
	target := func(addr, endpoint, container string) string {
		return fmt.Sprintf("  - targets: [%q]\n    labels: {endpoint: %s, namespace: kube-system, service: node-local-dns, pod: node-local-dns-sim, container: %s}\n",
			addr, endpoint, container)
	}
	config := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files: [%q]
scrape_configs:
- job_name: node-local-dns
  static_configs:
%s%s`, filepath.Join(dir, "rules.yaml"), target(cacheMetrics, "metrics", "node-cache"), target(guardMetrics, "guard-metrics", "guard"))
	for name, content := range map[string][]byte{"rules.yaml": rules, "prometheus.yml": []byte(config)} {
		if err := os.WriteFile(filepath.Join(dir, name), content, 0o644); err != nil {
			r.t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "data"), 0o755); err != nil {
		r.t.Fatal(err)
	}
	proc := r.n.Start(r.n.NodeNS, "prometheus",
		"--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+promListen)
	p := &prometheus{proc: proc, client: &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{
			// Prometheus listens inside the node namespace: dial from there.
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				var c net.Conn
				err := r.n.Do(r.n.NodeNS, func() (err error) {
					c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
					return err
				})
				return c, err
			},
			DisableKeepAlives: true,
		},
	}}
	deadline := time.Now().Add(eventually)
	for {
		resp, err := p.client.Get("http://" + promListen + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
		}
		if proc.Exited() || time.Now().After(deadline) {
			r.t.Fatalf("Prometheus is not ready (%v):\n%s", err, proc.Output())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// get calls the API at path and decodes its data into out.
func (p *prometheus) get(path string, query url.Values, out any) error {
	resp, err := p.client.Get("http://" + promListen + path + "?" + query.Encode())
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var body struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return fmt.Errorf("%s: %s: %w", path, resp.Status, err)
	}
	if body.Status != "success" {
		return fmt.Errorf("%s %s: %s: %s", path, query.Encode(), body.Status, body.Error)
	}
	return json.Unmarshal(body.Data, out)
}

// alert is an active alert as /api/v1/alerts gives it.
type alert struct {
	Labels map[string]string `json:"labels"`
	State  string            `json:"state"`
}

func (a alert) String() string { return a.Labels["alertname"] + "(" + a.State + ")" }

// alerts returns the active (pending or firing) alerts.
func (p *prometheus) alerts(t testing.TB) []alert {
	t.Helper()
	var data struct {
		Alerts []alert `json:"alerts"`
	}
	if err := p.get("/api/v1/alerts", nil, &data); err != nil {
		t.Fatal(err)
	}
	return data.Alerts
}

// waitAlert waits until alert name is in state ("firing", or "" for neither pending nor firing) and
// returns how long that took.
func (p *prometheus) waitAlert(t testing.TB, name, state string, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		active := p.alerts(t)
		i := slices.IndexFunc(active, func(a alert) bool { return a.Labels["alertname"] == name })
		if (state == "" && i < 0) || (i >= 0 && active[i].State == state) {
			return time.Since(start)
		}
		if time.Since(start) > timeout {
			t.Fatalf("%s not %q within %v; active: %v\nPrometheus:\n%s", name, state, timeout, active, p.proc.Output())
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// promSample is one series of an instant query's result.
type promSample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

// value is the sample's value; NaN when it is not a number.
func (s promSample) value() float64 {
	str, _ := s.Value[1].(string)
	v, err := strconv.ParseFloat(str, 64)
	if err != nil {
		return math.NaN()
	}
	return v
}

// query runs an instant query.
func (p *prometheus) query(expr string) ([]promSample, error) {
	var data struct {
		ResultType string       `json:"resultType"`
		Result     []promSample `json:"result"`
	}
	if err := p.get("/api/v1/query", url.Values{"query": {expr}}, &data); err != nil {
		return nil, err
	}
	if data.ResultType != "vector" {
		return nil, fmt.Errorf("%s: result type %s, want vector", expr, data.ResultType)
	}
	return data.Result, nil
}

// waitQuery waits until expr returns a series.
func (p *prometheus) waitQuery(t testing.TB, expr, what string) {
	t.Helper()
	deadline := time.Now().Add(eventually)
	for {
		res, err := p.query(expr)
		if err != nil {
			t.Fatal(err)
		}
		if len(res) > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s (%s)\nPrometheus:\n%s", eventually, what, expr, p.proc.Output())
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// waitEvaluations waits until the rule group has been evaluated n more times.
func (p *prometheus) waitEvaluations(t testing.TB, n int) {
	t.Helper()
	last := func() time.Time {
		var data struct {
			Groups []struct {
				LastEvaluation time.Time `json:"lastEvaluation"`
			} `json:"groups"`
		}
		if err := p.get("/api/v1/rules", nil, &data); err != nil {
			t.Fatal(err)
		}
		if len(data.Groups) != 1 {
			t.Fatalf("Prometheus has %d rule groups, want the chart's one", len(data.Groups))
		}
		return data.Groups[0].LastEvaluation
	}
	deadline := time.Now().Add(eventually)
	prev := last()
	for seen := 0; seen < n; {
		if now := last(); now.After(prev) {
			prev = now
			seen++
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d rule evaluations not within %v", n, eventually)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// askNewNames has the Pod ask the cache for a cluster name never asked before every 250 ms (each lookup
// waits for its answer, at most a second), until the returned stop is called or 2000 were asked.
func (r *rig) askNewNames(t *testing.T) (stop func()) {
	done := make(chan struct{})
	finished := make(chan error, 1)
	go func() {
		finished <- r.n.Do(r.n.PodNS, func() error {
			for i := range 2000 {
				select {
				case <-done:
					return nil
				case <-time.After(250 * time.Millisecond):
				}
				_, _, _ = lookup(kubeDNS, fmt.Sprintf("new-%d-%d.default.svc.cluster.local", time.Now().UnixNano(), i), dns.TypeA, time.Second)
			}
			return nil
		})
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			close(done)
			if err := <-finished; err != nil {
				t.Error(err)
			}
		})
	}
}

// checkDashboard runs every query of the chart's dashboard against the live scrape, as Grafana would with
// the job and node variables set to the simulated node's and $__rate_interval to what Grafana makes of the
// ServiceMonitor's 30 s interval (4 of them), and fails for each panel none of whose queries returns a
// number within dashboardWait (the rule sync's histogram gets a sample a minute). A query that filters
// (`... > 0`, the setup errors shown only once they happen) counts by what it filters.
func (p *prometheus) checkDashboard(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(helmtest.ChartDir(t), "files", "dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	dash, err := manifests.ParseDashboard(data)
	if err != nil {
		t.Fatal(err)
	}
	vars := strings.NewReplacer("$__rate_interval", "2m", "$job", "node-local-dns", "$node", "127.0.0.1")
	// The variables' own queries: label_values(SELECTOR, LABEL) must find the job and the node.
	for _, v := range dash.Templating.List {
		sel, label, ok := strings.Cut(strings.TrimSuffix(strings.TrimPrefix(v.Definition, "label_values("), ")"), ", ")
		if !ok {
			continue
		}
		res, err := p.query(fmt.Sprintf("group by (%s) (%s)", label, vars.Replace(sel)))
		if err != nil {
			t.Fatal(err)
		}
		var values []string
		for _, s := range res {
			values = append(values, s.Metric[label])
		}
		t.Logf("variable %s: %v", v.Name, values)
		if len(values) == 0 {
			t.Errorf("variable %s (%s) has no values", v.Name, v.Definition)
		}
	}
	deadline := time.Now().Add(dashboardWait)
	for _, panel := range dash.Panels {
		if len(panel.Targets) == 0 {
			continue
		}
		for {
			var shown []string
			numbers := 0
			for _, target := range panel.Targets {
				n, what, err := p.numbers(vars.Replace(target.Expr))
				if err != nil {
					t.Fatalf("panel %q: %v", panel.Title, err)
				}
				numbers += n
				shown = append(shown, what)
			}
			if numbers > 0 {
				t.Logf("panel %q: %s", panel.Title, strings.Join(shown, "; "))
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("panel %q shows no data for the shipped configuration (%s)", panel.Title, strings.Join(shown, "; "))
				break
			}
			time.Sleep(time.Second)
		}
	}
}

// dashboardWait bounds the wait for a dashboard panel's data: two rule syncs (notrack's default interval is
// a minute) and a margin.
const dashboardWait = 3 * time.Minute

// numbers runs expr and returns how many of its series have a number (not NaN) and a description. When expr
// returns nothing and is a filter (a comparison with a number, without bool), it counts the series of what
// is filtered.
func (p *prometheus) numbers(expr string) (int, string, error) {
	count := func(expr string) (int, int, error) {
		res, err := p.query(expr)
		if err != nil {
			return 0, 0, err
		}
		n := 0
		for _, s := range res {
			if !math.IsNaN(s.value()) {
				n++
			}
		}
		return len(res), n, nil
	}
	series, n, err := count(expr)
	if err != nil || series > 0 {
		return n, fmt.Sprintf("%d series, %d numbers", series, n), err
	}
	parsed, err := promql.NewParser(promql.Options{}).ParseExpr(expr)
	if err != nil {
		return 0, "", err
	}
	bin, ok := parsed.(*promql.BinaryExpr)
	if !ok || !bin.Op.IsComparisonOperator() || bin.ReturnBool {
		return 0, "0 series", nil
	}
	if _, number := bin.RHS.(*promql.NumberLiteral); !number {
		return 0, "0 series", nil
	}
	series, n, err = count(bin.LHS.String())
	return n, fmt.Sprintf("0 series, filtered from %d series, %d numbers", series, n), err
}
