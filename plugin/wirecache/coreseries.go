package wirecache

import (
	"slices"
	"sync/atomic"
	"time"

	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin/metrics"
	"github.com/coredns/coredns/plugin/metrics/vars"

	"github.com/nodelocaldns/nodelocaldns/plugin/internal/zones"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
)

// metricsPlugin is the plugin that keeps CoreDNS's per-query series (coredns_dns_requests_total, ...).
const metricsPlugin = "prometheus"

// blockMetricsZones returns the zones the block's prometheus plugin labels its series with, when that plugin
// runs after wirecache and so never sees a hit; nil when the block has no such plugin. order is the chain's
// directive order (dnsserver.Directives).
func blockMetricsZones(cfg *dnsserver.Config, order []string) []string {
	h, ok := cfg.Handler(metricsPlugin).(*metrics.Metrics)
	if !ok {
		return nil
	}
	if slices.Index(order, metricsPlugin) < slices.Index(order, pluginName) {
		// prometheus runs first and counts every query, hits included.
		return nil
	}
	return append([]string{}, h.ZoneNames()...)
}

// metricsZone returns the index in zones of the zone the prometheus plugin labels a query for name with, as
// its handler picks it; len(zones) stands for ".", its label for names outside its zones.
func metricsZone(blockZones []string, name string) int {
	z := zones.Matches(blockZones, name)
	if z == "" {
		return len(blockZones)
	}
	return slices.Index(blockZones, z)
}

// coreSeries counts one server's hits in CoreDNS's own series, as the prometheus plugin's handler would
// have counted them had the query gone down the chain (vars.Report), so that dashboards built on those
// series see every query. The series' children are resolved from their labels once, on first use, and kept
// in slots indexed by zone, transport, family, type and rcode: a hit only loads pointers and adds.
type coreSeries struct {
	server string
	zones  []string     // the block's prometheus zones; the slot after the last is "."
	byZone []zoneSeries // one per zone, and one for "."
}

// zoneSeries are the children of one server and zone. Protocol and family index 0 is UDP and IPv4.
type zoneSeries struct {
	duration     atomic.Pointer[prometheus.Observer]
	do           atomic.Pointer[prometheus.Counter]
	requests     [2][2][numTypeSlots]atomic.Pointer[prometheus.Counter]
	requestSize  [2]atomic.Pointer[prometheus.Observer]
	responseSize [2]atomic.Pointer[prometheus.Observer]
	responses    [dns.RcodeNameError + 1]atomic.Pointer[prometheus.Counter] // hits are NOERROR or NXDOMAIN
}

// numTypeSlots covers every type the prometheus plugin labels by name (their codes are below 256; ANY is
// 255); the last slot, past them, is "other".
const numTypeSlots = 257

// monitoredTypes are the query types the prometheus plugin labels by name (vars.monitorType); any other is
// "other".
var monitoredTypes = []uint16{
	dns.TypeAAAA, dns.TypeA, dns.TypeCNAME, dns.TypeDNSKEY, dns.TypeDS, dns.TypeMX, dns.TypeNSEC3, dns.TypeNSEC,
	dns.TypeNS, dns.TypePTR, dns.TypeRRSIG, dns.TypeSOA, dns.TypeSRV, dns.TypeTXT, dns.TypeHTTPS, dns.TypeSVCB,
	dns.TypeIXFR, dns.TypeAXFR, dns.TypeANY,
}

// typeSlot returns the slot of qtype and its label.
func typeSlot(qtype uint16) (int, string) {
	if qtype < numTypeSlots-1 && slices.Contains(monitoredTypes, qtype) {
		return int(qtype), dns.Type(qtype).String()
	}
	return numTypeSlots - 1, "other"
}

func newCoreSeries(server string, zones []string) *coreSeries {
	return &coreSeries{server: server, zones: zones, byZone: make([]zoneSeries, len(zones)+1)}
}

// child returns the metric in slot, resolving it with make the first time. Two hits racing to fill a slot
// resolve the same child, so either store is right.
func child[T any](slot *atomic.Pointer[T], make func() T) T {
	if p := slot.Load(); p != nil {
		return *p
	}
	m := make()
	slot.Store(&m)
	return m
}

// hit is one hit to count: what the prometheus plugin's handler would have read from the query and reply.
type hit struct {
	zone     int // index in coreSeries.zones
	tcp, v6  bool
	do       bool
	qtype    uint16
	rcode    int
	reqSize  int // the query's length, as dns.Msg.Len gives it
	respSize int // the chain's reply's length, as the prometheus plugin measures it (entry.chainLen)
	start    time.Time
}

// count adds h to the series.
func (s *coreSeries) count(h *hit) {
	z := &s.byZone[h.zone]
	zone := "."
	if h.zone < len(s.zones) {
		zone = s.zones[h.zone]
	}
	proto, fam, protoName, famName := 0, 0, "udp", "1"
	if h.tcp {
		proto, protoName = 1, "tcp"
	}
	if h.v6 {
		fam, famName = 1, "2"
	}
	// The view label is empty: wirecache steps aside in a block with a view.
	const view = ""
	if h.do {
		child(&z.do, func() prometheus.Counter { return vars.RequestDo.WithLabelValues(s.server, zone, view) }).Inc()
	}
	slot, typeName := typeSlot(h.qtype)
	child(&z.requests[proto][fam][slot], func() prometheus.Counter {
		return vars.RequestCount.WithLabelValues(s.server, zone, view, protoName, famName, typeName)
	}).Inc()
	child(&z.duration, func() prometheus.Observer {
		return vars.RequestDuration.WithLabelValues(s.server, zone, view)
	}).Observe(time.Since(h.start).Seconds())
	child(&z.responseSize[proto], func() prometheus.Observer {
		return vars.ResponseSize.WithLabelValues(s.server, zone, view, protoName)
	}).Observe(float64(h.respSize))
	child(&z.requestSize[proto], func() prometheus.Observer {
		return vars.RequestSize.WithLabelValues(s.server, zone, view, protoName)
	}).Observe(float64(h.reqSize))
	if h.rcode >= 0 && h.rcode < len(z.responses) {
		child(&z.responses[h.rcode], func() prometheus.Counter {
			return vars.ResponseRcode.WithLabelValues(s.server, zone, view, dns.RcodeToString[h.rcode], pluginName)
		}).Inc()
	}
}
