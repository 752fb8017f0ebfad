// Package netnstest runs a test or benchmark inside a network namespace of its own.
//
// A test that changes links, addresses or iptables rules must never touch the root namespace. Entering a
// namespace with setns only moves one OS thread, and the goroutines and child processes a library starts
// would not follow it, so Run re-executes the test binary under `ip netns exec` instead: in that child the
// whole process, every goroutine and every exec'd tool lives in the fresh namespace.
//
//	func TestSomething(t *testing.T) {
//		privtest.RequirePrivileged(t, "ip", "iptables")
//		if !netnstest.Run(t) {
//			return // the parent: the child has run the test and reported
//		}
//		// from here on the process is inside a namespace of its own, with lo up
//	}
//
// The parent creates the namespace (named nlt-<pid>-<n>), brings lo up, runs exactly this test (or
// benchmark, or subtest) in the child, relays the child's output, fails when the child fails, and deletes
// the namespace in Cleanup, also when the test fails or times out.
//
// The child also gets a private xtables lock file (XTABLES_LOCKFILE): iptables-legacy in one namespace has
// no reason to wait for the lock of the host or of other tests, and a test may hold that file itself to
// provoke lock contention.
package netnstest

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// EnvNamespace is set in the child to the name of the namespace it runs in.
const EnvNamespace = "NODELOCALDNS_NETNSTEST_NAMESPACE"

// EnvXtablesLock is the variable iptables reads for the path of its lock file.
const EnvXtablesLock = "XTABLES_LOCKFILE"

// benchmarksRun holds the names of the benchmarks whose child has run.
var benchmarksRun sync.Map

// namespaceSeq numbers the namespaces one test process creates, so parallel tests get distinct names.
var namespaceSeq atomic.Int64

// Inside reports whether this process is a child started by Run.
func Inside() bool { return os.Getenv(EnvNamespace) != "" }

// Namespace returns the name of the namespace this child runs in, or "" in a parent.
func Namespace() string { return os.Getenv(EnvNamespace) }

// Run makes the calling test continue inside a fresh network namespace.
//
// In the parent it runs the test in a child process inside a new namespace and returns false: the caller
// returns at once. In the child it checks that the process really is in the namespace the parent made and
// returns true. tb may be a *testing.T (also a subtest) or a *testing.B; a benchmark's child output is
// written to standard output unchanged so that its result lines stay parseable, and the parent benchmark
// is then skipped, as its own timing would only measure the child.
//
// The caller checks privileges first (privtest.RequirePrivileged with "ip").
func Run(tb testing.TB) bool {
	tb.Helper()
	if name := Namespace(); name != "" {
		if err := checkInside(name); err != nil {
			tb.Fatalf("netnstest: refusing to run: %v", err)
		}
		return true
	}
	runChild(tb)
	return false
}

func checkInside(name string) error {
	var self, want syscall.Stat_t
	if err := syscall.Stat("/proc/self/ns/net", &self); err != nil {
		return fmt.Errorf("stat own network namespace: %w", err)
	}
	if err := syscall.Stat(filepath.Join("/run/netns", name), &want); err != nil {
		return fmt.Errorf("stat namespace %s: %w", name, err)
	}
	if self.Dev != want.Dev || self.Ino != want.Ino {
		return fmt.Errorf("%s=%s but this process is not in that network namespace", EnvNamespace, name)
	}
	return nil
}

func runChild(tb testing.TB) {
	tb.Helper()
	b, isBench := tb.(*testing.B)
	if isBench {
		// The child runs the benchmark -test.count times; the parent may call it again, but must not
		// start another child.
		if _, done := benchmarksRun.LoadOrStore(tb.Name(), true); done {
			b.Skip("netnstest: already ran in a namespace of its own")
		}
	}
	name := fmt.Sprintf("nlt-%d-%d", os.Getpid(), namespaceSeq.Add(1))
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		tb.Fatalf("netnstest: ip netns add %s: %v: %s", name, err, bytesTrim(out))
	}
	tb.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			tb.Errorf("netnstest: ip netns del %s: %v: %s", name, err, bytesTrim(out))
		}
	})
	if out, err := exec.Command("ip", "-n", name, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		tb.Fatalf("netnstest: bring lo up in %s: %v: %s", name, err, bytesTrim(out))
	}

	exe, err := os.Executable()
	if err != nil {
		tb.Fatalf("netnstest: find test binary: %v", err)
	}
	args := append([]string{"netns", "exec", name, exe}, childFlags(tb, isBench)...)

	ctx := context.Background()
	if d, ok := deadline(tb); ok {
		var cancel context.CancelFunc
		// Leave the parent time to report and delete the namespace before its own deadline.
		ctx, cancel = context.WithDeadline(ctx, d.Add(-5*time.Second))
		defer cancel()
	}
	cmd := exec.CommandContext(ctx, "ip", args...)
	cmd.Env = append(os.Environ(),
		EnvNamespace+"="+name,
		EnvXtablesLock+"="+filepath.Join(tb.TempDir(), "xtables.lock"))
	// The child runs in its own process group so that a timeout also stops the tools it started.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second

	pr, pw := io.Pipe()
	cmd.Stdout = pw
	cmd.Stderr = pw
	relayed := make(chan struct{})
	var ran outcome
	go func() {
		defer close(relayed)
		ran = relay(tb, pr, isBench)
	}()
	runErr := cmd.Run()
	pw.Close()
	<-relayed

	if runErr != nil {
		if ctx.Err() != nil {
			tb.Fatalf("netnstest: child in namespace %s stopped at the test deadline: %v", name, runErr)
		}
		tb.Fatalf("netnstest: child in namespace %s failed: %v", name, runErr)
	}
	// A child that exits 0 without running the test (a pattern that selects nothing, a TestMain that returns
	// early) must not pass for it.
	switch ran {
	case notRun:
		tb.Fatalf("netnstest: the child in namespace %s ran no test %s", name, tb.Name())
	case skipped:
		tb.Skipf("netnstest: the child in namespace %s skipped %s", name, tb.Name())
	}
	if isBench {
		b.Skipf("netnstest: ran in namespace %s; the child's results are above", name)
	}
}

