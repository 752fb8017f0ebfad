//go:build linux

package main

import (
	"encoding/json"
	"flag"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nodelocaldns/nodelocaldns/corefile"
	"github.com/nodelocaldns/nodelocaldns/internal/atomicfile"
)

// coreDNSStandIns returns a flag set with stand-ins for the three of coremain's flags that node-cache's flags
// read (coremain defines the real ones on the command line, where a test must not change them).
func coreDNSStandIns() *flag.FlagSet {
	fs := flag.NewFlagSet("node-cache", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.String("conf", "", "")
	fs.String("dns.port", "53", "")
	fs.String("pidfile", "", "")
	return fs
}

// newFlagSet returns the cache's flag set, as runCache defines it, on the stand-ins for CoreDNS's flags.
func newFlagSet() (*flag.FlagSet, *nodeCacheFlags) {
	fs := coreDNSStandIns()
	return fs, registerCacheFlags(fs)
}

// newSideModeFlagSet returns the flag set of the side mode name, as newModeFlagSet makes it, on the
// stand-ins for CoreDNS's flags, with parse errors returned instead of exiting.
func newSideModeFlagSet(name string) *flag.FlagSet {
	fs := newModeFlagSet(name, coreDNSStandIns())
	fs.Init(fs.Name(), flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

func parseDropIn(t *testing.T, args ...string) (*corefile.DropIn, *flag.FlagSet, error) {
	t.Helper()
	fs, f := newFlagSet()
	if err := fs.Parse(args); err != nil {
		return nil, fs, err
	}
	d, err := f.dropIn(fs)
	return d, fs, err
}

func TestSyncIntervalFlag(t *testing.T) {
	for in, want := range map[string]time.Duration{
		"60":   60 * time.Second,
		"60s":  60 * time.Second,
		"1m":   time.Minute,
		"90s":  90 * time.Second,
		"1ns":  time.Second, // upstream's reading of its duration flag
		"30ns": 30 * time.Second,
		"5ms":  5 * time.Millisecond,
	} {
		var s syncInterval
		if err := s.Set(in); err != nil || time.Duration(s) != want {
			t.Errorf("%q: got %v, %v; want %v", in, time.Duration(s), err, want)
		}
	}
	for _, in := range []string{"0", "0s", "-5s", "sixty", "60 s", ""} {
		var s syncInterval
		if err := s.Set(in); err == nil {
			t.Errorf("%q: accepted as %v", in, time.Duration(s))
		}
	}
}

func TestNodeCacheFlags(t *testing.T) {
	t.Setenv("KUBE_DNS_SERVICE_HOST", "")
	t.Setenv("KUBE_DNS_UPSTREAM_SERVICE_HOST", "")
	d, fs, err := parseDropIn(t, "-localip", "169.254.20.10,10.96.0.10", "-conf", "/etc/Corefile", "-upstreamsvc", "kube-dns-upstream",
		"-pidfile", "/tmp/node-cache.pid")
	if err != nil {
		t.Fatal(err)
	}
	e := d.Expansion
	if d.Base != defaultBaseCorefile || d.Output != "/etc/Corefile" || d.Reload != nil {
		t.Errorf("paths: base %s output %s reload %v", d.Base, d.Output, d.Reload != nil)
	}
	if len(e.LocalIPs) != 2 || e.LocalIPs[1] != netip.MustParseAddr("10.96.0.10") || e.Upstream.Service != "kube-dns-upstream" ||
		e.PrometheusEndpoint != "169.254.20.10:9253" || e.Port != 53 || len(e.NotrackPorts) != 1 || e.NotrackPorts[0] != 8080 {
		t.Errorf("expansion %+v", e)
	}
	if !reflect.DeepEqual(*e.Notrack, corefile.Notrack{Interface: corefile.DefaultInterface, Handover: true}) {
		t.Errorf("notrack %+v", *e.Notrack)
	}
	if fs.Lookup("conf").Value.String() != "/etc/Corefile" {
		t.Error("-conf changed")
	}

	d, fs, err = parseDropIn(t, "-localip", "fd00::10", "-corefile", "/run/Corefile", "-setupinterface=false", "-setupiptables=false",
		"-skipteardown", "-interfacename", "nl0", "-syncinterval", "1ns", "-health-port", "9080", "-dns.port", "5353",
		"-prometheus-listen-address", "[fd00::7]:9253", "-reloadwithsignal", "-basecorefile", "/cfg/base", "-kubednscm", "/cfg/kube-dns")
	if err != nil {
		t.Fatal(err)
	}
	e = d.Expansion
	if !reflect.DeepEqual(*e.Notrack, corefile.Notrack{Interface: "nl0", Sync: time.Second, NoInterface: true, NoRules: true, SkipTeardown: true}) {
		t.Errorf("notrack %+v", *e.Notrack)
	}
	if e.Port != 5353 || e.NotrackPorts[0] != 9080 || e.PrometheusEndpoint != "[fd00::7]:9253" || d.Reload == nil ||
		d.Base != "/cfg/base" || d.KubeDNSDir != "/cfg/kube-dns" || e.Upstream.Service != defaultUpstreamSvc {
		t.Errorf("drop-in %+v, expansion %+v", d, e)
	}
	if d.Output != "/run/Corefile" || fs.Lookup("conf").Value.String() != "/run/Corefile" {
		t.Errorf("without -conf, -corefile is written and loaded: output %s, conf %s", d.Output, fs.Lookup("conf").Value)
	}
	if e.ServeStale == nil || e.ServeStale.PreferPositive {
		t.Errorf("serve_stale %+v, want it without prefer_positive by default", e.ServeStale)
	}

	d, _, err = parseDropIn(t, "-localip", "169.254.20.10", "-servestalepolicy", "prefer_positive")
	if err != nil {
		t.Fatal(err)
	}
	if s := d.Expansion.ServeStale; s == nil || !s.PreferPositive {
		t.Errorf("-servestalepolicy prefer_positive: serve_stale %+v", s)
	}

	d, _, err = parseDropIn(t, "-localip", "169.254.20.10", "-servestale=false")
	if err != nil {
		t.Fatal(err)
	}
	if s := d.Expansion.ServeStale; s != nil {
		t.Errorf("-servestale=false: serve_stale %+v, want none added", s)
	}
}

func TestNodeCacheFlagsErrors(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"-localip", "169.254.20.10,10.96.0"}, `"10.96.0" is not a unicast IP`},
		{[]string{"-localip", "0.0.0.0"}, "not a unicast IP"},
		{[]string{"-localip", "169.254.20.10:53"}, "not a unicast IP"},
		{[]string{"-localip", "169.254.20.10", "-health-port", "http"}, "-health-port"},
		{[]string{"-localip", "169.254.20.10", "-dns.port", "0"}, "-dns.port"},
		{[]string{"-localip", "169.254.20.10", "-prometheus-listen-address", "fd00::7:9253"}, "-prometheus-listen-address"},
		{[]string{"-localip", "169.254.20.10", "-metrics-listen-address", "0.0.0.0"}, "-metrics-listen-address"},
		{[]string{"-upstreamsvc", "kube-dns-upstream", "-skipteardown"}, "-upstreamsvc, -skipteardown only apply with -localip"},
		{[]string{"-localip", "169.254.20.10", "-syncinterval", "soon"}, "invalid value"},
		{[]string{"-localip", "169.254.20.10", "-servestalepolicy", "prefer_negative"}, `-servestalepolicy: "prefer_negative" is not a policy`},
		{[]string{"-localip", "169.254.20.10", "-servestale=false", "-servestalepolicy", "prefer_positive"}, "needs the serve_stale that -servestale=false leaves out"},
	}
	for _, tt := range tests {
		_, _, err := parseDropIn(t, tt.args...)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: got %v, want %q", tt.args, err, tt.want)
		}
	}
	d, fs, err := parseDropIn(t, "-conf", "examples/demo/Corefile", "-dns.port", "5300")
	if err != nil || d != nil {
		t.Errorf("plain CoreDNS flags: got %v, %v", d, err)
	}
	if fs.Lookup("conf").Value.String() != "examples/demo/Corefile" {
		t.Error("-conf changed without drop-in mode")
	}
}

