package upstreamsvc

import (
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// TestSetupFromAPI covers setup's use of the API answer, and what it does when there is none.
func TestSetupFromAPI(t *testing.T) {
	noClusterAPI(t)
	clearServiceEnv(t)

	t.Run("found", func(t *testing.T) {
		api := newFakeAPI(t, "kube-system", "kube-dns-upstream")
		api.setService([]string{"10.96.0.11", "fd00::11"}, 1053)
		h := setupHandler(t, fmt.Sprintf("upstreamsvc {\n kubeconfig %s\n fallback 127.0.0.1:5301\n}", writeKubeconfig(t, api.srv.URL)))
		want := []string{"10.96.0.11:1053", "[fd00::11]:1053"}
		if !slices.Equal(h.initial.addrs, want) || h.initial.source != sourceAPI {
			t.Errorf("initial %+v, want %v from the API", h.initial, want)
		}
	})
	t.Run("not found uses environment", func(t *testing.T) {
		api := newFakeAPI(t, "kube-system", "kube-dns-upstream")
		t.Setenv("KUBE_DNS_UPSTREAM_SERVICE_HOST", "10.96.0.12")
		h := setupHandler(t, fmt.Sprintf("upstreamsvc {\n kubeconfig %s\n}", writeKubeconfig(t, api.srv.URL)))
		if !slices.Equal(h.initial.addrs, []string{"10.96.0.12:53"}) || h.initial.source != sourceEnv {
			t.Errorf("initial %+v, want 10.96.0.12:53 from env", h.initial)
		}
	})
	t.Run("unavailable uses fallback", func(t *testing.T) {
		api := newFakeAPI(t, "kube-system", "kube-dns-upstream")
		api.setUnavailable(true)
		h := setupHandler(t, fmt.Sprintf("upstreamsvc {\n kubeconfig %s\n fallback 127.0.0.1:5301\n}", writeKubeconfig(t, api.srv.URL)))
		if !slices.Equal(h.initial.addrs, []string{"127.0.0.1:5301"}) || h.initial.source != sourceFallback {
			t.Errorf("initial %+v, want the fallback", h.initial)
		}
	})

	errorCases := []struct {
		name    string
		prepare func(*fakeAPI)
		want    string
	}{
		{
			name: "not found and nothing else",
			want: `no upstream for Service "kube-dns-upstream" in namespace "kube-system": the Kubernetes API has no Service kube-system/kube-dns-upstream; environment variable KUBE_DNS_UPSTREAM_SERVICE_HOST is not set; no fallback configured`,
		},
		{
			name:    "unavailable and nothing else",
			prepare: func(api *fakeAPI) { api.setUnavailable(true) },
			want:    `no upstream for Service "kube-dns-upstream" in namespace "kube-system": the Kubernetes API did not answer:`,
		},
		{
			name:    "headless is an error even with a fallback",
			prepare: func(api *fakeAPI) { api.setService([]string{"None"}, 53) },
			want:    "service kube-system/kube-dns-upstream is headless",
		},
	}
	for _, tc := range errorCases {
		t.Run(tc.name, func(t *testing.T) {
			api := newFakeAPI(t, "kube-system", "kube-dns-upstream")
			if tc.prepare != nil {
				tc.prepare(api)
			}
			input := fmt.Sprintf("upstreamsvc {\n kubeconfig %s\n}", writeKubeconfig(t, api.srv.URL))
			if strings.Contains(tc.name, "fallback") {
				input = fmt.Sprintf("upstreamsvc {\n kubeconfig %s\n fallback 127.0.0.1\n}", writeKubeconfig(t, api.srv.URL))
			}
			err := setup(caddy.NewTestController("dns", input))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// counterSum adds up every series of a counter vector.
func counterSum(c prometheus.Collector) float64 {
	ch := make(chan prometheus.Metric, 64)
	go func() { c.Collect(ch); close(ch) }()
	var sum float64
	for m := range ch {
		var pb dto.Metric
		if err := m.Write(&pb); err == nil && pb.Counter != nil {
			sum += pb.Counter.GetValue()
		}
	}
	return sum
}

// infoSeries lists the upstream_info series of one block as "source to".
func infoSeries(zones, service, namespace string) []string {
	ch := make(chan prometheus.Metric, 64)
	go func() { upstreamInfo.Collect(ch); close(ch) }()
	var series []string
	for m := range ch {
		var pb dto.Metric
		if m.Write(&pb) != nil {
			continue
		}
		labels := map[string]string{}
		for _, l := range pb.Label {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["zones"] == zones && labels["service"] == service && labels["namespace"] == namespace && pb.Gauge.GetValue() == 1 {
			series = append(series, labels["source"]+" "+labels["to"])
		}
	}
	slices.Sort(series)
	return series
}

func setupHandler(t *testing.T, input string) *UpstreamSvc {
	t.Helper()
	c := caddy.NewTestController("dns", input)
	if err := setup(c); err != nil {
		t.Fatal(err)
	}
	return dnsserver.GetConfig(c).Plugin[0](nil).(*UpstreamSvc)
}

// queryLoad sends A queries from workers goroutines over UDP until stopped, at most maxQueries in
// total, and keeps count of answers by marker address and of failures.
type queryLoad struct {
	server  string
	stop    chan struct{}
	wg      sync.WaitGroup
	sent    atomic.Int64
	failed  atomic.Int64
	byFirst atomic.Int64 // answered with 192.0.2.1
	bySecnd atomic.Int64 // answered with 192.0.2.2

	mu       sync.Mutex
	failures []string
}

func startLoad(server string, workers int, maxQueries int64) *queryLoad {
	l := &queryLoad{server: server, stop: make(chan struct{})}
	for w := range workers {
		l.wg.Go(func() {
			c := &dns.Client{Net: "udp", Timeout: 3 * time.Second}
			for i := 0; ; i++ {
				select {
				case <-l.stop:
					return
				default:
				}
				if l.sent.Add(1) > maxQueries {
					return
				}
				ip, err := ask(c, server, fmt.Sprintf("q%d-%d.example.org.", w, i))
				switch {
				case err != nil:
					l.failed.Add(1)
					l.mu.Lock()
					l.failures = append(l.failures, err.Error())
					l.mu.Unlock()
				case ip.Equal(net.IPv4(192, 0, 2, 1)):
					l.byFirst.Add(1)
				case ip.Equal(net.IPv4(192, 0, 2, 2)):
					l.bySecnd.Add(1)
				}
			}
		})
	}
	return l
}

func (l *queryLoad) finish() {
	close(l.stop)
	l.wg.Wait()
}

// TestClusterIPChange moves the Service's ClusterIP from 127.0.0.1 to 127.0.0.2 while queries flow
// through CoreDNS and counts the queries that fail during the change.
func TestClusterIPChange(t *testing.T) {
	noClusterAPI(t)
	clearServiceEnv(t)

	for _, oldGoesAway := range []bool{false, true} {
		name := "old address keeps answering"
		if oldGoesAway {
			name = "old address stops answering"
		}
		t.Run(name, func(t *testing.T) {
			first, second, port := upstreamPair(t)
			api := newFakeAPI(t, "kube-system", "kube-dns-upstream")
			api.setService([]string{"127.0.0.1"}, int32(port))
			inst, addr := startCoreDNS(t, fmt.Sprintf(".:0 {\n bind 127.0.0.1\n upstreamsvc {\n kubeconfig %s\n }\n}\n",
				writeKubeconfig(t, api.srv.URL)))
			defer stopCoreDNS(t, inst)
			waitFor(t, waitLimit, "the informer's watch", func() bool { open, _ := api.watches(); return open == 1 })

			load := startLoad(addr, 4, 200000)
			waitFor(t, waitLimit, "answers from 127.0.0.1", func() bool { return load.byFirst.Load() >= 1000 })
			changesBefore := counterSum(upstreamChanges)
			failedBefore := load.failed.Load()
			retriesBefore := counterSum(switchRetries)
			changed := time.Now()
			if oldGoesAway {
				first.Close()
			}
			api.setService([]string{"127.0.0.2"}, int32(port))
			waitFor(t, waitLimit, "answers from 127.0.0.2", func() bool { return load.bySecnd.Load() >= 1000 })
			followed := time.Since(changed)
			load.finish()

			failedDuring := load.failed.Load() - failedBefore
			t.Logf("%d queries, %d answered by 127.0.0.1, %d by 127.0.0.2, %d failed before the change, %d failed during it, "+
				"%.0f retried on the new address (1000 answers from it within %s)",
				load.sent.Load()-4, load.byFirst.Load(), load.bySecnd.Load(), failedBefore, failedDuring,
				counterSum(switchRetries)-retriesBefore, followed.Round(time.Millisecond))
			if failedBefore != 0 {
				t.Errorf("%d queries failed before the change: %v", failedBefore, load.failures)
			}
			if !oldGoesAway && failedDuring != 0 {
				t.Errorf("%d queries failed while the old address still answered: %v", failedDuring, load.failures)
			}

			// Settled: every query goes to the new address, over TCP only.
			c := &dns.Client{Net: "udp", Timeout: 3 * time.Second}
			firstQueries := first.queries()
			for i := range 50 {
				ip, err := ask(c, addr, fmt.Sprintf("after%d.example.org.", i))
				if err != nil || !ip.Equal(net.IPv4(192, 0, 2, 2)) {
					t.Fatalf("after the change: got %v, %v; want 192.0.2.2", ip, err)
				}
			}
			if n := first.queries() - firstQueries; n != 0 {
				t.Errorf("old address got %d queries after the change settled", n)
			}
			if n := counterSum(upstreamChanges) - changesBefore; n != 1 {
				t.Errorf("upstream_changes_total grew by %.0f, want 1", n)
			}
			want := []string{fmt.Sprintf("api 127.0.0.2:%d", port)}
			if got := infoSeries(".", "kube-dns-upstream", "kube-system"); !slices.Equal(got, want) {
				t.Errorf("upstream_info series %v, want %v", got, want)
			}
			if first.byUDP.Load()+second.byUDP.Load() != 0 {
				t.Errorf("upstreams saw %d UDP queries; force_tcp is the default", first.byUDP.Load()+second.byUDP.Load())
			}
		})
	}
}

// TestForceTCP sends queries to CoreDNS over UDP and checks which transport reaches the upstream.
func TestForceTCP(t *testing.T) {
	noClusterAPI(t)
	clearServiceEnv(t)
	for _, tc := range []struct {
		option         string
		wantTCP, wantU int64
	}{
		{option: "", wantTCP: 20},
		{option: "force_tcp", wantTCP: 20},
		{option: "prefer_udp", wantU: 20},
	} {
		t.Run("option="+tc.option, func(t *testing.T) {
			up, err := listenUpstream("127.0.0.1", 0, net.IPv4(192, 0, 2, 1))
			if err != nil {
				t.Fatal(err)
			}
			defer up.Close()
			inst, addr := startCoreDNS(t, fmt.Sprintf(".:0 {\n bind 127.0.0.1\n upstreamsvc {\n %s\n fallback %s\n }\n}\n",
				tc.option, up.tcp.Listener.Addr()))
			defer stopCoreDNS(t, inst)
			c := &dns.Client{Net: "udp", Timeout: 3 * time.Second}
			for i := range 20 {
				if _, err := ask(c, addr, fmt.Sprintf("t%d.example.org.", i)); err != nil {
					t.Fatal(err)
				}
			}
			if up.byTCP.Load() != tc.wantTCP || up.byUDP.Load() != tc.wantU {
				t.Errorf("upstream saw %d TCP and %d UDP queries, want %d and %d", up.byTCP.Load(), up.byUDP.Load(), tc.wantTCP, tc.wantU)
			}
		})
	}
}

// TestAPIComesBack starts while the API does not answer, forwards to the environment's address, and
// switches to the API's once the API answers.
func TestAPIComesBack(t *testing.T) {
	noClusterAPI(t)
	clearServiceEnv(t)
	_, _, port := upstreamPair(t)
	t.Setenv("KUBE_DNS_UPSTREAM_SERVICE_HOST", "127.0.0.1")
	t.Setenv("KUBE_DNS_UPSTREAM_SERVICE_PORT_DNS_TCP", fmt.Sprint(port))
	api := newFakeAPI(t, "kube-system", "kube-dns-upstream")
	api.setService([]string{"127.0.0.2"}, int32(port))
	api.setUnavailable(true)

	inst, addr := startCoreDNS(t, fmt.Sprintf(".:0 {\n bind 127.0.0.1\n upstreamsvc {\n kubeconfig %s\n }\n}\n",
		writeKubeconfig(t, api.srv.URL)))
	defer stopCoreDNS(t, inst)
	c := &dns.Client{Net: "udp", Timeout: 3 * time.Second}
	if ip, err := ask(c, addr, "before.example.org."); err != nil || !ip.Equal(net.IPv4(192, 0, 2, 1)) {
		t.Fatalf("while the API is down: got %v, %v; want 192.0.2.1 from the environment", ip, err)
	}
	api.setUnavailable(false)
	waitFor(t, waitLimit, "the switch to the API's ClusterIP", func() bool {
		ip, err := ask(c, addr, "after.example.org.")
		return err == nil && ip.Equal(net.IPv4(192, 0, 2, 2))
	})
}

// TestServiceDeletedAndRecreated follows a Service that is deleted (the plugin keeps its address)
// and recreated with a new ClusterIP.
func TestServiceDeletedAndRecreated(t *testing.T) {
	noClusterAPI(t)
	clearServiceEnv(t)
	_, _, port := upstreamPair(t)
	api := newFakeAPI(t, "kube-system", "kube-dns-upstream")
	api.setService([]string{"127.0.0.1"}, int32(port))
	inst, addr := startCoreDNS(t, fmt.Sprintf(".:0 {\n bind 127.0.0.1\n upstreamsvc {\n kubeconfig %s\n }\n}\n",
		writeKubeconfig(t, api.srv.URL)))
	defer stopCoreDNS(t, inst)
	waitFor(t, waitLimit, "the informer's watch", func() bool { open, _ := api.watches(); return open == 1 })

	c := &dns.Client{Net: "udp", Timeout: 3 * time.Second}
	logged := captureLog(t)
	api.deleteService()
	// The plugin has seen the deletion once it says what it keeps; only then is "nothing changed" evidence.
	waitFor(t, waitLimit, "the plugin to log the deletion", func() bool {
		return strings.Contains(logged.String(), "was deleted; keeping 127.0.0.1:")
	})
	if ip, err := ask(c, addr, "deleted.example.org."); err != nil || !ip.Equal(net.IPv4(192, 0, 2, 1)) {
		t.Fatalf("after deletion: got %v, %v; want the last address, 192.0.2.1", ip, err)
	}
	api.setService([]string{"127.0.0.2"}, int32(port))
	waitFor(t, waitLimit, "the recreated Service's ClusterIP", func() bool {
		ip, err := ask(c, addr, "recreated.example.org.")
		return err == nil && ip.Equal(net.IPv4(192, 0, 2, 2))
	})
}

// TestReloadLeavesNothingBehind reloads a Corefile with two blocks naming the same Service and checks
// that there is one watch at a time and that goroutines do not pile up.
func TestReloadLeavesNothingBehind(t *testing.T) {
	noClusterAPI(t)
	clearServiceEnv(t)
	_, _, port := upstreamPair(t)
	api := newFakeAPI(t, "kube-system", "kube-dns-upstream")
	api.setService([]string{"127.0.0.1"}, int32(port))
	kubeconfig := writeKubeconfig(t, api.srv.URL)
	corefile := fmt.Sprintf("cluster.local:0 in-addr.arpa:0 {\n bind 127.0.0.1\n upstreamsvc {\n kubeconfig %s\n }\n}\n"+
		".:0 {\n bind 127.0.0.1\n upstreamsvc {\n kubeconfig %s\n }\n}\n", kubeconfig, kubeconfig)

	baseline := settledGoroutines(0, 5*time.Second)
	inst, addr := startCoreDNS(t, corefile)
	waitFor(t, waitLimit, "one watch", func() bool { open, _ := api.watches(); return open == 1 })
	c := &dns.Client{Net: "udp", Timeout: 3 * time.Second}
	if _, err := ask(c, addr, "x.example.org."); err != nil {
		t.Fatal(err)
	}
	running := settledGoroutines(0, time.Second)

	for i := range 3 {
		next, err := inst.Restart(caddy.CaddyfileInput{Contents: []byte(corefile), ServerTypeName: "dns"})
		if err != nil {
			t.Fatalf("reload %d: %v", i, err)
		}
		inst = next
		addr = udpAddr(t, inst)
		if _, err := ask(c, addr, fmt.Sprintf("reload%d.example.org.", i)); err != nil {
			t.Fatalf("after reload %d: %v", i, err)
		}
		waitFor(t, waitLimit, "one open watch after reload", func() bool { open, _ := api.watches(); return open == 1 })
		if n := settledGoroutines(running, waitLimit); n > running {
			t.Errorf("after reload %d: %d plugin goroutines, %d before the first reload", i, n, running)
		}
	}
	_, seen := api.watches()
	if seen != 4 {
		t.Errorf("%d watches opened for 4 loads of two blocks, want 4 (one per load)", seen)
	}

	stopCoreDNS(t, inst)
	waitFor(t, waitLimit, "the watch to close", func() bool { open, _ := api.watches(); return open == 0 })
	if n := settledGoroutines(baseline, waitLimit); n != baseline {
		t.Errorf("%d plugin goroutines after shutdown, %d before start", n, baseline)
	}
	t.Logf("plugin goroutines: %d before start, %d running, %d after shutdown", baseline, running, settledGoroutines(baseline, 0))
}
