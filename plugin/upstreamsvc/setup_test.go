package upstreamsvc

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
)

func TestSetup(t *testing.T) {
	noClusterAPI(t)
	clearServiceEnv(t)

	tests := []struct {
		input   string
		wantErr string // substring; "" means setup succeeds
		want    Config // checked when wantErr is ""
	}{
		{
			input: "upstreamsvc {\n fallback 127.0.0.1:5301\n}",
			want: Config{Service: "kube-dns-upstream", Namespace: "kube-system", Expire: defaultExpire, HealthCheck: defaultHealthCheck, MaxAttempts: defaultMaxAttempts,
				Fallback: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:5301")}},
		},
		{
			input: "upstreamsvc my-dns {\n fallback 10.0.0.10\n}",
			want: Config{Service: "my-dns", Namespace: "kube-system", Expire: defaultExpire, HealthCheck: defaultHealthCheck, MaxAttempts: defaultMaxAttempts,
				Fallback: []netip.AddrPort{netip.MustParseAddrPort("10.0.0.10:53")}},
		},
		{
			input: "upstreamsvc my-dns dns-system {\n port 5353\n prefer_udp\n fallback 10.0.0.10 [fd00::10]:54 ::1\n max_concurrent 100\n expire 5s\n health_check 1s\n max_attempts 3\n}",
			want: Config{Service: "my-dns", Namespace: "dns-system", Port: 5353, PreferUDP: true, MaxConcurrent: 100,
				Expire: 5 * time.Second, HealthCheck: time.Second, MaxAttempts: 3,
				Fallback: []netip.AddrPort{
					netip.MustParseAddrPort("10.0.0.10:5353"),
					netip.MustParseAddrPort("[fd00::10]:54"),
					netip.MustParseAddrPort("[::1]:5353"),
				}},
		},
		{
			input: "upstreamsvc {\n force_tcp\n force_tcp\n fallback 127.0.0.1\n fallback 127.0.0.2\n expire 1s\n}",
			want: Config{Service: "kube-dns-upstream", Namespace: "kube-system", Expire: minExpire, HealthCheck: defaultHealthCheck, MaxAttempts: defaultMaxAttempts,
				Fallback: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:53"), netip.MustParseAddrPort("127.0.0.2:53")}},
		},

		{input: "upstreamsvc a b c", wantErr: "Wrong argument count"},
		{input: "upstreamsvc Kube_DNS", wantErr: `invalid Service name "Kube_DNS"`},
		{input: "upstreamsvc 1dns", wantErr: `invalid Service name "1dns"`},
		{input: "upstreamsvc kube-dns-upstream -system-", wantErr: `invalid namespace "-system-"`},
		{input: "upstreamsvc {\n port\n}", wantErr: "Wrong argument count"},
		{input: "upstreamsvc {\n port 0\n}", wantErr: `port "0"`},
		{input: "upstreamsvc {\n port 65536\n}", wantErr: `port "65536"`},
		{input: "upstreamsvc {\n port dns\n}", wantErr: `port "dns"`},
		{input: "upstreamsvc {\n port 53 54\n}", wantErr: "Wrong argument count"},
		{input: "upstreamsvc {\n force_tcp\n prefer_udp\n}", wantErr: "mutually exclusive"},
		{input: "upstreamsvc {\n prefer_udp yes\n}", wantErr: "Wrong argument count"},
		{input: "upstreamsvc {\n kubeconfig\n}", wantErr: "Wrong argument count"},
		{input: "upstreamsvc {\n kubeconfig /does/not/exist\n}", wantErr: "loading kubeconfig /does/not/exist"},
		{input: "upstreamsvc {\n fallback\n}", wantErr: "Wrong argument count"},
		{input: "upstreamsvc {\n fallback dns.example.org\n}", wantErr: `"dns.example.org" is not an IP address`},
		{input: "upstreamsvc {\n fallback 0.0.0.0\n}", wantErr: "cannot be forwarded to"},
		{input: "upstreamsvc {\n fallback 10.0.0.1:0\n}", wantErr: "port 0"},
		{input: "upstreamsvc {\n fallback <nil>\n}", wantErr: `"<nil>" is not an IP address`},
		{input: "upstreamsvc {\n max_concurrent 0\n}", wantErr: "max_concurrent"},
		{input: "upstreamsvc {\n max_concurrent many\n}", wantErr: "max_concurrent"},
		{
			input: "upstreamsvc {\n max_attempts 1\n fallback 127.0.0.1\n}",
			want: Config{Service: "kube-dns-upstream", Namespace: "kube-system", Expire: defaultExpire, HealthCheck: defaultHealthCheck, MaxAttempts: 1,
				Fallback: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:53")}},
		},
		{input: "upstreamsvc {\n max_attempts 0\n}", wantErr: `max_attempts "0": want a positive integer`},
		{input: "upstreamsvc {\n max_attempts -1\n}", wantErr: `max_attempts "-1": want a positive integer`},
		{input: "upstreamsvc {\n max_attempts two\n}", wantErr: `max_attempts "two": want a positive integer`},
		{input: "upstreamsvc {\n max_attempts\n}", wantErr: "Wrong argument count"},
		{input: "upstreamsvc {\n max_attempts 2 3\n}", wantErr: "Wrong argument count"},
		{input: "upstreamsvc {\n expire -1s\n}", wantErr: "expire -1s: must be at least 1s"},
		{input: "upstreamsvc {\n expire 0s\n}", wantErr: "expire 0s: must be at least 1s"},
		{input: "upstreamsvc {\n expire 0\n}", wantErr: "expire 0s: must be at least 1s"},
		{input: "upstreamsvc {\n expire 999ms\n}", wantErr: "expire 999ms: must be at least 1s"},
		{input: "upstreamsvc {\n expire\n}", wantErr: "Wrong argument count"},
		{input: "upstreamsvc {\n expire soon\n}", wantErr: "expire: time: invalid duration"},
		{input: "upstreamsvc {\n health_check 0s\n}", wantErr: "health_check 0s: must be at least"},
		{input: "upstreamsvc {\n health_check\n}", wantErr: "Wrong argument count"},
		{input: "upstreamsvc {\n except example.org\n}", wantErr: "unknown property 'except'"},
		{input: "upstreamsvc {\n fallback 127.0.0.1\n}\nupstreamsvc", wantErr: "only be used once"},
		{
			input:   "upstreamsvc",
			wantErr: `no upstream for Service "kube-dns-upstream" in namespace "kube-system": no Kubernetes API (not running in a cluster and no kubeconfig given); environment variable KUBE_DNS_UPSTREAM_SERVICE_HOST is not set; no fallback configured`,
		},
	}
	for i, tc := range tests {
		c := caddy.NewTestController("dns", tc.input)
		err := setup(c)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("test %d (%q): got error %v, want one containing %q", i, tc.input, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("test %d (%q): unexpected error: %v", i, tc.input, err)
			continue
		}
		h, ok := dnsserver.GetConfig(c).Plugin[0](nil).(*UpstreamSvc)
		if !ok {
			t.Errorf("test %d: setup added no *UpstreamSvc", i)
			continue
		}
		if h.Name() != "upstreamsvc" {
			t.Errorf("test %d: handler name %q, want upstreamsvc (not forward)", i, h.Name())
		}
		if !configEqual(h.cfg, tc.want) {
			t.Errorf("test %d (%q): config\n got %+v\nwant %+v", i, tc.input, h.cfg, tc.want)
		}
		if h.initial.source != sourceFallback || len(h.initial.addrs) != len(tc.want.Fallback) {
			t.Errorf("test %d: initial upstream %+v, want the fallback", i, h.initial)
		}
	}
}

func configEqual(a, b Config) bool {
	return a.Service == b.Service && a.Namespace == b.Namespace && a.Port == b.Port && a.PreferUDP == b.PreferUDP &&
		a.Kubeconfig == b.Kubeconfig && slices.Equal(a.Fallback, b.Fallback) && a.MaxConcurrent == b.MaxConcurrent &&
		a.Expire == b.Expire && a.HealthCheck == b.HealthCheck && a.MaxAttempts == b.MaxAttempts
}

// TestSetupEnvironment covers the path taken without API access: the variables Kubernetes injects.
func TestSetupEnvironment(t *testing.T) {
	noClusterAPI(t)
	tests := []struct {
		name    string
		env     map[string]string
		input   string
		want    upstreamSet
		wantErr string
	}{
		{
			name:  "host only",
			env:   map[string]string{"KUBE_DNS_UPSTREAM_SERVICE_HOST": "10.96.0.11"},
			input: "upstreamsvc",
			want:  upstreamSet{addrs: []string{"10.96.0.11:53"}, source: sourceEnv},
		},
		{
			name:  "dns-tcp port variable",
			env:   map[string]string{"KUBE_DNS_UPSTREAM_SERVICE_HOST": "10.96.0.11", "KUBE_DNS_UPSTREAM_SERVICE_PORT_DNS_TCP": "1053"},
			input: "upstreamsvc",
			want:  upstreamSet{addrs: []string{"10.96.0.11:1053"}, source: sourceEnv},
		},
		{
			name:  "Corefile port wins",
			env:   map[string]string{"KUBE_DNS_UPSTREAM_SERVICE_HOST": "10.96.0.11", "KUBE_DNS_UPSTREAM_SERVICE_PORT_DNS_TCP": "1053"},
			input: "upstreamsvc {\n port 5300\n}",
			want:  upstreamSet{addrs: []string{"10.96.0.11:5300"}, source: sourceEnv},
		},
		{
			name:  "IPv6 in brackets",
			env:   map[string]string{"KUBE_DNS_UPSTREAM_SERVICE_HOST": "fd00:10:96::11"},
			input: "upstreamsvc",
			want:  upstreamSet{addrs: []string{"[fd00:10:96::11]:53"}, source: sourceEnv},
		},
		{
			name:  "other Service and namespace",
			env:   map[string]string{"MY_CLUSTER_DNS_SERVICE_HOST": "10.0.0.53"},
			input: "upstreamsvc my-cluster-dns dns",
			want:  upstreamSet{addrs: []string{"10.0.0.53:53"}, source: sourceEnv},
		},
		{
			name:  "environment before fallback",
			env:   map[string]string{"KUBE_DNS_UPSTREAM_SERVICE_HOST": "10.96.0.11"},
			input: "upstreamsvc {\n fallback 127.0.0.1:5301\n}",
			want:  upstreamSet{addrs: []string{"10.96.0.11:53"}, source: sourceEnv},
		},
		{
			name:  "empty variable is unset",
			env:   map[string]string{"KUBE_DNS_UPSTREAM_SERVICE_HOST": " "},
			input: "upstreamsvc {\n fallback 127.0.0.1:5301\n}",
			want:  upstreamSet{addrs: []string{"127.0.0.1:5301"}, source: sourceFallback},
		},
		{
			name:    "the upstream <nil> bug",
			env:     map[string]string{"KUBE_DNS_UPSTREAM_SERVICE_HOST": "<nil>"},
			input:   "upstreamsvc {\n fallback 127.0.0.1:5301\n}",
			wantErr: `environment variable KUBE_DNS_UPSTREAM_SERVICE_HOST: "<nil>" is not an IP address`,
		},
		{
			name:    "bad port variable",
			env:     map[string]string{"KUBE_DNS_UPSTREAM_SERVICE_HOST": "10.96.0.11", "KUBE_DNS_UPSTREAM_SERVICE_PORT_DNS_TCP": "dns"},
			input:   "upstreamsvc",
			wantErr: `KUBE_DNS_UPSTREAM_SERVICE_PORT_DNS_TCP="dns" is not a port`,
		},
		{
			name:    "variable of another Service",
			env:     map[string]string{"KUBE_DNS_SERVICE_HOST": "10.96.0.10"},
			input:   "upstreamsvc",
			wantErr: "environment variable KUBE_DNS_UPSTREAM_SERVICE_HOST is not set",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clearServiceEnv(t)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			c := caddy.NewTestController("dns", tc.input)
			err := setup(c)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			h := dnsserver.GetConfig(c).Plugin[0](nil).(*UpstreamSvc)
			if !slices.Equal(h.initial.addrs, tc.want.addrs) || h.initial.source != tc.want.source {
				t.Errorf("initial upstream %+v, want %+v", h.initial, tc.want)
			}
		})
	}
}