func addrs(ss ...string) []netip.Addr {
	out := make([]netip.Addr, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParseAddr(s)
	}
	return out
}

// TestFlagsMatchTypedConfig runs node-cache's flags the way a DaemonSet would (the ConfigMap Corefile from
// corefile.Template, the kube-dns ConfigMap as a mounted directory) and compares the Corefile they write
// with corefile.Render of the equivalent typed configuration.
func TestFlagsMatchTypedConfig(t *testing.T) {
	// Without the Service variables the hand-over is on, with no addresses to divert or give back.
	t.Setenv("KUBE_DNS_SERVICE_HOST", "")
	t.Setenv("KUBE_DNS_UPSTREAM_SERVICE_HOST", "")
	t.Setenv("COREDNS_UPSTREAM_SERVICE_HOST", "")
	handover := corefile.Notrack{Handover: true}
	tests := []struct {
		name string
		cfg  corefile.Config
		args []string
	}{
		{
			name: "iptables",
			cfg:  corefile.Config{LocalIPs: addrs("169.254.20.10"), ClusterDNSIPs: addrs("10.96.0.10"), Notrack: handover},
			args: []string{"-localip", "169.254.20.10,10.96.0.10", "-upstreamsvc", "kube-dns-upstream"},
		},
		{
			name: "ipvs",
			cfg:  corefile.Config{Mode: corefile.ModeIPVS, LocalIPs: addrs("169.254.20.10"), ClusterDNSIPs: addrs("10.96.0.10"), Notrack: handover},
			args: []string{"-localip", "169.254.20.10", "-upstreamsvc", "kube-dns-upstream"},
		},
		{
			name: "dual-stack",
			cfg: corefile.Config{LocalIPs: addrs("169.254.20.10", "fd00:169:254::10"),
				ClusterDNSIPs: addrs("10.96.0.10", "fd00:10:96::a"), Notrack: handover},
			args: []string{"-localip", "169.254.20.10,fd00:169:254::10,10.96.0.10,fd00:10:96::a", "-upstreamsvc", "kube-dns-upstream"},
		},
		{
			name: "ipv6",
			cfg:  corefile.Config{LocalIPs: addrs("fd00:169:254::10"), ClusterDNSIPs: addrs("fd00:10:96::a"), ClusterDomain: "k8s.example.org", Notrack: handover},
			args: []string{"-localip", "fd00:169:254::10,fd00:10:96::a", "-upstreamsvc", "kube-dns-upstream"},
		},
		{
			name: "stub domains and upstreams from the kube-dns ConfigMap",
			cfg: corefile.Config{LocalIPs: addrs("169.254.20.10"), ClusterDNSIPs: addrs("10.96.0.10"),
				StubDomains:   map[string][]string{"acme.local": {"1.2.3.4"}, "corp.example.com": {"10.150.0.1:5353", "[2001:db8::53]:53"}},
				NodeUpstreams: []string{"8.8.8.8", "[2001:4860:4860::8888]:53"}, Notrack: handover},
			args: []string{"-localip", "169.254.20.10,10.96.0.10", "-upstreamsvc", "kube-dns-upstream"},
		},
		{
			name: "every flag",
			cfg: corefile.Config{LocalIPs: addrs("169.254.25.10"), ClusterDNSIPs: addrs("10.32.0.10"), Port: 5353,
				HealthPort: 9080, ReadyPort: 9181, MetricsAddress: "10.0.0.7:9253",
				Upstream: corefile.Upstream{Service: "coredns-upstream"},
				Notrack: corefile.Notrack{Interface: "nlcache0", Sync: 30 * time.Second, NoInterface: true, NoRules: true,
					SkipTeardown: true, Lock: "/run/nodelocaldns/lock"}},
			args: []string{"-localip", "169.254.25.10,10.32.0.10", "-upstreamsvc", "coredns-upstream", "-dns.port", "5353",
				"-health-port", "9080", "-prometheus-listen-address", "10.0.0.7:9253", "-interfacename", "nlcache0",
				"-syncinterval", "30", "-setupinterface=false", "-setupiptables=false", "-skipteardown",
				"-lockfile", "/run/nodelocaldns/lock"},
		},
		{
			// Before -servestale, node-cache added serve_stale to every cache of a Corefile written without it.
			name: "serve stale off",
			cfg: corefile.Config{LocalIPs: addrs("169.254.20.10"), ClusterDNSIPs: addrs("10.96.0.10"), Notrack: handover,
				ServeStale: corefile.ServeStale{Disabled: true}},
			args: []string{"-localip", "169.254.20.10,10.96.0.10", "-upstreamsvc", "kube-dns-upstream", "-servestale=false"},
		},
		{
			name: "serve stale off, cache plugin in the cluster domain",
			cfg: corefile.Config{LocalIPs: addrs("169.254.20.10"), ClusterDNSIPs: addrs("10.96.0.10"), Notrack: handover,
				Log: true, ServeStale: corefile.ServeStale{Disabled: true}},
			args: []string{"-localip", "169.254.20.10,10.96.0.10", "-upstreamsvc", "kube-dns-upstream", "-servestale=false"},
		},
		{
			name: "prefer positive",
			cfg: corefile.Config{LocalIPs: addrs("169.254.20.10"), ClusterDNSIPs: addrs("10.96.0.10"), Notrack: handover,
				ServeStale: corefile.ServeStale{PreferPositive: true}},
			args: []string{"-localip", "169.254.20.10,10.96.0.10", "-upstreamsvc", "kube-dns-upstream", "-servestalepolicy", "prefer_positive"},
		},
		{
			// The retry budget rides in the ConfigMap's Corefile, as the cluster forward's max_connect_attempts.
			name: "max attempts",
			cfg: corefile.Config{LocalIPs: addrs("169.254.20.10"), ClusterDNSIPs: addrs("10.96.0.10"), Notrack: handover,
				MaxAttempts: 3},
			args: []string{"-localip", "169.254.20.10,10.96.0.10", "-upstreamsvc", "kube-dns-upstream"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			base, kubeDNS, out := filepath.Join(dir, "Corefile.base"), filepath.Join(dir, "kube-dns"), filepath.Join(dir, "Corefile")
			template, err := corefile.Template(tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			writeFile(t, base, template)
			writeKubeDNSDir(t, kubeDNS, corefile.KubeDNS{StubDomains: tt.cfg.StubDomains, UpstreamNameservers: tt.cfg.NodeUpstreams})

			args := append([]string{"-basecorefile", base, "-kubednscm", kubeDNS, "-conf", out}, tt.args...)
			d, _, err := parseDropIn(t, args...)
			if err != nil {
				t.Fatal(err)
			}
			if err := d.Sync(); err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			want, err := corefile.Render(tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != string(want) {
				t.Errorf("flags wrote\n%s\ntyped config renders\n%s", got, want)
			}
		})
	}
}

// writeFile replaces path in one rename, as the kubelet updates a ConfigMap volume: the drop-in's watcher
// sees the old content or the new, never a truncated file (which a plain os.WriteFile shows it for a moment,
// and which reads as a valid, empty setting).
func writeFile(t *testing.T, path string, content []byte) {
	t.Helper()
	if err := atomicfile.Write(path, content, 0o644); err != nil {
		t.Fatal(err)
	}
}

// writeKubeDNSDir lays the kube-dns ConfigMap out as its volume mount does: one file per key.
func writeKubeDNSDir(t *testing.T, dir string, kd corefile.KubeDNS) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if len(kd.StubDomains) > 0 {
		b, _ := json.Marshal(kd.StubDomains)
		writeFile(t, filepath.Join(dir, corefile.StubDomainsKey), b)
	}
	if len(kd.UpstreamNameservers) > 0 {
		b, _ := json.Marshal(kd.UpstreamNameservers)
		writeFile(t, filepath.Join(dir, corefile.UpstreamNameserversKey), b)
	}
}

// TestHandoverFlag: the hand-over at exit is on by default in drop-in mode, with its addresses from the
// Service variables; -handover=false, -skipteardown and -setupiptables=false turn it off.
func TestHandoverFlag(t *testing.T) {
	t.Setenv("KUBE_DNS_SERVICE_HOST", "10.96.0.10")
	t.Setenv("KUBE_DNS_UPSTREAM_SERVICE_HOST", "10.96.0.11")
	d, _, err := parseDropIn(t, "-localip", "169.254.20.10,10.96.0.10", "-upstreamsvc", "kube-dns-upstream")
	if err != nil {
		t.Fatal(err)
	}
	n := d.Expansion.Notrack
	want := corefile.Notrack{Interface: corefile.DefaultInterface, Handover: true,
		HandoverUpstream: []netip.Addr{netip.MustParseAddr("10.96.0.11")}, ServiceAddresses: []netip.Addr{netip.MustParseAddr("10.96.0.10")}}
	if !reflect.DeepEqual(*n, want) {
		t.Errorf("notrack %+v, want %+v", *n, want)
	}
	// IPVS mode: the kube-dns ClusterIP is not a local IP.
	d, _, err = parseDropIn(t, "-localip", "169.254.20.10", "-upstreamsvc", "kube-dns-upstream")
	if err != nil {
		t.Fatal(err)
	}
	if n := d.Expansion.Notrack; !n.Handover || len(n.ServiceAddresses) != 0 || len(n.HandoverUpstream) != 1 {
		t.Errorf("IPVS mode: notrack %+v", *n)
	}
	for _, off := range [][]string{{"-handover=false"}, {"-skipteardown"}, {"-setupiptables=false"}} {
		d, _, err := parseDropIn(t, append([]string{"-localip", "169.254.20.10"}, off...)...)
		if err != nil {
			t.Fatal(err)
		}
		if d.Expansion.Notrack.Handover {
			t.Errorf("%v: hand-over still on", off)
		}
	}
	t.Setenv("KUBE_DNS_UPSTREAM_SERVICE_HOST", "not-an-ip")
	if _, _, err := parseDropIn(t, "-localip", "169.254.20.10", "-upstreamsvc", "kube-dns-upstream"); err == nil || !strings.Contains(err.Error(), "KUBE_DNS_UPSTREAM_SERVICE_HOST") {
		t.Errorf("a bad upstream address: %v", err)
	}
}
