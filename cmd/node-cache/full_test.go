//go:build linux

package main

import (
	"bufio"
	"bytes"
	"context"
	"debug/buildinfo"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns"
)

func TestNeedsFull(t *testing.T) {
	lean := buildPair{fullOnly: []string{"trace"}}
	for _, tc := range []struct {
		name     string
		build    buildPair
		corefile string
		want     []string
	}{
		{"no trace", lean, ".:53 {\n    forward . 10.0.0.1\n}\n", nil},
		{"trace in two blocks", lean, "a:53 {\n    trace\n}\nb:53 {\n    trace zipkin localhost:9411\n    cache\n}\n", []string{"trace"}},
		{"full build", buildPair{}, ".:53 {\n    trace\n}\n", nil},
		{"trace as an argument only", lean, ".:53 {\n    forward . trace\n}\n", nil},
		{"does not parse", lean, ".:53 {\n    trace\n", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.build.needsFull([]byte(tc.corefile)); !slices.Equal(got, tc.want) {
				t.Errorf("needsFull = %v, want %v", got, tc.want)
			}
		})
	}
}

// recordingPair is a lean build whose exec and stop are recorded instead of done.
type recordingPair struct {
	execs   atomic.Int32
	stops   atomic.Int32
	missing atomic.Value // []string of the last exec
}

func (r *recordingPair) build() buildPair {
	return buildPair{
		fullOnly: []string{"trace"},
		execFull: func(missing []string) error {
			r.execs.Add(1)
			r.missing.Store(missing)
			return errors.New("exec recorded")
		},
		stop: func() { r.stops.Add(1) },
	}
}

// TestDropInExecsFullForTrace: a base Corefile that uses trace is written, accepted although the lean build
// lacks trace, and handed to the full build before anything else starts.
func TestDropInExecsFullForTrace(t *testing.T) {
	dir := t.TempDir()
	base, out := filepath.Join(dir, "Corefile.base"), filepath.Join(dir, "Corefile")
	writeFile(t, base, []byte(".:53 {\n    trace\n    bind __PILLAR__LOCAL__DNS__\n    forward . __PILLAR__UPSTREAM__SERVERS__\n}\n"))
	d, _, err := parseDropIn(t, "-localip", "169.254.20.10", "-basecorefile", base, "-conf", out)
	if err != nil {
		t.Fatal(err)
	}
	var r recordingPair
	err = runDropIn(t.Context(), d, []string{"bind", "notrack", "forward"}, r.build(), "", time.Hour)
	if err == nil || !strings.Contains(err.Error(), "exec recorded") {
		t.Fatalf("runDropIn = %v, want the exec's error", err)
	}
	if r.execs.Load() != 1 || !slices.Equal(r.missing.Load().([]string), []string{"trace"}) {
		t.Errorf("execs %d for %v, want 1 for [trace]", r.execs.Load(), r.missing.Load())
	}
	if b, err := os.ReadFile(out); err != nil || !strings.Contains(string(b), "trace") {
		t.Errorf("the Corefile the full build will load was not written: %v\n%s", err, b)
	}
}

