package wirecache

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/coredns/coredns/plugin/metrics"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// coreFamilies are CoreDNS's per-query series, with the labels a wirecache hit must fill as the prometheus
// plugin would. responses_total's plugin label names the plugin that wrote the reply (cache or wirecache), so
// it is summed over.
var coreFamilies = []string{
	"coredns_dns_requests_total",
	"coredns_dns_responses_total",
	"coredns_dns_do_requests_total",
	"coredns_dns_request_duration_seconds",
	"coredns_dns_request_size_bytes",
	"coredns_dns_response_size_bytes",
}

// coreSamples returns the samples of coreFamilies for the server listening on port, keyed by family and
// labels (server and plugin left out); histograms give their count and, but for durations, their sum.
func coreSamples(t *testing.T, port int) map[string]float64 {
	t.Helper()
	families, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	suffix := fmt.Sprintf(":%d", port)
	out := map[string]float64{}
	for _, f := range families {
		if !slices.Contains(coreFamilies, f.GetName()) {
			continue
		}
		for _, m := range f.GetMetric() {
			var labels []string
			ours := false
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "server":
					ours = strings.HasSuffix(l.GetValue(), suffix)
				case "plugin":
				default:
					labels = append(labels, l.GetName()+"="+l.GetValue())
				}
			}
			if !ours {
				continue
			}
			sort.Strings(labels)
			key := f.GetName() + "{" + strings.Join(labels, ",") + "}"
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				out[key] += m.GetCounter().GetValue()
			case dto.MetricType_HISTOGRAM:
				out[key+" count"] += float64(m.GetHistogram().GetSampleCount())
				if f.GetName() != "coredns_dns_request_duration_seconds" {
					out[key+" sum"] += m.GetHistogram().GetSampleSum()
				}
			}
		}
	}
	return out
}

// coreSamplesSince returns coreSamples for port less base, what was counted before for a server on that port
// (the series are the process's, and an earlier test may have had a server on the same port); series that
// did not move since are left out.
func coreSamplesSince(t *testing.T, port int, base map[string]float64) map[string]float64 {
	t.Helper()
	out := coreSamples(t, port)
	for k, v := range out {
		if v -= base[k]; v == 0 {
			delete(out, k)
		} else {
			out[k] = v
		}
	}
	return out
}

