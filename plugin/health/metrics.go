package health

import (
	"github.com/coredns/coredns/plugin"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// The self-check's metrics, under the names and buckets of CoreDNS's health plugin, so that dashboards and
// alerts written for it keep working. They have no server label: an overloaded process is overloaded in
// every server block.
var (
	// requestDuration observes how long each self-check took.
	requestDuration = promauto.NewHistogram(prometheus.HistogramOpts{
		Namespace:                   plugin.Namespace,
		Subsystem:                   pluginName,
		Name:                        "request_duration_seconds",
		Buckets:                     plugin.SlimTimeBuckets,
		NativeHistogramBucketFactor: plugin.NativeHistogramBucketFactor,
		Help:                        "Histogram of the time (in seconds) each self health check took.",
	})
	// requestFailures counts the self-checks that got no answer.
	requestFailures = promauto.NewCounter(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: pluginName,
		Name:      "request_failures_total",
		Help:      "The number of times the self health check failed.",
	})
)
