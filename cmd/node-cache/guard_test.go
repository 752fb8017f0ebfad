//go:build linux

package main

import (
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/nodelocaldns/nodelocaldns/corefile"
	"github.com/nodelocaldns/nodelocaldns/examples/kubernetes"
	"github.com/nodelocaldns/nodelocaldns/nodelocal"
)

func parseGuard(t *testing.T, env map[string]string, args ...string) (nodelocal.GuardConfig, error) {
	t.Helper()
	m := newGuardMode(newSideModeFlagSet("guard"))
	if err := m.fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return m.guard.guardConfig(m.fs, m.cache, func(k string) string { return env[k] })
}

func TestGuardFlags(t *testing.T) {
	env := map[string]string{"KUBE_DNS_SERVICE_HOST": "10.96.0.10", "KUBE_DNS_UPSTREAM_SERVICE_HOST": "10.96.0.11"}
	cfg, err := parseGuard(t, env, "-guard", "-localip", "169.254.20.10,10.96.0.10", "-upstreamsvc", "kube-dns-upstream",
		"-interfacename", "nlcache", "-dns.port", "5353", "-guard.interval", "100ms", "-guard.idleinterval", "7s", "-guard.failafter", "4",
		"-lockfile", "/run/test/nodelocaldns.lock")
	if err != nil {
		t.Fatal(err)
	}
	want := nodelocal.GuardConfig{
		Interface: "nlcache", Backend: "auto", LockPath: nodelocal.DefaultGuardLockPath, CacheLockPath: "/run/test/nodelocaldns.lock",
		Addresses:        []netip.Addr{netip.MustParseAddr("169.254.20.10"), netip.MustParseAddr("10.96.0.10")},
		DNSPort:          5353,
		ServiceAddresses: []netip.Addr{netip.MustParseAddr("10.96.0.10")},
		Upstream:         []netip.Addr{netip.MustParseAddr("10.96.0.11")},
		Interval:         100 * time.Millisecond, IdleInterval: 7 * time.Second, ProbeTimeout: nodelocal.DefaultGuardProbeTimeout,
		FailAfter: 4, RecoverAfter: nodelocal.DefaultGuardRecoverAfter, ProbeName: "",
	}
	if cfg.Interface != want.Interface || cfg.Backend != want.Backend || cfg.LockPath != want.LockPath || cfg.CacheLockPath != want.CacheLockPath ||
		cfg.IdleInterval != want.IdleInterval ||
		!slices.Equal(cfg.Addresses, want.Addresses) || cfg.DNSPort != want.DNSPort ||
		!slices.Equal(cfg.ServiceAddresses, want.ServiceAddresses) || !slices.Equal(cfg.Upstream, want.Upstream) ||
		cfg.Interval != want.Interval || cfg.ProbeTimeout != want.ProbeTimeout || cfg.FailAfter != want.FailAfter ||
		cfg.RecoverAfter != want.RecoverAfter || cfg.ProbeName != want.ProbeName {
		t.Errorf("got  %+v\nwant %+v", cfg, want)
	}

	// IPVS: the ClusterIP is not one of the cache's addresses, so nothing is removed; flags beat the
	// environment.
	cfg, err = parseGuard(t, env, "-guard", "-localip", "169.254.20.10", "-guard.upstreamips", "10.96.0.12,fd00:10:96::b")
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.ServiceAddresses) != 0 || len(cfg.Upstream) != 2 || cfg.Upstream[0] != netip.MustParseAddr("10.96.0.12") {
		t.Errorf("IPVS: %+v", cfg)
	}
}

func TestGuardFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-guard"}, "-guard needs -localip"},
		{[]string{"-guard", "-localip", "169.254.20.10", "-guard.serviceips", "nope"}, "-guard.serviceips"},
		{[]string{"-guard", "-localip", "169.254.20.10", "-guard.interval", "0s"}, "must be positive"},
		{[]string{"-guard", "-localip", "169.254.20.10", "-guard.idleinterval", "0s"}, "must be positive"},
		{[]string{"-guard", "-localip", "169.254.20.10", "-upstreamsvc", "kube-dns-upstream"}, ""},
	} {
		_, err := parseGuard(t, map[string]string{"KUBE_DNS_UPSTREAM_SERVICE_HOST": "x"}, tc.args...)
		if tc.want == "" {
			if err == nil || !strings.Contains(err.Error(), "KUBE_DNS_UPSTREAM_SERVICE_HOST") {
				t.Errorf("%v: %v, want the variable named", tc.args, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.want)
		}
	}
}

func TestServiceHostVar(t *testing.T) {
	if got := serviceHostVar("kube-dns-upstream"); got != "KUBE_DNS_UPSTREAM_SERVICE_HOST" {
		t.Error(got)
	}
}

// TestManifestsGuardArgs runs each manifest's guard sidecar arguments through the -guard flags, with the
// variables the kubelet gives the Pod, and checks that a Guard accepts the result.
func TestManifestsGuardArgs(t *testing.T) {
	env := map[string]string{"KUBE_DNS_SERVICE_HOST": "10.96.0.10", "KUBE_DNS_UPSTREAM_SERVICE_HOST": "10.96.0.11"}
	for _, m := range kubernetes.Manifests {
		t.Run(m.File, func(t *testing.T) {
			objs, err := kubernetes.Load(m.File)
			if err != nil {
				t.Fatal(err)
			}
			pod := objs.DaemonSets[0].Spec.Template.Spec
			i := slices.IndexFunc(pod.InitContainers, func(c corev1.Container) bool { return c.Name == "guard" })
			if i < 0 {
				t.Fatal("no guard sidecar")
			}
			c := pod.InitContainers[i]
			if c.RestartPolicy == nil || *c.RestartPolicy != corev1.ContainerRestartPolicyAlways {
				t.Error("the guard is not a sidecar (restartPolicy: Always)")
			}
			if _, ok := c.Resources.Limits[corev1.ResourceMemory]; !ok {
				t.Error("the guard has no memory limit of its own")
			}
			if c.Image != pod.Containers[0].Image {
				t.Errorf("guard image %s, cache image %s", c.Image, pod.Containers[0].Image)
			}
			args := expandEnv(t, c)
			cfg, err := parseGuard(t, env, args...)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := argValue(args, "-localip"), argValue(expandEnv(t, pod.Containers[0]), "-localip"); got != want {
				t.Errorf("guard -localip %s, cache -localip %s", got, want)
			}
			for _, ip := range m.Config.ClusterDNSIPs {
				if m.Config.Mode != corefile.ModeIPVS && !slices.Contains(cfg.ServiceAddresses, ip) {
					t.Errorf("kube-dns ClusterIP %s is not a Service address of the guard", ip)
				}
			}
			cfg.LockPath = filepath.Join(t.TempDir(), "guard.lock")
			g, err := nodelocal.NewGuard(cfg)
			if err != nil {
				t.Fatal(err)
			}
			g.Close()
		})
	}
}

func argValue(args []string, name string) string {
	if i := slices.Index(args, name); i >= 0 && i+1 < len(args) {
		return args[i+1]
	}
	return ""
}
