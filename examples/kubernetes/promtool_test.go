package kubernetes

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/prometheus/common/model"
	promql "github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/yaml"

	"github.com/nodelocaldns/nodelocaldns/internal/privtest"
)

// ruleTestsFile holds promtool's unit tests of the PrometheusRule; its rule_files names ruleFileName.
const (
	ruleTestsFile = "testdata/prometheusrule-tests.yaml"
	ruleFileName  = "node-local-dns.rules.yaml"
)

// ruleTests is the part of a promtool unit-test file these tests read.
type ruleTests struct {
	RuleFiles []string `json:"rule_files"`
	Tests     []struct {
		InputSeries []struct {
			Series string `json:"series"`
		} `json:"input_series"`
		AlertRuleTests []struct {
			EvalTime  string `json:"eval_time"`
			Alertname string `json:"alertname"`
			ExpAlerts []any  `json:"exp_alerts"`
		} `json:"alert_rule_test"`
	} `json:"tests"`
}

func readRuleTests(t *testing.T) ruleTests {
	t.Helper()
	data, err := os.ReadFile(ruleTestsFile)
	if err != nil {
		t.Fatal(err)
	}
	var rt ruleTests
	if err := yaml.Unmarshal(data, &rt); err != nil {
		t.Fatalf("%s: %v", ruleTestsFile, err)
	}
	if !slices.Equal(rt.RuleFiles, []string{ruleFileName}) {
		t.Fatalf("%s: rule_files %v, want [%s]", ruleTestsFile, rt.RuleFiles, ruleFileName)
	}
	return rt
}

// renderedRules returns the alerts of the chart's PrometheusRule rendered with extra arguments, and its
// groups as a rules file.
func renderedRules(t *testing.T, args ...string) ([]Rule, []byte) {
	t.Helper()
	objs, _ := mustRender(t, append([]string{"-f", filepath.Join(chartDir, "ci", "monitoring-values.yaml")}, args...)...)
	if len(objs.PrometheusRules) != 1 {
		t.Fatalf("%d PrometheusRules", len(objs.PrometheusRules))
	}
	pr := objs.PrometheusRules[0]
	var rules []Rule
	for _, g := range pr.Spec.Groups {
		rules = append(rules, g.Rules...)
	}
	file, err := pr.RulesFile()
	if err != nil {
		t.Fatal(err)
	}
	return rules, file
}

// promtool runs Prometheus's promtool in dir and returns its output; the test fails when promtool fails.
func promtool(t *testing.T, dir string, args ...string) string {
	t.Helper()
	privtest.RequireTools(t, "promtool")
	cmd := exec.Command("promtool", args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// TestPrometheusRuleCheck runs promtool check rules on the rule groups the chart renders, with the guard and
// without it.
func TestPrometheusRuleCheck(t *testing.T) {
	for _, guard := range []string{"true", "false"} {
		t.Run("guard.enabled="+guard, func(t *testing.T) {
			_, file := renderedRules(t, "--set", "guard.enabled="+guard)
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, ruleFileName), file, 0o644); err != nil {
				t.Fatal(err)
			}
			t.Log(promtool(t, dir, "check", "rules", ruleFileName))
		})
	}
}

// TestPrometheusRuleUnitTests runs promtool's unit tests (testdata/prometheusrule-tests.yaml) against the
// rule groups the chart renders.
func TestPrometheusRuleUnitTests(t *testing.T) {
	_, file := renderedRules(t)
	tests, err := os.ReadFile(ruleTestsFile)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for name, data := range map[string][]byte{ruleFileName: file, filepath.Base(ruleTestsFile): tests} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Log(promtool(t, dir, "test", "rules", filepath.Base(ruleTestsFile)))
}

// TestEveryAlertHasUnitTests checks the unit tests cover every alert the chart renders, each with a case
// where it fires and one where it does not, and feed it only series that exist: metrics the code compiled
// into node-cache exports (or the external ones the alerts name), with their names as exported.
func TestEveryAlertHasUnitTests(t *testing.T) {
	rules, _ := renderedRules(t)
	rt := readRuleTests(t)
	exported := exportedMetrics(t)
	firing, quiet, tested := map[string]int{}, map[string]int{}, map[string]bool{}
	for _, tc := range rt.Tests {
		for _, at := range tc.AlertRuleTests {
			tested[at.Alertname] = true
			if len(at.ExpAlerts) > 0 {
				firing[at.Alertname]++
			} else {
				quiet[at.Alertname]++
			}
		}
		for _, in := range tc.InputSeries {
			lbls, err := promql.NewParser(promql.Options{}).ParseMetric(in.Series)
			if err != nil {
				t.Errorf("input series %q: %v", in.Series, err)
				continue
			}
			name := lbls.Get(model.MetricNameLabel)
			if _, ok := externalMetrics[name]; !ok && !exported[name] {
				t.Errorf("input series %q: metric %q is exported by no code compiled into node-cache", in.Series, name)
			}
		}
	}
	var alerts []string
	for _, r := range rules {
		alerts = append(alerts, r.Alert)
		if firing[r.Alert] == 0 {
			t.Errorf("alert %s has no unit test in %s where it fires", r.Alert, ruleTestsFile)
		}
		if quiet[r.Alert] == 0 {
			t.Errorf("alert %s has no unit test in %s where it does not fire", r.Alert, ruleTestsFile)
		}
	}
	for name := range tested {
		if !slices.Contains(alerts, name) {
			t.Errorf("%s tests alert %s, which the chart does not render", ruleTestsFile, name)
		}
	}
}
