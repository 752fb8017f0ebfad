package upstreamsvc

import (
	"github.com/coredns/coredns/plugin"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Variables declared for monitoring. Forwarding itself is measured by CoreDNS's proxy metrics
// (coredns_proxy_*) with proxy_name="upstreamsvc".
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

	maxConcurrentRejects = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: pluginName,
		Name:      "max_concurrent_rejects_total",
		Help:      "Counter of queries refused because max_concurrent queries were in flight.",
	}, []string{"server", "zones"})
)
