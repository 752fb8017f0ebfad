package upstreamsvc

import (
	"errors"
	"fmt"

	"github.com/coredns/coredns/plugin"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Variables declared for monitoring. Forwarding itself is measured by CoreDNS's proxy metrics
// (coredns_proxy_*) with proxy_name="upstreamsvc", the pipelined queries included (proxyRequestDuration
// and the others below are the proxy package's own series).
var (
	upstreamInfo = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: plugin.Namespace,
		Subsystem: pluginName,
		Name:      "upstream_info",
		Help:      "Upstream address currently used for the Service (value 1), with where it came from (api, env or fallback).",
	}, []string{"zones", "service", "namespace", "source", "to"})

	upstreamChanges = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: pluginName,
		Name:      "upstream_changes_total",
		Help:      "Counter of changes of the upstream address list after startup.",
	}, []string{"zones", "service", "namespace"})

	switchRetries = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: pluginName,
		Name:      "switch_retries_total",
		Help:      "Counter of queries that failed on a replaced upstream and were retried on the current one.",
	}, []string{"server", "zones"})

	failFasts = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: pluginName,
		Name:      "failfast_total",
		Help:      "Counter of queries answered SERVFAIL at once because every upstream address failed its health checks.",
	}, []string{"server", "zones"})

	stalls = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: pluginName,
		Name:      "stalls_total",
		Help:      "Counter of queries held up behind a slow answer on a pipelined connection.",
	}, []string{"server", "zones", "to"})

	stallResends = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: pluginName,
		Name:      "stall_resends_total",
		Help:      "Counter of queries held up behind a slow answer on a pipelined connection and sent once more on a connection of their own.",
	}, []string{"server", "zones", "to"})

	attemptsSent = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: pluginName,
		Name:      "attempts_total",
		Help:      "Counter of copies of queries sent upstream: pipelined, sent once more after a stall, or through the proxies.",
	}, []string{"server", "zones"})

	attemptsExhausted = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: pluginName,
		Name:      "attempts_exhausted_total",
		Help:      "Counter of queries answered SERVFAIL because max_attempts copies were sent and none was answered.",
	}, []string{"server", "zones"})

	maxConcurrentRejects = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: pluginName,
		Name:      "max_concurrent_rejects_total",
		Help:      "Counter of queries refused because max_concurrent queries were in flight.",
	}, []string{"server", "zones"})
)

// The proxy package's series, which it registers and keeps unexported: the pipelined exchange counts its
// queries in them as forward counts its own. Registering a collector with the same name, help and labels
// returns the registered one (prometheus.AlreadyRegisteredError); the proxy package is initialised before
// this one, since this one imports it.
var (
	//nolint:forbidigo // promauto would register a second collector under the proxy package's name (a panic)
	proxyRequestDuration = registered(prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: plugin.Namespace,
		Subsystem: "proxy",
		Name:      "request_duration_seconds",
		Buckets:   plugin.TimeBuckets,
		Help:      "Histogram of the time each request took.",
	}, []string{"proxy_name", "to", "rcode"}))

	//nolint:forbidigo // as above
	proxyConnCacheHits = registered(prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: "proxy",
		Name:      "conn_cache_hits_total",
		Help:      "Counter of connection cache hits per upstream and protocol.",
	}, []string{"proxy_name", "to", "proto"}))

	//nolint:forbidigo // as above
	proxyConnCacheMisses = registered(prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: "proxy",
		Name:      "conn_cache_misses_total",
		Help:      "Counter of connection cache misses per upstream and protocol.",
	}, []string{"proxy_name", "to", "proto"}))
)

// registered returns the collector registered under c's description, registering c if there is none.
func registered[C prometheus.Collector](c C) C {
	err := prometheus.Register(c)
	if err == nil {
		return c
	}
	if already, ok := errors.AsType[prometheus.AlreadyRegisteredError](err); ok {
		if existing, ok := already.ExistingCollector.(C); ok {
			return existing
		}
	}
	panic(fmt.Sprintf("upstreamsvc: registering %T: %v", c, err))
}
