package corefile

import (
	"github.com/coredns/coredns/plugin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// SetupErrors counts node-cache setup errors by type, upstream node-cache's
// coredns_nodecache_setup_errors_total. This package counts the "configmap" type: a base Corefile or
// kube-dns ConfigMap that could not be turned into a Corefile.
var SetupErrors = promauto.NewCounterVec(prometheus.CounterOpts{
	Namespace: plugin.Namespace,
	Subsystem: "nodecache",
	Name:      "setup_errors_total",
	Help:      "Counter of node-cache setup errors, by type.",
}, []string{"errortype"})

// ConfigMapError is the SetupErrors type of a configuration that was kept out.
const ConfigMapError = "configmap"
