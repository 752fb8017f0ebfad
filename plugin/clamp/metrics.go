package clamp

import (
	"github.com/coredns/coredns/plugin"

	"github.com/nodelocaldns/nodelocaldns/plugin/internal/series"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

var (
	// ttlRaised counts TTLs moved up to the window's minimum.
	ttlRaised = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: pluginName,
		Name:      "ttl_raised_total",
		Help:      "The count of TTLs raised to the window's minimum.",
	}, []string{"server", "window"})
	// ttlLowered counts TTLs moved down to the window's maximum.
	ttlLowered = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: pluginName,
		Name:      "ttl_lowered_total",
		Help:      "The count of TTLs lowered to the window's maximum.",
	}, []string{"server", "window"})
)

// serverCounters are the counters of one server, indexed by kind.
type serverCounters struct {
	raised  [len(windowLabels)]prometheus.Counter
	lowered [len(windowLabels)]prometheus.Counter
}

// counterSet hands out the labelled counters of each server, looking the labels up once per server
// instead of once per response.
type counterSet struct {
	byServer series.PerServer[*serverCounters]
}

func (cs *counterSet) add(server string, k kind, t tally) {
	sc := cs.byServer.Get(server, func() *serverCounters {
		sc := &serverCounters{}
		for _, k := range []kind{success, denial} {
			sc.raised[k] = ttlRaised.WithLabelValues(server, windowLabels[k])
			sc.lowered[k] = ttlLowered.WithLabelValues(server, windowLabels[k])
		}
		return sc
	})
	if t.raised > 0 {
		sc.raised[k].Add(float64(t.raised))
	}
	if t.lowered > 0 {
		sc.lowered[k].Add(float64(t.lowered))
	}
}
