//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// clusterDNSOnLoopback serves the cluster name over TCP on a loopback port and returns its address.
func clusterDNSOnLoopback(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{Listener: l, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		rr, _ := dns.NewRR(r.Question[0].Name + " 30 IN A 10.96.0.1")
		m.Answer = append(m.Answer, rr)
		_ = w.WriteMsg(m)
	})}
	go func() { _ = srv.ActivateAndServe() }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return l.Addr().String()
}

// closedLoopbackPort returns a loopback address nothing listens on: connections are refused.
func closedLoopbackPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// cacheMetricsServer serves the cache's metrics naming upstream as where it forwards.
func cacheMetricsServer(t *testing.T, upstream string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, `# TYPE coredns_upstreamsvc_upstream_info gauge
coredns_upstreamsvc_upstream_info{namespace="kube-system",service="kube-dns-upstream",source="api",to=%[1]q,zones="cluster.local."} 1
coredns_upstreamsvc_upstream_info{namespace="kube-system",service="kube-dns-upstream",source="api",to=%[1]q,zones="in-addr.arpa."} 1
# TYPE coredns_upstreamsvc_failfast_total counter
coredns_upstreamsvc_failfast_total{server="dns://169.254.20.10:53",zones="cluster.local."} 7
# TYPE coredns_proxy_healthcheck_failures_total counter
coredns_proxy_healthcheck_failures_total{proxy_name="upstreamsvc",to=%[1]q} 12
coredns_proxy_healthcheck_failures_total{proxy_name="forward",to="192.0.2.53:53"} 5
`, upstream)
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/metrics"
}

var (
	cacheIP  = netip.MustParseAddr("169.254.20.10")
	kubeDNS  = netip.MustParseAddr("10.96.0.10")
	noEnv    = func(string) (string, bool) { return "", false }
	clusterA = "kubernetes.default.svc.cluster.local"
)

// newTestVerifier returns a verifier whose answers so far are: on cacheIP, the cluster name SERVFAIL and an
// external name answered; on kubeDNS, the cluster name timed out and nothing else answered.
func newTestVerifier(metricsURL string, lookupEnv func(string) (string, bool)) *verifier {
	v := &verifier{listen: []netip.Addr{cacheIP, kubeDNS}, name: clusterA, timeout: 2 * time.Second,
		metricsURL: metricsURL, upstreamService: defaultVerifyUpstreamSvc, lookupEnv: lookupEnv,
		answeredOn: map[netip.Addr]bool{cacheIP: true}}
	v.addViaUpstream(cacheIP, cacheIP.String()+" "+clusterA+" A/udp", false, "SERVFAIL with 0 answers, want an address")
	v.add("answer", cacheIP.String()+" kubernetes.io. A", true, "external: 192.0.2.80")
	v.addViaUpstream(kubeDNS, kubeDNS.String()+" "+clusterA+" A/udp", false, "i/o timeout")
	return v
}

