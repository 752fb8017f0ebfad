package wirecache

import (
	"context"
	"strings"
	"sync/atomic"

	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin"

	"github.com/nodelocaldns/nodelocaldns/plugin/internal/series"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

var (
	hitsTotal = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: pluginName,
		Name:      "hits_total",
		Help:      "Counter of queries answered from wirecache, without the plugins after it.",
	}, []string{"server"})
	missesTotal = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: pluginName,
		Name:      "misses_total",
		Help:      "Counter of queries in wirecache's zones that it passed to the plugins after it.",
	}, []string{"server"})
	servedStaleTotal = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: pluginName,
		Name:      "served_stale_total",
		Help:      "Counter of queries answered from an expired wirecache entry because the plugins after it failed.",
	}, []string{"server"})
	fastPathQueries = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: pluginName,
		Name:      "fastpath_datagrams_total",
		Help:      "Counter of UDP datagrams wirecache's fast path read, hits and queries it passed to CoreDNS's server alike.",
	}, []string{"server"})
	fastPathPassed = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: pluginName,
		Name:      "fastpath_passed_total",
		Help:      "Counter of UDP datagrams wirecache's fast path passed to CoreDNS's server because it could not answer them.",
	}, []string{"server"})
	fastPathSteered = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: plugin.Namespace,
		Subsystem: pluginName,
		Name:      "fastpath_steered",
		Help:      "The wirecache fast paths the server's UDP queries are steered to: 1, or 0 when none is (2 briefly, while a reload hands over).",
	}, []string{"server"})
	tcpSteered = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: plugin.Namespace,
		Subsystem: pluginName,
		Name:      "tcp_steered",
		Help:      "The wirecache TCP listeners the server's new TCP connections are steered to: 1, or 0 when none is and CoreDNS's own listener accepts them, with no bound.",
	}, []string{"server"})
	tcpConnections = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: plugin.Namespace,
		Subsystem: pluginName,
		Name:      "tcp_connections",
		Help:      "The TCP connections wirecache's TCP listener holds open.",
	}, []string{"server"})
	tcpRefused = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: pluginName,
		Name:      "tcp_refused_total",
		Help:      "Counter of TCP connections wirecache's TCP listener reset at once, by the bound they met: total (tcp_connections MAX) or client (PER_CLIENT).",
	}, []string{"server", "reason"})
	entriesGauge = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: plugin.Namespace,
		Subsystem: pluginName,
		Name:      "entries",
		Help:      "The number of answers wirecache holds.",
	}, []string{"server"})
	bytesGauge = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: plugin.Namespace,
		Subsystem: pluginName,
		Name:      "bytes",
		Help:      "The memory wirecache's answers hold, in bytes, as counted against max_memory.",
	}, []string{"server"})
)

// serverMetrics are one server's metrics, resolved from their label once.
type serverMetrics struct {
	addr        string
	hits        prometheus.Counter
	misses      prometheus.Counter
	servedStale prometheus.Counter
	entries     prometheus.Gauge
	bytes       prometheus.Gauge
	// core counts hits in CoreDNS's own series; nil when the block's prometheus plugin sees every query or
	// there is none.
	core *coreSeries
	// fastNoticed is set once the block's fast paths know of the server.
	fastNoticed atomic.Bool
	// udpAside is set when wirecache must pass the server's UDP queries on (serverStepAsideReasons).
	udpAside bool
}

// held publishes what s holds.
func (m *serverMetrics) held(s *store) {
	m.entries.Set(float64(s.len()))
	m.bytes.Set(float64(s.size()))
}

// serverMetricsSet finds a server's metrics without a label lookup.
type serverMetricsSet struct {
	byServer series.PerServer[*serverMetrics]
}

// forServer returns the metrics of the server handling ctx's query; metricsZones are the block's prometheus
// zones when hits must be counted in CoreDNS's own series (see coreSeries), nil otherwise.
func (s *serverMetricsSet) forServer(ctx context.Context, metricsZones []string) *serverMetrics {
	srv, _ := ctx.Value(dnsserver.Key{}).(*dnsserver.Server)
	return s.of(srv, metricsZones)
}

// of returns the metrics of srv, which may be nil (a query with no server, in tests).
func (s *serverMetricsSet) of(srv *dnsserver.Server, metricsZones []string) *serverMetrics {
	addr := ""
	if srv != nil {
		addr = srv.Addr
	}
	return s.byServer.Get(addr, func() *serverMetrics {
		m := &serverMetrics{
			addr:        addr,
			hits:        hitsTotal.WithLabelValues(addr),
			misses:      missesTotal.WithLabelValues(addr),
			servedStale: servedStaleTotal.WithLabelValues(addr),
			entries:     entriesGauge.WithLabelValues(addr),
			bytes:       bytesGauge.WithLabelValues(addr),
		}
		if metricsZones != nil {
			m.core = newCoreSeries(addr, metricsZones)
		}
		if srv != nil {
			if reasons := serverStepAsideReasons(srv); len(reasons) > 0 {
				m.udpAside = true
				log.Warningf("server %s: %s; wirecache steps aside for its UDP queries", addr, strings.Join(reasons, "; "))
			}
		}
		return m
	})
}
