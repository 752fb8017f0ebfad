package kubeproxy

import (
	"encoding/json"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/kubeapi"
)

// TestBinaryIsThePinnedVersion asks kube-proxy for its version: kube-apiserver's.
func TestBinaryIsThePinnedVersion(t *testing.T) {
	bin := RequireBinary(t)
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("%s --version: %v: %s", bin, err, out)
	}
	if want := "Kubernetes " + kubeapi.KubernetesVersion + "\n"; string(out) != want {
		t.Errorf("%s --version says %q, want %q", bin, out, want)
	}
}

// TestConfigFile checks the KubeProxyConfiguration a Config writes, and that one missing a setting is refused.
func TestConfigFile(t *testing.T) {
	base := Config{
		Mode: NFTables, Kubeconfig: "/k", NodeName: "n",
		ClusterCIDRs:   []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:10:244::/56")},
		MetricsAddress: "127.0.0.1:10249", HealthzAddress: "127.0.0.1:10256",
	}
	for _, tc := range []struct {
		name   string
		edit   func(*Config)
		want   map[string]any // top-level fields and their JSON values
		absent []string
		err    string
	}{
		{name: "nftables, dual-stack", edit: func(*Config) {}, want: map[string]any{
			"mode": "nftables", "clusterCIDR": "10.244.0.0/16,fd00:10:244::/56", "hostnameOverride": "n",
			"detectLocalMode": "ClusterCIDR", "metricsBindAddress": "127.0.0.1:10249", "healthzBindAddress": "127.0.0.1:10256",
			"conntrack": map[string]any{"maxPerCore": 0.0, "min": 0.0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
		}, absent: []string{"iptables", "nftables"}},
		{name: "iptables with a sync period", edit: func(c *Config) { c.Mode, c.SyncPeriod = IPTables, time.Second }, want: map[string]any{
			"mode": "iptables", "iptables": map[string]any{"syncPeriod": "1s"},
		}, absent: []string{"nftables"}},
		{name: "nftables with a sync period", edit: func(c *Config) { c.SyncPeriod = 2 * time.Second }, want: map[string]any{
			"nftables": map[string]any{"syncPeriod": "2s"},
		}, absent: []string{"iptables"}},
		{name: "ipvs", edit: func(c *Config) { c.Mode = "ipvs" }, err: `kube-proxy mode "ipvs"`},
		{name: "no node name", edit: func(c *Config) { c.NodeName = "" }, err: "needs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := base
			tc.edit(&c)
			b, err := c.File()
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("File() = %v, want an error with %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got map[string]any
			if err := json.Unmarshal(b, &got); err != nil {
				t.Fatal(err)
			}
			if got["kind"] != "KubeProxyConfiguration" || got["apiVersion"] != "kubeproxy.config.k8s.io/v1alpha1" {
				t.Errorf("kind %v, apiVersion %v", got["kind"], got["apiVersion"])
			}
			for k, v := range tc.want {
				gb, _ := json.Marshal(got[k])
				wb, _ := json.Marshal(v)
				if string(gb) != string(wb) {
					t.Errorf("%s = %s, want %s", k, gb, wb)
				}
			}
			for _, k := range tc.absent {
				if _, ok := got[k]; ok {
					t.Errorf("%s is set: %v", k, got[k])
				}
			}
		})
	}
}

// A /metrics answer of a dual-stack kube-proxy, cut down.
const metricsText = `# HELP kubeproxy_sync_proxy_rules_duration_seconds [ALPHA] SyncProxyRules latency in seconds
# TYPE kubeproxy_sync_proxy_rules_duration_seconds histogram
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="0.001"} 0
kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv4"} 5
kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv6"} 3
kubeproxy_sync_proxy_rules_endpoint_changes_pending 0
kubeproxy_sync_proxy_rules_endpoint_changes_total 7
kubeproxy_sync_proxy_rules_service_changes_pending 0
kubeproxy_sync_proxy_rules_service_changes_total 6
kubeproxy_sync_proxy_rules_iptables_restore_failures_total{ip_family="IPv4"} 1
kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total{ip_family="IPv6"} 1
kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family="IPv4"} 1.7e+09
kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family="IPv6"} 1.6e+09
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"} 1.7000000005e+09
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv6"} 1.6e+09
`

func TestParseMetrics(t *testing.T) {
	m, err := ParseMetrics(metricsText)
	if err != nil {
		t.Fatal(err)
	}
	if m.Syncs != 8 || m.Failures != 2 || m.EndpointChanges != 7 || m.ServiceChanges != 6 {
		t.Errorf("parsed %+v", m)
	}
	if m.LastSync["IPv4"] != 1.7000000005e9 || m.LastQueued["IPv6"] != 1.6e9 {
		t.Errorf("timestamps %v, %v", m.LastSync, m.LastQueued)
	}
	if !m.Synced() {
		t.Errorf("Synced() = false for %v", m)
	}
	for _, edit := range []struct {
		name string
		fn   func(*SyncMetrics)
	}{
		{"an endpoint change pending", func(m *SyncMetrics) { m.EndpointChangesPending = 1 }},
		{"a change queued after the last sync", func(m *SyncMetrics) { m.LastQueued["IPv6"] = 1.8e9 }},
		{"no sync yet", func(m *SyncMetrics) { m.LastSync = map[string]float64{} }},
	} {
		m2, _ := ParseMetrics(metricsText)
		edit.fn(&m2)
		if m2.Synced() {
			t.Errorf("%s: Synced() = true", edit.name)
		}
	}
	if _, err := ParseMetrics("# nothing yet\n"); err == nil {
		t.Error("metrics without the sync histogram parsed")
	}
}