// TestCheckUpstream checks that failed answers for cluster names are put on the upstream only when it does
// not answer and the cache answers on that address, and that the exit status tells the two apart.
func TestCheckUpstream(t *testing.T) {
	up, down := clusterDNSOnLoopback(t), closedLoopbackPort(t)
	tests := []struct {
		name       string
		metrics    string
		env        func(string) (string, bool)
		upstream   string // the upstream row: target and result
		upstreamOK bool
		results    []string // RESULT of the three answer rows
		detail     string   // in the upstream row
		wantErr    error
	}{
		{name: "upstream down, from the metrics", metrics: cacheMetricsServer(t, down),
			upstream: "kube-system/kube-dns-upstream at " + down, results: []string{"UPSTREAM", "ok", "FAIL"},
			detail: "coredns_upstreamsvc_failfast_total 7 ", wantErr: errVerifyFailed},
		{name: "upstream answers, the cache fails", metrics: cacheMetricsServer(t, up),
			upstream: "kube-system/kube-dns-upstream at " + up, upstreamOK: true, results: []string{"FAIL", "ok", "FAIL"},
			detail: "10.96.0.1 (address from the cache's metrics, source api)", wantErr: errVerifyFailed},
		{name: "upstream down, from the environment", metrics: closedLoopbackPort(t),
			env: func(k string) (string, bool) {
				h, p, _ := net.SplitHostPort(down)
				return map[string]string{"KUBE_DNS_UPSTREAM_SERVICE_HOST": h, "KUBE_DNS_UPSTREAM_SERVICE_PORT_DNS_TCP": p}[k], true
			},
			upstream: "kube-dns-upstream at " + down, results: []string{"UPSTREAM", "ok", "FAIL"},
			detail: "address from KUBE_DNS_UPSTREAM_SERVICE_HOST", wantErr: errVerifyFailed},
		{name: "the environment names the cache itself", metrics: closedLoopbackPort(t),
			env: func(k string) (string, bool) {
				return map[string]string{"KUBE_DNS_UPSTREAM_SERVICE_HOST": "10.96.0.10"}[k], true
			},
			upstream: "kube-dns-upstream", results: []string{"FAIL", "ok", "FAIL"},
			detail: "an address of the cache itself", wantErr: errVerifyFailed},
		{name: "address unknown", metrics: "", env: noEnv,
			upstream: "kube-dns-upstream", results: []string{"FAIL", "ok", "FAIL"},
			detail: "cannot tell whether the cluster DNS or the cache fails", wantErr: errVerifyFailed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			metricsURL := tc.metrics
			if metricsURL != "" && !strings.HasPrefix(metricsURL, "http") {
				metricsURL = "http://" + metricsURL + "/metrics"
			}
			env := tc.env
			if env == nil {
				env = noEnv
			}
			v := newTestVerifier(metricsURL, env)
			v.checkUpstream(context.Background())
			var table strings.Builder
			err := printResults(&table, v.results)
			t.Logf("\n%s", table.String())
			rows := tableRows(table.String())
			if len(rows) != 4 {
				t.Fatalf("%d rows, want 4", len(rows))
			}
			for i, want := range tc.results {
				if rows[i].result != want {
					t.Errorf("row %s %s: %s, want %s", rows[i].check, rows[i].target, rows[i].result, want)
				}
			}
			wantUp := "FAIL"
			if tc.upstreamOK {
				wantUp = "ok"
			}
			if r := rows[3]; r.check != upstreamCheck || r.target != tc.upstream || r.result != wantUp {
				t.Errorf("upstream row %+v, want %s %s", r, tc.upstream, wantUp)
			}
			if !strings.Contains(v.results[3].detail, tc.detail) {
				t.Errorf("upstream row detail %q does not say %q", v.results[3].detail, tc.detail)
			}
			if !errors.Is(err, tc.wantErr) {
				t.Errorf("printResults: %v, want %v", err, tc.wantErr)
			}
		})
	}
}

// TestPrintResultsUpstreamOnly checks the exit error and the summary when only the upstream fails.
func TestPrintResultsUpstreamOnly(t *testing.T) {
	down := closedLoopbackPort(t)
	v := newTestVerifier(cacheMetricsServer(t, down), noEnv)
	v.answeredOn[kubeDNS] = true // the cache answers on both addresses
	v.checkUpstream(context.Background())
	var table strings.Builder
	err := printResults(&table, v.results)
	if !errors.Is(err, errUpstreamUnreachable) {
		t.Errorf("printResults: %v, want %v", err, errUpstreamUnreachable)
	}
	want := "1 of 4 checks failed and 2 are UPSTREAM, all because the cluster DNS upstream kube-system/kube-dns-upstream at " +
		down + " does not answer this node; the node cache's own checks passed\n"
	if !strings.HasSuffix(table.String(), want) {
		t.Errorf("summary:\n%s\nwant it to end with %q", table.String(), want)
	}

	var healthy strings.Builder
	if err := printResults(&healthy, []verifyResult{{check: "link", target: "nodelocaldns", ok: true}}); err != nil {
		t.Errorf("printResults on a passing table: %v", err)
	}
}

func TestCacheMetricsAddress(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		path := dir + "/" + name
		writeFile(t, path, []byte(text))
		return path
	}
	beside := write("beside", `.:53 {
    prometheus 192.0.2.9:9253
    forward . /etc/resolv.conf
}
cluster.local:53 {
    prometheus 10.0.0.5:9253
    upstreamsvc kube-dns-upstream
}
`)
	allAddrs := write("all", "cluster.local:53 {\n    prometheus :9300\n    upstreamsvc\n}\n")
	other := write("other", ".:53 {\n    prometheus 192.0.2.9:9253\n    forward . /etc/resolv.conf\n}\n")
	listen := []netip.Addr{cacheIP, kubeDNS}
	tests := []struct {
		flag, conf string
		listen     []netip.Addr
		want       string
	}{
		{flag: "10.0.0.7:9253", conf: beside, listen: listen, want: "10.0.0.7:9253"},
		{conf: beside, listen: listen, want: "10.0.0.5:9253"},
		{conf: allAddrs, listen: listen, want: "169.254.20.10:9300"},
		{conf: other, listen: listen, want: "192.0.2.9:9253"},
		{conf: dir + "/missing", listen: listen, want: "169.254.20.10:9253"},
		{conf: dir + "/missing", want: ""},
	}
	for _, tc := range tests {
		if got := cacheMetricsAddress(tc.flag, tc.conf, tc.listen); got != tc.want {
			t.Errorf("cacheMetricsAddress(%q, %s, %v) = %q, want %q", tc.flag, tc.conf, tc.listen, got, tc.want)
		}
	}
}
