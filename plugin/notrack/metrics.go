//go:build linux

package notrack

import (
	"context"
	"errors"
	"slices"

	"github.com/coredns/coredns/plugin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/nodelocaldns/nodelocaldns/nodelocal"
)

// subsystem is upstream node-cache's metrics subsystem, so that its dashboards keep working.
const subsystem = "nodecache"

// ConfigMapError is the SetupErrors type of a base Corefile or kube-dns ConfigMap that could not be turned
// into a Corefile; node-cache's drop-in mode counts it.
const ConfigMapError = "configmap"

// Variables declared for monitoring.
var (
	// SetupErrors is upstream node-cache's coredns_nodecache_setup_errors_total{errortype}. notrack counts
	// the iptables, iptables_lock, interface_add and interface_check types (plus node_lock and config, which
	// upstream does not have); node-cache's drop-in mode counts ConfigMapError.
	SetupErrors = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: subsystem,
		Name:      "setup_errors_total",
		Help:      "Counter of node-cache setup errors, by type.",
	}, []string{"errortype"})
	rulesInPlace = promauto.NewGauge(prometheus.GaugeOpts{
		Namespace: plugin.Namespace,
		Subsystem: subsystem,
		Name:      "rules_in_place",
		Help:      "1 when the NOTRACK rules of every claimed address are wanted and the last sync put them in place, else 0.",
	})
	addressesInPlace = promauto.NewGauge(prometheus.GaugeOpts{
		Namespace: plugin.Namespace,
		Subsystem: subsystem,
		Name:      "addresses_in_place",
		Help:      "1 when the node-local link held every claimed address after the last sync, else 0.",
	})
	rulesAhead = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: subsystem,
		Name:      "rules_ahead_total",
		Help:      "Counter of other components' rules a rules sync found ahead of the cache's jumps (and put the jumps back in front of), by family, table and hook chain.",
	}, []string{"family", "table", "chain"})
	syncDuration = promauto.NewHistogram(prometheus.HistogramOpts{
		Namespace: plugin.Namespace,
		Subsystem: subsystem,
		Name:      "sync_duration_seconds",
		Help:      "Histogram of the time a periodic check and repair of the link, addresses and rules took.",
		Buckets:   prometheus.ExponentialBuckets(0.001, 2, 14), // 1ms to 8s
	})
)

func init() {
	// Export the types upstream node-cache exports at zero before anything fails.
	for _, k := range []nodelocal.Kind{nodelocal.KindIPTables, nodelocal.KindIPTablesLock, nodelocal.KindInterfaceAdd, nodelocal.KindInterfaceCheck} {
		SetupErrors.WithLabelValues(string(k))
	}
	SetupErrors.WithLabelValues(ConfigMapError)
}

// countSetupError counts each kind of nodelocal error in err once. Errors of a shutdown in progress are
// not failures of the node.
func countSetupError(err error) {
	if err == nil || errors.Is(err, context.Canceled) {
		return
	}
	for _, k := range nodelocal.Kinds(err) {
		SetupErrors.WithLabelValues(string(k)).Inc()
	}
}

func (n *node) updateGauges() {
	if n.rec == nil {
		return
	}
	st := n.rec.Status()
	if st.RuleSyncs != n.aheadCounted {
		// Each sync's finds counted once, whichever path synced.
		n.aheadCounted = st.RuleSyncs
		for _, a := range st.Ahead {
			rulesAhead.WithLabelValues(a.Family, a.Table, a.Chain).Inc()
		}
	}
	rulesInPlace.Set(boolValue(!n.settings.NoRules && st.RulesPresent && n.allRulesWanted()))
	if n.settings.NoInterface {
		return
	}
	have := true
	for k := range n.leases {
		have = have && slices.Contains(st.Addresses, k.addr)
	}
	addressesInPlace.Set(boolValue(have && len(n.leases) > 0))
}

func (n *node) allRulesWanted() bool {
	for _, sl := range n.leases {
		if !sl.rules {
			return false
		}
	}
	return len(n.leases) > 0
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
