package wirecache

import (
	"slices"
	"time"

	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin/metrics"
	"github.com/coredns/coredns/plugin/metrics/vars"

	"github.com/nodelocaldns/nodelocaldns/plugin/internal/series"
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
	duration     series.Slot[prometheus.Observer]
	do           series.Slot[prometheus.Counter]
	requests     [2][2][numTypeSlots]series.Slot[prometheus.Counter]
	requestSize  [2]series.Slot[prometheus.Observer]
	responseSize [2]series.Slot[prometheus.Observer]
	responses    [dns.RcodeRefused + 1]series.Slot[prometheus.Counter] // hits are NOERROR, SERVFAIL, NXDOMAIN or REFUSED
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

// isMonitoredType is monitoredTypes as a table by code, so that a hit finds its type's slot without a scan.
var isMonitoredType = func() (is [numTypeSlots - 1]bool) {
	for _, t := range monitoredTypes {
		is[t] = true
	}
	return is
}()

// typeSlot returns the slot of qtype.
func typeSlot(qtype uint16) int {
	if int(qtype) < len(isMonitoredType) && isMonitoredType[qtype] {
		return int(qtype)
	}
	return numTypeSlots - 1
}

// typeLabel returns the type label of a slot, as the prometheus plugin gives it.
func typeLabel(slot int) string {
	if slot == numTypeSlots-1 {
		return "other"
	}
	return dns.Type(slot).String()
}

func newCoreSeries(server string, zones []string) *coreSeries {
	return &coreSeries{server: server, zones: zones, byZone: make([]zoneSeries, len(zones)+1)}
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
		z.do.Get(func() prometheus.Counter { return vars.RequestDo.WithLabelValues(s.server, zone, view) }).Inc()
	}
	slot := typeSlot(h.qtype)
	z.requests[proto][fam][slot].Get(func() prometheus.Counter {
		return vars.RequestCount.WithLabelValues(s.server, zone, view, protoName, famName, typeLabel(slot))
	}).Inc()
	z.duration.Get(func() prometheus.Observer {
		return vars.RequestDuration.WithLabelValues(s.server, zone, view)
	}).Observe(time.Since(h.start).Seconds())
	z.responseSize[proto].Get(func() prometheus.Observer {
		return vars.ResponseSize.WithLabelValues(s.server, zone, view, protoName)
	}).Observe(float64(h.respSize))
	z.requestSize[proto].Get(func() prometheus.Observer {
		return vars.RequestSize.WithLabelValues(s.server, zone, view, protoName)
	}).Observe(float64(h.reqSize))
	if h.rcode >= 0 && h.rcode < len(z.responses) {
		z.responses[h.rcode].Get(func() prometheus.Counter {
			return vars.ResponseRcode.WithLabelValues(s.server, zone, view, dns.RcodeToString[h.rcode], pluginName)
		}).Inc()
	}
}