// TestHitsCountedInCoreDNSSeries sends the same queries to a server block with wirecache and to the same
// block without it, and requires CoreDNS's own per-query series (requests, responses, DO requests, request
// durations and sizes) to hold the same counts for both: a hit, which never reaches the prometheus plugin,
// is counted as that plugin counts a query.
func TestHitsCountedInCoreDNSSeries(t *testing.T) {
	zoneFile := filepath.Join(t.TempDir(), "example.org.db")
	if err := os.WriteFile(zoneFile, []byte(differentialZone+"caa 300 IN CAA 0 issue \"ca.example.net\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	upstream, with, without := freePort(t), freePort(t), freePort(t)
	startCoreDNS(t, fmt.Sprintf("example.org:%d {\n bind 127.0.0.1\n file %s\n}\n", upstream, zoneFile))
	block := func(port int, extra string) string {
		// Two zones, so the zone label is exercised: www.example.org and the rest (".").
		return fmt.Sprintf("www.example.org:%d .:%d {\n bind 127.0.0.1\n %s\n prometheus 127.0.0.1:%d\n errors\n cache\n forward . 127.0.0.1:%d\n}\n",
			port, port, extra, freePort(t), upstream)
	}
	startCoreDNS(t, block(with, "wirecache"))
	startCoreDNS(t, block(without, ""))
	withBase, withoutBase := coreSamples(t, with), coreSamples(t, without)
	// UDP hits are answered and counted by the fast path: the counts below check its counting too.
	withAddr := fmt.Sprintf("127.0.0.1:%d", with)
	waitFastPathSteered(t, "dns://"+withAddr, withAddr)
	// The query that started it, to the other server too, so that both count the same queries: sent+1.
	exchange(t, newQuery("start.fastpath.invalid.", dns.TypeA, 0, false), fmt.Sprintf("127.0.0.1:%d", without), false)
	fastBefore := counterValue(t, fastPathQueries, "dns://"+withAddr)

	type question struct {
		name  string
		qtype uint16
	}
	questions := []question{
		{"www.example.org.", dns.TypeA}, {"WWW.example.org.", dns.TypeA}, {"www.example.org.", dns.TypeAAAA},
		{"mail.example.org.", dns.TypeMX}, {"nope.example.org.", dns.TypeA}, {"www.example.org.", dns.TypeMX},
		{"caa.example.org.", dns.TypeCAA}, // counted as type "other"
		{"example.org.", dns.TypeSOA},
	}
	sent := 0
	hitsBefore := sumCounter(hitsTotal)
	for round := range 3 {
		for _, qu := range questions {
			for _, tcp := range []bool{false, true} {
				for _, size := range []uint16{0, 1232} {
					for _, do := range []bool{false, true} {
						if size == 0 && do {
							continue
						}
						q := newQuery(qu.name, qu.qtype, size, do)
						q.Id = uint16(round<<8 | sent&0xff)
						for _, port := range []int{with, without} {
							exchange(t, q, fmt.Sprintf("127.0.0.1:%d", port), tcp)
						}
						sent++
					}
				}
			}
		}
	}
	if hits := sumCounter(hitsTotal) - hitsBefore; hits < float64(sent)/2 {
		t.Fatalf("%v of %d queries were wirecache hits, want at least half", hits, sent)
	}
	if fast := counterValue(t, fastPathQueries, "dns://"+withAddr) - fastBefore; fast < float64(sent)/2 {
		t.Fatalf("the fast path read %v of the %d UDP queries", fast, sent/2)
	}

	// The prometheus plugin counts a query once the chain has written its reply, so its counts can trail the
	// replies the client read: wait until both servers have counted every query.
	requests := func(s map[string]float64) float64 {
		n := 0.0
		for k, v := range s {
			if strings.HasPrefix(k, "coredns_dns_requests_total{") {
				n += v
			}
		}
		return n
	}
	deadline := time.Now().Add(30 * time.Second)
	var got, want map[string]float64
	for {
		got, want = coreSamplesSince(t, with, withBase), coreSamplesSince(t, without, withoutBase)
		if requests(got) == float64(sent+1) && requests(want) == float64(sent+1) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("requests counted: %v with wirecache, %v without, want %d each", requests(got), requests(want), sent+1)
		}
		time.Sleep(10 * time.Millisecond)
	}
	var keys []string
	for k := range want {
		keys = append(keys, k)
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		if got[k] != want[k] {
			t.Errorf("%s = %v with wirecache, %v without", k, got[k], want[k])
		}
	}
	for _, k := range []string{`type=other`, `zone=.`, `proto=tcp`, `rcode=NXDOMAIN`} {
		if !slices.ContainsFunc(keys, func(s string) bool { return strings.Contains(s, k) }) {
			t.Errorf("no series with %s among\n%s", k, strings.Join(keys, "\n"))
		}
	}
}

// TestBlockMetricsZones checks when hits are counted in CoreDNS's series: only when the block has a
// prometheus plugin and it runs after wirecache (before it, it counts hits itself).
func TestBlockMetricsZones(t *testing.T) {
	if zones := blockMetricsZones(compiledConfig(t, named(pluginName), named("forward")), []string{pluginName, metricsPlugin}); zones != nil {
		t.Errorf("block without prometheus: zones %v, want none", zones)
	}
	m := metrics.New("127.0.0.1:0")
	m.AddZone("example.org.")
	cfg := compiledConfig(t, named(pluginName), m, named("forward"))
	if zones := blockMetricsZones(cfg, []string{pluginName, metricsPlugin}); !slices.Equal(zones, []string{"example.org."}) {
		t.Errorf("prometheus after wirecache: zones %v, want [example.org.]", zones)
	}
	if zones := blockMetricsZones(cfg, []string{metricsPlugin, pluginName}); zones != nil {
		t.Errorf("prometheus ahead of wirecache: zones %v, want none", zones)
	}
}

func TestMetricsZone(t *testing.T) {
	zones := []string{"example.org.", "www.example.org."}
	for name, want := range map[string]int{"a.example.org.": 0, "WWW.Example.org.": 1, "x.www.example.org.": 1, "example.net.": 2} {
		if got := metricsZone(zones, name); got != want {
			t.Errorf("metricsZone(%v, %s) = %d, want %d", zones, name, got, want)
		}
	}
}