// outcome is what the child's output says about the test it was to run.
type outcome int

const (
	notRun outcome = iota
	passed
	skipped
	failed
)

// outcomeOf reads one line of the child's output (-test.v) for the result of the test or benchmark name.
func outcomeOf(line, name string, bench bool) (outcome, bool) {
	line = strings.TrimSpace(line)
	for _, r := range []struct {
		prefix string
		o      outcome
	}{{"--- PASS: ", passed}, {"--- SKIP: ", skipped}, {"--- FAIL: ", failed}} {
		if rest, ok := strings.CutPrefix(line, r.prefix); ok && (rest == name || strings.HasPrefix(rest, name+" (")) {
			return r.o, true
		}
	}
	// A benchmark's result lines name it or one below it, with -GOMAXPROCS when that is not 1.
	if rest, ok := strings.CutPrefix(line, name); bench && ok && rest != "" && strings.ContainsAny(rest[:1], "-/ \t") {
		return passed, true
	}
	return notRun, false
}

// relay passes the child's output on and returns what it says about tb's test.
func relay(tb testing.TB, r io.Reader, raw bool) outcome {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	if raw {
		fmt.Fprintln(os.Stdout)
	}
	ran := notRun
	for sc.Scan() {
		if o, ok := outcomeOf(sc.Text(), tb.Name(), raw); ok && ran != failed {
			ran = o
		}
		if raw {
			fmt.Fprintln(os.Stdout, sc.Text())
			continue
		}
		tb.Log("netns| " + sc.Text())
	}
	// Drain whatever a too-long line left behind, so the child never blocks on a full pipe.
	_, _ = io.Copy(io.Discard, r)
	return ran
}

// childFlags selects exactly tb in the child and passes on the flags that shape its run.
func childFlags(tb testing.TB, isBench bool) []string {
	selector := "test.run"
	if isBench {
		selector = "test.bench"
	}
	pattern := namePattern(tb.Name()) + deeperPattern(lookupFlag(selector), tb.Name())
	flags := []string{"-test.v=true"}
	if isBench {
		flags = append(flags, "-test.run=^$", "-test.bench="+pattern)
		for _, f := range []string{"test.benchtime", "test.benchmem", "test.cpu", "test.count"} {
			flags = appendFlag(flags, f)
		}
	} else {
		flags = append(flags, "-test.run="+pattern)
	}
	for _, f := range []string{"test.short", "test.timeout"} {
		flags = appendFlag(flags, f)
	}
	return flags
}

func appendFlag(flags []string, name string) []string {
	if f := lookupFlag(name); f != "" {
		return append(flags, "-"+name+"="+f)
	}
	return flags
}

// namePattern anchors every element of a test name, so that the child runs this test and no sibling
// whose name merely starts the same way.
func namePattern(name string) string {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	return strings.Join(parts, "/")
}

// deeperPattern returns the elements of the parent's -test.run or -test.bench pattern that select below
// name ("/b" of "A/b" for test A), so that the child runs the same subtests the parent would have.
func deeperPattern(parent, name string) string {
	if parent == "" {
		return ""
	}
	parts := strings.Split(parent, "/")
	depth := strings.Count(name, "/") + 1
	if len(parts) <= depth {
		return ""
	}
	return "/" + strings.Join(parts[depth:], "/")
}

func deadline(tb testing.TB) (time.Time, bool) {
	if t, ok := tb.(interface{ Deadline() (time.Time, bool) }); ok {
		return t.Deadline()
	}
	// Benchmarks have no Deadline method; honour -test.timeout the same way.
	if v := lookupFlag("test.timeout"); v != "" {
		if d, err := time.ParseDuration(v); err == nil && d > 0 {
			return processStart.Add(d), true
		}
	}
	return time.Time{}, false
}

// processStart approximates when -test.timeout started counting.
var processStart = time.Now()

func bytesTrim(b []byte) string { return strings.TrimSpace(string(b)) }

// lookupFlag returns the value of a flag the testing package registered, or "" when it is unset.
func lookupFlag(name string) string {
	f := flag.Lookup(name)
	if f == nil || f.Value.String() == f.DefValue {
		return ""
	}
	return f.Value.String()
}
