// Package helmtest runs the pinned helm that scripts/install-test-deps.sh installs into bin/tools, for the
// tests of the chart in charts/node-local-dns (examples/kubernetes checks what it renders, test/kubeapi
// creates that on a real API server).
//
// Without that helm a test skips; under `make test` and CI (NODELOCALDNS_REQUIRE_PRIVILEGED, see privtest)
// it fails instead.
package helmtest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodelocaldns/nodelocaldns/internal/privtest"
)

const (
	// Release and Namespace are what the tests render the chart as: those of the shipped manifests.
	Release   = "node-local-dns"
	Namespace = "kube-system"

	module   = "github.com/nodelocaldns/nodelocaldns"
	binPath  = "bin/tools/helm"
	chartRel = "charts/node-local-dns"
)

// Run runs helm with args in the test's working directory and returns its standard output; an error
// carries helm's standard error.
func Run(t testing.TB, args ...string) ([]byte, error) {
	t.Helper()
	bin := filepath.Join(repoRoot(t), binPath)
	if _, err := os.Stat(bin); err != nil {
		msg := "needs helm at " + binPath + " (scripts/install-test-deps.sh, which make test runs, installs it)"
		if privtest.Required() {
			t.Fatalf("%s; %s is set, so this is a failure, not a skip", msg, privtest.RequireEnv)
		}
		t.Skipf("%s; set %s=1 to make this a failure", msg, privtest.RequireEnv)
	}
	var stderr bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stderr = &stderr
	// helm keeps its caches and repositories under HOME; a test's own keeps the runs apart.
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home, "HELM_CONFIG_HOME="+home, "HELM_DATA_HOME="+home)
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("helm %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	return out, nil
}

// Template is `helm template` of the chart as Release in Namespace, with extra arguments (-f, --set).
func Template(t testing.TB, args ...string) ([]byte, error) {
	t.Helper()
	return Run(t, append([]string{"template", Release, ChartDir(t), "--namespace", Namespace}, args...)...)
}

// ChartDir is the chart's directory, an absolute path.
func ChartDir(t testing.TB) string {
	t.Helper()
	return filepath.Join(repoRoot(t), chartRel)
}

// CIValues are the chart's ci/*-values.yaml files (the values chart-testing installs it with), sorted; the
// test fails if there are none.
func CIValues(t testing.TB) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(ChartDir(t), "ci", "*-values.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no values files in %s/ci (%v)", chartRel, err)
	}
	return files
}

// repoRoot is the directory of this module's go.mod, found upwards from the working directory (a test runs
// in its package's directory).
func repoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		mod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		first, _, _ := strings.Cut(string(mod), "\n")
		if err == nil && strings.TrimSpace(first) == "module "+module {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatalf("no go.mod of %s above the working directory", module)
		}
		dir = parent
	}
}
