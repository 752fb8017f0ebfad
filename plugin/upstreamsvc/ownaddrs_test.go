package upstreamsvc

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
)

// setupListening runs setup in a server block that listens on hosts (bind's result; "" is every
// address) at port over transport.
func setupListening(t *testing.T, input, transport, port string, hosts ...string) (*UpstreamSvc, error) {
	t.Helper()
	c := caddy.NewTestController("dns", input)
	cfg := dnsserver.GetConfig(c)
	cfg.Transport, cfg.Port, cfg.ListenHosts = transport, port, hosts
	if err := setup(c); err != nil {
		return nil, err
	}
	return dnsserver.GetConfig(c).Plugin[0](nil).(*UpstreamSvc), nil
}

// TestSetupRefusesOwnAddress is the drop-in's `-upstreamsvc kube-dns` in iptables mode: the cache
// binds the kube-dns ClusterIP, so forwarding to that Service forwards to itself.
func TestSetupRefusesOwnAddress(t *testing.T) {
	noClusterAPI(t)
	const refused = "where this server listens"
	tests := []struct {
		name      string
		env       map[string]string
		input     string
		transport string
		port      string
		hosts     []string
		wantErr   string // "" means setup succeeds
	}{
		{
			name:    "kube-dns from the environment is the bound ClusterIP",
			env:     map[string]string{"KUBE_DNS_SERVICE_HOST": "10.96.0.10"},
			input:   "upstreamsvc kube-dns",
			port:    "53",
			hosts:   []string{"169.254.20.10", "10.96.0.10"},
			wantErr: "the address in environment variable KUBE_DNS_SERVICE_HOST is 10.96.0.10:53, where this server listens (169.254.20.10 10.96.0.10 port 53)",
		},
		{
			name:  "kube-dns-upstream from the environment",
			env:   map[string]string{"KUBE_DNS_UPSTREAM_SERVICE_HOST": "10.96.0.11"},
			input: "upstreamsvc",
			port:  "53",
			hosts: []string{"169.254.20.10", "10.96.0.10"},
		},
		{
			name:    "the link-local address as fallback",
			input:   "upstreamsvc {\n fallback 10.0.0.53 169.254.20.10\n}",
			port:    "53",
			hosts:   []string{"169.254.20.10", "10.96.0.10"},
			wantErr: "the fallback address is 169.254.20.10:53, " + refused,
		},
		{
			name:    "IPv6 bind",
			input:   "upstreamsvc {\n fallback [fd00:10:96::a]:53\n}",
			port:    "53",
			hosts:   []string{"fd00:10:96::a"},
			wantErr: "the fallback address is [fd00:10:96::a]:53, " + refused,
		},
		{
			name:  "same address, another port",
			input: "upstreamsvc {\n fallback 127.0.0.1:5301\n}",
			port:  "5300",
			hosts: []string{"127.0.0.1"},
		},
		{
			name:    "every address includes loopback",
			input:   "upstreamsvc {\n fallback 127.0.0.53\n}",
			port:    "53",
			hosts:   []string{""},
			wantErr: "the fallback address is 127.0.0.53:53, where this server listens (every address port 53)",
		},
		{
			name:    "0.0.0.0 includes loopback",
			input:   "upstreamsvc {\n fallback ::1\n}",
			port:    "53",
			hosts:   []string{"0.0.0.0"},
			wantErr: "the fallback address is [::1]:53, " + refused,
		},
		{
			name:  "every address but not a ClusterIP on kube-ipvs0",
			input: "upstreamsvc {\n fallback 10.96.0.11\n}",
			port:  "53",
			hosts: []string{""},
		},
		{
			name:      "a TLS server is not where plain DNS lands",
			input:     "upstreamsvc {\n fallback 127.0.0.1:853\n}",
			transport: "tls",
			port:      "853",
			hosts:     []string{"127.0.0.1"},
		},
		{
			name:  "port chosen by the kernel",
			input: "upstreamsvc {\n fallback 127.0.0.1:53\n}",
			port:  "0",
			hosts: []string{"127.0.0.1"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clearServiceEnv(t)
			t.Setenv("KUBE_DNS_SERVICE_HOST", "")
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			transport := tc.transport
			if transport == "" {
				transport = "dns"
			}
			_, err := setupListening(t, tc.input, transport, tc.port, tc.hosts...)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("got error %v, want one containing %q", err, tc.wantErr)
			}
			if !strings.Contains(err.Error(), "kube-dns-upstream") {
				t.Errorf("error %q does not say which Service to use instead", err)
			}
		})
	}
}

// TestSetupRefusesOwnClusterIPFromAPI: the API's answer is checked the same way.
func TestSetupRefusesOwnClusterIPFromAPI(t *testing.T) {
	noClusterAPI(t)
	clearServiceEnv(t)
	api := newFakeAPI(t, "kube-system", "kube-dns")
	api.setService([]string{"10.96.0.10"}, 53)
	_, err := setupListening(t, fmt.Sprintf("upstreamsvc kube-dns {\n kubeconfig %s\n}", writeKubeconfig(t, api.srv.URL)),
		"dns", "53", "169.254.20.10", "10.96.0.10")
	want := "the ClusterIP of Service kube-system/kube-dns is 10.96.0.10:53, where this server listens"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("got error %v, want one containing %q", err, want)
	}
}

// TestFollowRefusesOwnAddress moves the Service onto an address the block listens on: the plugin
// keeps forwarding where it did, and takes the next usable address.
func TestFollowRefusesOwnAddress(t *testing.T) {
	noClusterAPI(t)
	clearServiceEnv(t)
	u, err := setupListening(t, "upstreamsvc {\n fallback 10.96.0.11\n}", "dns", "53", "169.254.20.10", "10.96.0.10")
	if err != nil {
		t.Fatal(err)
	}
	if err := u.OnStartup(); err != nil {
		t.Fatal(err)
	}
	defer u.OnShutdown()

	view := func(ips ...string) serviceView {
		v := serviceView{exists: true, port: 53}
		for _, s := range ips {
			v.ips = append(v.ips, netip.MustParseAddr(s))
		}
		return v
	}
	active := func() []string {
		u.mu.Lock()
		defer u.mu.Unlock()
		return slices.Clone(u.active.addrs)
	}
	u.follow(view("10.96.0.12"))
	if got := active(); !slices.Equal(got, []string{"10.96.0.12:53"}) {
		t.Fatalf("after a usable move: forwarding to %v, want 10.96.0.12:53", got)
	}
	changes := counterSum(upstreamChanges)
	u.follow(view("10.96.0.10"))
	u.follow(view("fd00::12", "169.254.20.10"))
	if got := active(); !slices.Equal(got, []string{"10.96.0.12:53"}) {
		t.Errorf("after moves onto our own addresses: forwarding to %v, want 10.96.0.12:53 kept", got)
	}
	if n := counterSum(upstreamChanges) - changes; n != 0 {
		t.Errorf("upstream_changes_total grew by %.0f for refused moves", n)
	}
	u.follow(view("10.96.0.13"))
	if got := active(); !slices.Equal(got, []string{"10.96.0.13:53"}) {
		t.Errorf("after the next usable move: forwarding to %v, want 10.96.0.13:53", got)
	}
}
