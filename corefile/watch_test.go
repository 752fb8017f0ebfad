package corefile

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/configmapvolume"
)

type dropInFixture struct {
	d        *DropIn
	kdDir    string
	reloads  atomic.Int32
	rejected atomic.Int32
}

func newDropInFixture(t *testing.T) *dropInFixture {
	t.Helper()
	dir := t.TempDir()
	fx := &dropInFixture{kdDir: filepath.Join(dir, "kube-dns")}
	if err := os.Mkdir(fx.kdDir, 0o755); err != nil {
		t.Fatal(err)
	}
	base := filepath.Join(dir, "Corefile.base")
	writeFile(t, base, string(upstreamManifestSed(readTestdata(t, "upstream-template.Corefile"),
		"169.254.20.10", "cluster.local", "10.96.0.10")))
	fx.d = &DropIn{
		Base:       base,
		KubeDNSDir: fx.kdDir,
		Output:     filepath.Join(dir, "Corefile"),
		Expansion:  upstreamFlags(),
		Reload:     func() error { fx.reloads.Add(1); return nil },
		Rejected:   func(error) { fx.rejected.Add(1) },
	}
	return fx
}

func (fx *dropInFixture) output(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(fx.d.Output)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// configMapErrors is how many inputs the fixture's DropIn kept out so far.
func (fx *dropInFixture) configMapErrors() int32 { return fx.rejected.Load() }

func TestDropInSync(t *testing.T) {
	fx := newDropInFixture(t)
	if err := fx.d.Sync(); err != nil {
		t.Fatal(err)
	}
	first := fx.output(t)
	if first != string(readTestdata(t, "upstream-template.golden")) {
		t.Errorf("first Corefile:\n%s", first)
	}
	if fx.reloads.Load() != 0 {
		t.Error("the first Corefile triggered a reload; CoreDNS has not started on it yet")
	}

	// Nothing changed: nothing written, no reload.
	st, _ := os.Stat(fx.d.Output)
	if err := fx.d.Sync(); err != nil {
		t.Fatal(err)
	}
	if st2, _ := os.Stat(fx.d.Output); !os.SameFile(st, st2) || fx.reloads.Load() != 0 {
		t.Error("an unchanged input rewrote the Corefile or reloaded")
	}

	// A good change: a stub domain.
	writeFile(t, filepath.Join(fx.kdDir, StubDomainsKey), `{"acme.local": ["1.2.3.4"]}`)
	if err := fx.d.Sync(); err != nil {
		t.Fatal(err)
	}
	good := fx.output(t)
	if !strings.Contains(good, "acme.local:53 {") || fx.reloads.Load() != 1 {
		t.Fatalf("stub domain not applied (reloads %d):\n%s", fx.reloads.Load(), good)
	}

	// A bad change: kept out, logged, counted.
	before := fx.configMapErrors()
	writeFile(t, filepath.Join(fx.kdDir, UpstreamNameserversKey), `["1.1.1.1", "1.0.0.1", "8.8.8.8", "8.8.4.4"]`)
	err := fx.d.Sync()
	if err == nil || !strings.Contains(err.Error(), "at most 3") || !strings.Contains(err.Error(), "kept out") {
		t.Errorf("got %v", err)
	}
	if fx.output(t) != good || fx.reloads.Load() != 1 {
		t.Error("a bad ConfigMap changed the Corefile")
	}
	if got := fx.configMapErrors() - before; got != 1 {
		t.Errorf("configmap errors went up by %v, want 1", got)
	}
	// The same bad input again is not counted twice.
	if err := fx.d.Sync(); err != nil {
		t.Errorf("unchanged bad input: %v", err)
	}
	if got := fx.configMapErrors() - before; got != 1 {
		t.Errorf("configmap errors went up by %v, want 1", got)
	}

	// A base Corefile that cannot expand is kept out as well.
	writeFile(t, filepath.Join(fx.kdDir, UpstreamNameserversKey), `["8.8.8.8"]`)
	writeFile(t, fx.d.Base, ".:53 {\n  forward . __PILLAR__CLUSTER__DNS__ {\n    policy random\n  }\n}\n")
	if err := fx.d.Sync(); err == nil || !strings.Contains(err.Error(), "policy") {
		t.Errorf("got %v", err)
	}
	if fx.output(t) != good {
		t.Error("a bad base Corefile changed the Corefile")
	}
	if got := fx.configMapErrors() - before; got != 2 {
		t.Errorf("configmap errors went up by %v, want 2", got)
	}
}

func TestDropInStartsWithoutBadConfigMap(t *testing.T) {
	fx := newDropInFixture(t)
	writeFile(t, filepath.Join(fx.kdDir, StubDomainsKey), `{"acme.local": ["ns.acme.local"]}`)
	before := fx.configMapErrors()
	err := fx.d.Sync()
	if err == nil || !strings.Contains(err.Error(), "starting without the kube-dns ConfigMap") {
		t.Errorf("got %v", err)
	}
	if fx.output(t) != string(readTestdata(t, "upstream-template.golden")) {
		t.Errorf("want the Corefile without the ConfigMap, got:\n%s", fx.output(t))
	}
	if fx.configMapErrors()-before != 1 {
		t.Error("not counted")
	}
	// Fixed: applied.
	writeFile(t, filepath.Join(fx.kdDir, StubDomainsKey), `{"acme.local": ["10.0.0.53"]}`)
	if err := fx.d.Sync(); err != nil || !strings.Contains(fx.output(t), "forward . 10.0.0.53") {
		t.Errorf("fix not applied: %v\n%s", err, fx.output(t))
	}
}

func TestDropInBaseRemoved(t *testing.T) {
	fx := newDropInFixture(t)
	if err := fx.d.Sync(); err != nil {
		t.Fatal(err)
	}
	good := fx.output(t)
	if err := os.Remove(fx.d.Base); err != nil {
		t.Fatal(err)
	}
	before := fx.configMapErrors()
	for range 3 {
		if err := fx.d.Sync(); err != nil && !strings.Contains(err.Error(), "reading the base Corefile") {
			t.Fatal(err)
		}
	}
	if fx.configMapErrors()-before != 1 || fx.output(t) != good {
		t.Errorf("a removed base: counted %v times, Corefile kept %v", fx.configMapErrors()-before, fx.output(t) == good)
	}
}

func TestDropInBaseMissing(t *testing.T) {
	fx := newDropInFixture(t)
	fx.d.Base = filepath.Join(t.TempDir(), "missing")
	if err := fx.d.Sync(); err == nil {
		t.Fatal("no error for a missing base Corefile")
	}
	if _, err := os.Stat(fx.d.Output); !os.IsNotExist(err) {
		t.Error("a Corefile was written without a base")
	}
}

func TestDropInUnknownDirective(t *testing.T) {
	fx := newDropInFixture(t)
	fx.d.Directives = []string{"errors", "cache", "reload", "loop", "bind", "forward", "prometheus", "health", "upstreamsvc"}
	err := fx.d.Sync()
	if err == nil || !strings.Contains(err.Error(), `directive "notrack" is not compiled into this CoreDNS`) {
		t.Fatalf("got %v", err)
	}
	fx.d.Directives = append(fx.d.Directives, "notrack")
	if err := fx.d.Sync(); err != nil {
		t.Fatal(err)
	}
}

// writeConfigMap updates a ConfigMap volume the way kubelet's atomic writer does (package configmapvolume):
// a reader sees all the old files or all the new ones, never one half-written.
func writeConfigMap(t *testing.T, dir string, data map[string]string) {
	t.Helper()
	v, err := configmapvolume.New(dir)
	if err == nil {
		err = v.Project(data)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// configMapVolumes moves the fixture's inputs into ConfigMap volumes written by writeConfigMap, and returns
// functions that change one key of each.
func (fx *dropInFixture) configMapVolumes(t *testing.T) (setBase func(string), setKubeDNS func(key, value string)) {
	t.Helper()
	base, err := os.ReadFile(fx.d.Base)
	if err != nil {
		t.Fatal(err)
	}
	baseDir := filepath.Join(t.TempDir(), "node-local-dns")
	if err := os.Mkdir(baseDir, 0o755); err != nil {
		t.Fatal(err)
	}
	fx.d.Base = filepath.Join(baseDir, "Corefile.base")
	writeConfigMap(t, baseDir, map[string]string{"Corefile.base": string(base)})
	kubeDNS := map[string]string{}
	writeConfigMap(t, fx.kdDir, kubeDNS)
	return func(corefile string) {
			writeConfigMap(t, baseDir, map[string]string{"Corefile.base": corefile})
		}, func(key, value string) {
			kubeDNS[key] = value
			writeConfigMap(t, fx.kdDir, kubeDNS)
		}
}

// watch runs the fixture's Watch until the test ends.
func (fx *dropInFixture) watch(t *testing.T) { fx.watchEvery(t, 10*time.Millisecond) }

// watchEvery runs the fixture's Watch with period until the test ends.
func (fx *dropInFixture) watchEvery(t *testing.T, period time.Duration) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { fx.d.Watch(ctx, period); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// TestDropInWatchHearsChanges: the watch acts on a change when the directory tells of it, not at the next
// period (an hour here, which the test would not wait for).
func TestDropInWatchHearsChanges(t *testing.T) {
	fx := newDropInFixture(t)
	setBase, setKubeDNS := fx.configMapVolumes(t)
	if err := fx.d.Sync(); err != nil {
		t.Fatal(err)
	}
	fx.watchEvery(t, time.Hour)
	setKubeDNS(UpstreamNameserversKey, `["8.8.8.8"]`)
	waitFor(t, func() bool { return fx.reloads.Load() == 1 })
	base, _ := os.ReadFile(fx.d.Base)
	setBase(string(bytes.ReplaceAll(base, []byte("cache 30"), []byte("cache 15"))))
	waitFor(t, func() bool { return fx.reloads.Load() == 2 })
	if out := fx.output(t); !strings.Contains(out, "forward . 8.8.8.8\n") || !strings.Contains(out, "cache 15") {
		t.Errorf("changes not applied:\n%s", out)
	}
}

func TestDropInWatch(t *testing.T) {
	fx := newDropInFixture(t)
	setBase, setKubeDNS := fx.configMapVolumes(t)
	if err := fx.d.Sync(); err != nil {
		t.Fatal(err)
	}
	fx.watch(t)

	setKubeDNS(UpstreamNameserversKey, `["8.8.8.8"]`)
	waitFor(t, func() bool { return fx.reloads.Load() == 1 })
	if !strings.Contains(fx.output(t), "forward . 8.8.8.8\n") {
		t.Errorf("upstream not applied:\n%s", fx.output(t))
	}

	before := fx.configMapErrors()
	good := fx.output(t)
	setKubeDNS(UpstreamNameserversKey, `["8.8.8.8:53:53"]`)
	waitFor(t, func() bool { return fx.configMapErrors() > before })
	if fx.output(t) != good || fx.reloads.Load() != 1 {
		t.Error("a bad change reached the Corefile")
	}

	// The base Corefile (the node-local-dns ConfigMap) is watched too.
	base, _ := os.ReadFile(fx.d.Base)
	setKubeDNS(UpstreamNameserversKey, `["8.8.8.8"]`)
	setBase(string(bytes.ReplaceAll(base, []byte("cache 30"), []byte("cache 15"))))
	// The kube-dns change alone gives the Corefile already written, so only the base change reloads.
	waitFor(t, func() bool { return fx.reloads.Load() == 2 })
	if !strings.Contains(fx.output(t), "cache 15") {
		t.Errorf("base change not applied:\n%s", fx.output(t))
	}
	if fx.configMapErrors() != before+1 {
		t.Errorf("%d inputs kept out, want the one bad change only", fx.configMapErrors()-before)
	}
}

// tornReader reads files as os.ReadFile does, except that it shows the next read of path half-written when
// told to: the moment of a rewrite in place that a reader can hit.
type tornReader struct {
	path string
	torn atomic.Int32 // reads of path still to tear
}

func (r *tornReader) readFile(name string) ([]byte, error) {
	b, err := os.ReadFile(name)
	if err == nil && name == r.path && r.torn.Add(-1) >= 0 {
		return b[:len(b)/2], nil
	}
	return b, err
}

// TestDropInWatchTornRead: a read that catches an input half-written is neither applied nor counted as a bad
// ConfigMap; the input once whole is applied with one reload.
func TestDropInWatchTornRead(t *testing.T) {
	for _, torn := range []string{"base", "kube-dns"} {
		t.Run(torn, func(t *testing.T) {
			fx := newDropInFixture(t)
			r := &tornReader{path: fx.d.Base}
			if torn == "kube-dns" {
				r.path = filepath.Join(fx.kdDir, UpstreamNameserversKey)
			}
			fx.d.readFile = r.readFile
			writeFile(t, filepath.Join(fx.kdDir, UpstreamNameserversKey), `["8.8.8.8"]`)
			if err := fx.d.Sync(); err != nil {
				t.Fatal(err)
			}
			fx.watch(t)

			base, _ := os.ReadFile(fx.d.Base)
			r.torn.Store(1)
			writeFile(t, fx.d.Base, string(bytes.ReplaceAll(base, []byte("cache 30"), []byte("cache 15"))))
			waitFor(t, func() bool { return fx.reloads.Load() >= 1 && r.torn.Load() < 0 })
			if !strings.Contains(fx.output(t), "cache 15") || !strings.Contains(fx.output(t), "forward . 8.8.8.8\n") {
				t.Errorf("change not applied whole:\n%s", fx.output(t))
			}
			if n := fx.configMapErrors(); n != 0 {
				t.Errorf("a torn read was counted as %d bad inputs", n)
			}
			if n := fx.reloads.Load(); n != 1 {
				t.Errorf("%d reloads, want 1", n)
			}
		})
	}
}

// waitFor polls cond for up to 30 seconds: a bound for a watcher that never acts, generous for a busy machine.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatal("condition not met within 30s")
}

// TestDropInWatchPollsWhatItCannotWatch: with no kube-dns ConfigMap directory to watch, the watch looks every
// period, and finds the ConfigMap once it is there.
func TestDropInWatchPollsWhatItCannotWatch(t *testing.T) {
	fx := newDropInFixture(t)
	if err := os.Remove(fx.kdDir); err != nil {
		t.Fatal(err)
	}
	if err := fx.d.Sync(); fx.d.Written() == nil { // it starts without the ConfigMap, and says so
		t.Fatal(err)
	}
	fx.watch(t)
	if err := os.Mkdir(fx.kdDir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(fx.kdDir, UpstreamNameserversKey), `["8.8.8.8"]`)
	waitFor(t, func() bool { return fx.reloads.Load() == 1 })
	if !strings.Contains(fx.output(t), "forward . 8.8.8.8\n") {
		t.Errorf("upstream not applied:\n%s", fx.output(t))
	}
}
