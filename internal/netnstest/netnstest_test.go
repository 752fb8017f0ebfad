package netnstest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/nodelocaldns/nodelocaldns/internal/privtest"
)

func TestNamePattern(t *testing.T) {
	tests := []struct{ name, want string }{
		{"TestA", "^TestA$"},
		{"TestA/sub_case#01", "^TestA$/^sub_case#01$"},
		{"BenchmarkSync/backend=nft/foreign=10000", "^BenchmarkSync$/^backend=nft$/^foreign=10000$"},
		{"TestA/x.y(z)", `^TestA$/^x\.y\(z\)$`},
	}
	for _, tc := range tests {
		if got := namePattern(tc.name); got != tc.want {
			t.Errorf("namePattern(%q) = %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestRunEntersFreshNamespace(t *testing.T) {
	privtest.RequirePrivileged(t, "ip")
	var rootNS syscall.Stat_t
	if !Inside() {
		if err := syscall.Stat("/proc/self/ns/net", &rootNS); err != nil {
			t.Fatal(err)
		}
	}
	if !Run(t) {
		return
	}
	ifaces, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	if len(ifaces) != 1 || ifaces[0].Name != "lo" {
		t.Fatalf("a fresh namespace holds only lo, found %v", ifaces)
	}
	if ifaces[0].Flags&net.FlagUp == 0 {
		t.Error("lo is not up")
	}
	if !strings.HasPrefix(Namespace(), "nlt-") {
		t.Errorf("namespace name %q", Namespace())
	}
	if os.Getenv(EnvXtablesLock) == "" {
		t.Errorf("%s is not set in the child", EnvXtablesLock)
	}
}

func TestRunSubtestsGetTheirOwnNamespace(t *testing.T) {
	privtest.RequirePrivileged(t, "ip")
	for _, sub := range []string{"a", "ab"} {
		t.Run(sub, func(t *testing.T) {
			if !Run(t) {
				return
			}
			// A sibling that ran in the same child (a loose -test.run pattern: "a" also matches "ab") would
			// leave its link behind, or find this one.
			if out, err := exec.Command("ip", "link", "add", "sub-"+sub, "type", "bridge").CombinedOutput(); err != nil {
				t.Fatalf("ip link add: %v: %s", err, out)
			}
			ifaces, err := net.Interfaces()
			if err != nil {
				t.Fatal(err)
			}
			for _, ifc := range ifaces {
				if strings.HasPrefix(ifc.Name, "sub-") && ifc.Name != "sub-"+sub {
					t.Errorf("found %s from another subtest in this namespace", ifc.Name)
				}
			}
		})
	}
}

func TestNamespaceDeletedAfterTest(t *testing.T) {
	privtest.RequirePrivileged(t, "ip")
	t.Run("inner", func(t *testing.T) {
		if !Run(t) {
			return
		}
		t.Log("inside " + Namespace())
	})
	if Inside() {
		return // the child re-enters this function on its way to the subtest
	}
	name := fmt.Sprintf("nlt-%d-%d", os.Getpid(), namespaceSeq.Load())
	if _, err := os.Stat(filepath.Join("/run/netns", name)); !os.IsNotExist(err) {
		t.Errorf("namespace %s still exists after its test ended (stat: %v)", name, err)
	}
}

const (
	envForceFailure = "NETNSTEST_FORCE_FAILURE"
	envRunNothing   = "NETNSTEST_CHILD_RUNS_NOTHING"
)

func TestMain(m *testing.M) {
	if os.Getenv(envRunNothing) != "" && Inside() {
		os.Exit(0) // a child that exits cleanly without running its test
	}
	os.Exit(m.Run())
}

// TestRunsNothingOnRequest is the parent side of TestChildThatRanNothingFailsParent: its child exits at
// once.
func TestRunsNothingOnRequest(t *testing.T) {
	if os.Getenv(envRunNothing) == "" {
		t.Skip("only runs when TestChildThatRanNothingFailsParent starts it")
	}
	if !Run(t) {
		return
	}
	t.Error("the child ran the test after all")
}

func TestChildThatRanNothingFailsParent(t *testing.T) {
	privtest.RequirePrivileged(t, "ip")
	if Inside() {
		t.Fatal("this test starts its own process and must not run inside a namespace")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^TestRunsNothingOnRequest$", "-test.v=true")
	cmd.Env = append(os.Environ(), envRunNothing+"=1")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("the parent passed although its child ran no test:\n%s", out)
	}
	if !strings.Contains(string(out), "ran no test TestRunsNothingOnRequest") {
		t.Errorf("output does not say the child ran no test:\n%s", out)
	}
}

func TestOutcomeOf(t *testing.T) {
	for _, tc := range []struct {
		line, name string
		bench      bool
		want       outcome
		ok         bool
	}{
		{"--- PASS: TestA (0.01s)", "TestA", false, passed, true},
		{"    --- SKIP: TestA/nft (0.00s)", "TestA/nft", false, skipped, true},
		{"--- FAIL: TestA (0.01s)", "TestA", false, failed, true},
		{"--- PASS: TestAB (0.01s)", "TestA", false, notRun, false},
		{"=== RUN   TestA", "TestA", false, notRun, false},
		{"testing: warning: no tests to run", "TestA", false, notRun, false},
		{"BenchmarkSync/backend=nft-2   \t 100\t 12 ns/op", "BenchmarkSync", true, passed, true},
		{"BenchmarkSync 100 12 ns/op", "BenchmarkSync", true, passed, true},
		{"BenchmarkSyncer-2 100 12 ns/op", "BenchmarkSync", true, notRun, false},
		{"--- SKIP: BenchmarkSync", "BenchmarkSync", true, skipped, true},
	} {
		if got, ok := outcomeOf(tc.line, tc.name, tc.bench); got != tc.want || ok != tc.ok {
			t.Errorf("outcomeOf(%q, %q) = %v, %v; want %v, %v", tc.line, tc.name, got, ok, tc.want, tc.ok)
		}
	}
}

// TestFailsOnRequest is the child side of TestChildFailureFailsParent.
func TestFailsOnRequest(t *testing.T) {
	if os.Getenv(envForceFailure) == "" {
		t.Skip("only runs when TestChildFailureFailsParent starts it")
	}
	if !Run(t) {
		return
	}
	t.Error("failing on purpose inside " + Namespace())
}

func TestChildFailureFailsParent(t *testing.T) {
	privtest.RequirePrivileged(t, "ip")
	if Inside() {
		t.Fatal("this test starts its own process and must not run inside a namespace")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^TestFailsOnRequest$", "-test.v=true")
	cmd.Env = append(os.Environ(), envForceFailure+"=1")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("the parent passed although its child failed:\n%s", out)
	}
	for _, want := range []string{"failing on purpose inside nlt-", "child in namespace nlt-", "failed"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestDeeperPattern(t *testing.T) {
	tests := []struct{ parent, name, want string }{
		{"", "TestA", ""},
		{"TestA", "TestA", ""},
		{"TestA/sub", "TestA", "/sub"},
		{"BenchmarkSync/backend=nft/table=raw", "BenchmarkSync", "/backend=nft/table=raw"},
		{"BenchmarkSync/backend=nft/table=raw", "BenchmarkSync/backend=nft", "/table=raw"},
		{"TestA/sub", "TestA/sub", ""},
	}
	for _, tc := range tests {
		if got := deeperPattern(tc.parent, tc.name); got != tc.want {
			t.Errorf("deeperPattern(%q, %q) = %q, want %q", tc.parent, tc.name, got, tc.want)
		}
	}
}