// TestDropInRestartsForTrace: a ConfigMap change that brings trace in stops the lean build (its container
// restarts on the full one) instead of writing a Corefile the lean build's reload would fail on.
func TestDropInRestartsForTrace(t *testing.T) {
	dir := t.TempDir()
	base, out := filepath.Join(dir, "Corefile.base"), filepath.Join(dir, "Corefile")
	plain := ".:53 {\n    bind __PILLAR__LOCAL__DNS__\n    forward . __PILLAR__UPSTREAM__SERVERS__\n}\n"
	writeFile(t, base, []byte(plain))
	d, _, err := parseDropIn(t, "-localip", "169.254.20.10", "-basecorefile", base, "-conf", out)
	if err != nil {
		t.Fatal(err)
	}
	var r recordingPair
	if err := runDropIn(t.Context(), d, []string{"bind", "notrack", "forward", "log"}, r.build(), "", 10*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	first, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	// A change the lean build can load is written as before.
	writeFile(t, base, []byte(strings.Replace(plain, "bind", "log\n    bind", 1)))
	waitUntil(t, func() bool { b, _ := os.ReadFile(out); return strings.Contains(string(b), "log") })
	loaded, _ := os.ReadFile(out)
	writeFile(t, base, []byte(strings.Replace(plain, "bind", "trace\n    bind", 1)))
	waitUntil(t, func() bool { return r.stops.Load() > 0 })
	if now, _ := os.ReadFile(out); !bytes.Equal(now, loaded) {
		t.Errorf("the Corefile with trace was written for the lean build to reload:\n%s", now)
	}
	if r.execs.Load() != 0 || r.stops.Load() != 1 {
		t.Errorf("execs %d, stops %d; want 0 and 1", r.execs.Load(), r.stops.Load())
	}
	if bytes.Equal(first, loaded) {
		t.Error("the first change was not written")
	}
}

// buildPairFor builds the image's two binaries into dir, as the Dockerfile does: node-cache (lean) and
// node-cache-full.
func buildPairFor(t *testing.T, dir string) (lean, full string) {
	t.Helper()
	lean, full = filepath.Join(dir, "node-cache"), filepath.Join(dir, "node-cache"+fullBuildSuffix)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for _, b := range []struct {
		out  string
		tags []string
	}{{lean, []string{"-tags", "nodecache_lean"}}, {full, nil}} {
		args := slices.Concat([]string{"build"}, b.tags, []string{"-o", b.out, "."})
		if out, err := exec.CommandContext(ctx, "go", args...).CombinedOutput(); err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	return lean, full
}

// dnsPlugins lists the plugins a binary prints with -plugins (CoreDNS prints the DNS server type's, one a line).
func dnsPlugins(t *testing.T, binary string) []string {
	t.Helper()
	out, err := exec.Command(binary, "-plugins").Output()
	if err != nil {
		t.Fatalf("%s -plugins: %v", binary, err)
	}
	var names []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if name := strings.TrimSpace(sc.Text()); name != "" {
			names = append(names, strings.TrimPrefix(name, "dns."))
		}
	}
	slices.Sort(names)
	return names
}

// TestLeanBuildPairIsComplete: the lean build lacks exactly leanLeavesOut, and together the two builds have
// every plugin of this (full) build, which TestUpstreamImagePluginsCompiledIn holds to upstream's image.
func TestLeanBuildPairIsComplete(t *testing.T) {
	lean, full := buildPairFor(t, t.TempDir())
	leanPlugins, fullPlugins := dnsPlugins(t, lean), dnsPlugins(t, full)
	var want []string
	for name := range nodelocaldns.RegisteredPlugins() {
		want = append(want, name)
	}
	slices.Sort(want)
	if !slices.Equal(fullPlugins, want) {
		t.Errorf("node-cache-full has %v, want this build's %v", fullPlugins, want)
	}
	for _, name := range leanLeavesOut {
		if slices.Contains(leanPlugins, name) {
			t.Errorf("the lean build has %s, which it is meant to leave out", name)
		}
	}
	if union := slices.Sorted(slices.Values(slices.Concat(leanPlugins, leanLeavesOut))); !slices.Equal(union, want) {
		t.Errorf("lean build %v plus %v = %v, want the full build's %v", leanPlugins, leanLeavesOut, union, want)
	}
}

// TestImageBuildsUseTheProfile: the image's two builds, made as the Dockerfile makes them, are optimised with
// default.pgo (go version -m shows -pgo=default.pgo).
func TestImageBuildsUseTheProfile(t *testing.T) {
	lean, full := buildPairFor(t, t.TempDir())
	for _, binary := range []string{lean, full} {
		info, err := buildinfo.ReadFile(binary)
		if err != nil {
			t.Fatal(err)
		}
		pgo := ""
		for _, s := range info.Settings {
			if s.Key == "-pgo" {
				pgo = s.Value
			}
		}
		if filepath.Base(pgo) != defaultPGO {
			t.Errorf("%s was built with -pgo=%q, want %s", filepath.Base(binary), pgo, defaultPGO)
		}
	}
}

// TestLeanBuildRunsFullForTrace runs the lean build on a Corefile that traces: the process that answers is the
// full build, under the same process ID.
func TestLeanBuildRunsFullForTrace(t *testing.T) {
	dir := t.TempDir()
	lean, full := buildPairFor(t, dir)
	addr := freeLoopbackAddr(t) // a TCP port that was free; CoreDNS listens on UDP and TCP on it
	host, port, _ := net.SplitHostPort(addr)
	conf := filepath.Join(dir, "Corefile")
	writeFile(t, conf, fmt.Appendf(nil, ".:%s {\n    bind %s\n    trace zipkin 127.0.0.1:9\n    whoami\n}\n", port, host))
	var logs bytes.Buffer
	cmd := exec.Command(lean, "-conf", conf)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	c := &dns.Client{Net: "tcp", Timeout: time.Second}
	m := new(dns.Msg).SetQuestion("example.org.", dns.TypeA)
	var answered bool
	for deadline := time.Now().Add(30 * time.Second); !answered && time.Now().Before(deadline); {
		select {
		case err := <-done:
			done <- err
			t.Fatalf("node-cache exited: %v\n%s", err, logs.String())
		default:
		}
		if r, _, err := c.Exchange(m, addr); err == nil && r.Rcode == dns.RcodeSuccess {
			answered = true
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !answered {
		t.Fatalf("no answer on %s within 30s:\n%s", addr, logs.String())
	}
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	if exe != full {
		t.Errorf("process %d runs %s, want %s", cmd.Process.Pid, exe, full)
	}
	if !strings.Contains(logs.String(), "running "+full+" in its place") {
		t.Errorf("no log line naming the full build:\n%s", logs.String())
	}
}

// TestPlainCorefile: plain mode reads -conf's file, or ./Corefile, and nothing for stdin.
func TestPlainCorefile(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "Corefile.test")
	writeFile(t, conf, []byte(".:53 {\n    trace\n}\n"))
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	path := fs.String("conf", "", "")
	*path = conf
	if got := plainCorefile(fs); !bytes.Contains(got, []byte("trace")) {
		t.Errorf("-conf %s: got %q", conf, got)
	}
	*path = "stdin"
	if got := plainCorefile(fs); got != nil {
		t.Errorf("stdin: got %q, want nil", got)
	}
	*path = filepath.Join(dir, "missing")
	if got := plainCorefile(fs); got != nil {
		t.Errorf("missing file: got %q, want nil", got)
	}
}
