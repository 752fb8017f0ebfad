//go:build linux

package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/nodelocaldns/nodelocaldns/corefile"
	"github.com/nodelocaldns/nodelocaldns/plugin/notrack"
)

func freeLoopbackAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func TestRunDropIn(t *testing.T) {
	dir := t.TempDir()
	base, kubeDNS, out := filepath.Join(dir, "Corefile.base"), filepath.Join(dir, "kube-dns"), filepath.Join(dir, "Corefile")
	template, err := corefile.Template(corefile.Config{LocalIPs: addrs("169.254.20.10"), ClusterDNSIPs: addrs("10.96.0.10")})
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, base, template)
	writeKubeDNSDir(t, kubeDNS, corefile.KubeDNS{})
	d, _, err := parseDropIn(t, "-localip", "169.254.20.10,10.96.0.10", "-upstreamsvc", "kube-dns-upstream",
		"-basecorefile", base, "-kubednscm", kubeDNS, "-conf", out)
	if err != nil {
		t.Fatal(err)
	}

	ctx := t.Context()
	metrics := freeLoopbackAddr(t)
	known := []string{"errors", "wirecache", "clamp", "cache", "reload", "loop", "bind", "notrack", "upstreamsvc", "forward",
		"prometheus", "health", "ready"}
	if err := runDropIn(ctx, d, known, buildPair{}, metrics, 10*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	first, err := os.ReadFile(out)
	if err != nil || !strings.Contains(string(first), "upstreamsvc kube-dns-upstream kube-system") {
		t.Fatalf("first Corefile: %v\n%s", err, first)
	}

	writeKubeDNSDir(t, kubeDNS, corefile.KubeDNS{StubDomains: map[string][]string{"acme.local": {"10.0.0.53"}}})
	waitUntil(t, func() bool { b, _ := os.ReadFile(out); return strings.Contains(string(b), "acme.local:53 {") })

	// A bad update (kube-dns allows at most 3 upstreams) is kept out and counted as a configmap error.
	configMapErrors := func() float64 {
		m := &dto.Metric{}
		if err := notrack.SetupErrors.WithLabelValues(notrack.ConfigMapError).Write(m); err != nil {
			t.Fatal(err)
		}
		return m.GetCounter().GetValue()
	}
	before := configMapErrors()
	good, _ := os.ReadFile(out)
	writeKubeDNSDir(t, kubeDNS, corefile.KubeDNS{UpstreamNameservers: []string{"10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"}})
	waitUntil(t, func() bool { return configMapErrors() > before })
	if now, _ := os.ReadFile(out); string(now) != string(good) {
		t.Errorf("a bad kube-dns ConfigMap changed the Corefile:\n%s", now)
	}

	resp, err := http.Get("http://" + metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `coredns_nodecache_setup_errors_total{errortype="configmap"}`) {
		t.Errorf("metrics lack the setup error counter:\n%.2000s", body)
	}
}

func TestRunDropInRefusesUnknownDirectives(t *testing.T) {
	dir := t.TempDir()
	base, out := filepath.Join(dir, "Corefile.base"), filepath.Join(dir, "Corefile")
	writeFile(t, base, []byte(".:53 {\n    bind __PILLAR__LOCAL__DNS__\n    forward . __PILLAR__UPSTREAM__SERVERS__\n}\n"))
	d, _, err := parseDropIn(t, "-localip", "169.254.20.10", "-basecorefile", base, "-conf", out)
	if err != nil {
		t.Fatal(err)
	}
	err = runDropIn(context.Background(), d, []string{"bind", "forward"}, buildPair{}, "", time.Hour)
	if err == nil || !strings.Contains(err.Error(), `directive "notrack" is not compiled into this CoreDNS`) {
		t.Fatalf("got %v", err)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Error("a Corefile CoreDNS cannot load was written")
	}
}

func TestReloadWithSignal(t *testing.T) {
	d, _, err := parseDropIn(t, "-localip", "169.254.20.10", "-reloadwithsignal")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan os.Signal, 1)
	signal.Notify(got, syscall.SIGUSR1)
	defer signal.Stop(got)
	if err := d.Reload(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("no SIGUSR1 within 5s")
	}
}

// waitUntil polls cond for up to 30 seconds: a bound for a watcher that never acts, generous for a busy
// machine.
func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatal("condition not met within 30s")
}
