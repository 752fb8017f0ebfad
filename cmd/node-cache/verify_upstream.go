//go:build linux

package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strings"

	"github.com/miekg/dns"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/nodelocaldns/nodelocaldns/corefile"
	"github.com/nodelocaldns/nodelocaldns/plugin/upstreamsvc"
)

const (
	// upstreamCheck is the CHECK of the rows for the cluster DNS upstream.
	upstreamCheck = "upstream"
	// defaultVerifyUpstreamSvc is the Service -verify looks for in the environment when -upstreamsvc is not
	// given: the one the manifests pass. (The cache's own default, kube-dns, is the cache's address.)
	defaultVerifyUpstreamSvc = "kube-dns-upstream"
)

// The series of the cache's metrics that say where and how well it forwards the cluster's names.
const (
	upstreamInfoMetric       = "coredns_upstreamsvc_upstream_info"
	failFastMetric           = "coredns_upstreamsvc_failfast_total"
	healthCheckFailureMetric = "coredns_proxy_healthcheck_failures_total"
)

// upstreamTarget is one address the cache forwards the cluster's names to.
type upstreamTarget struct {
	service string // the Service, namespace/name when known
	addr    string // HOST:PORT
	source  string // where -verify found the address
}

// upstreamMetrics is what the cache's metrics say about its upstream: where it forwards (upstreamsvc's
// upstream_info), how many queries it failed fast, and the failed health checks of each address.
type upstreamMetrics struct {
	targets        []upstreamTarget
	failFast       float64
	healthFailures map[string]float64
}

// checkUpstream asks the cluster DNS upstream directly, over TCP as upstreamsvc forwards by default, for the
// cluster name, one row per address. It finds the addresses where the cache does: in the cache's metrics
// (upstreamsvc's upstream_info), else in the Service's environment variable. When no address answers, the
// failed answers for cluster names on the cache's addresses that answered other lookups are the upstream's:
// they are marked UPSTREAM instead of FAIL, so that an outage of the cluster DNS is not read as a broken cache.
func (v *verifier) checkUpstream(ctx context.Context) {
	m, metricsErr := v.scrapeUpstreamMetrics(ctx)
	targets := m.targets
	var envProblem string
	if len(targets) == 0 {
		hostVar := upstreamsvc.HostEnvVar(v.upstreamService)
		addr, found, err := upstreamsvc.EnvAddress(v.upstreamService, v.lookupEnv)
		switch {
		case err != nil:
			envProblem = err.Error()
		case !found:
			envProblem = hostVar + " is not set"
		case slices.Contains(v.listen, netip.MustParseAddrPort(addr).Addr().Unmap()):
			envProblem = fmt.Sprintf("%s=%s is an address of the cache itself (pass -upstreamsvc with the Service in front of the cluster DNS)", hostVar, addr)
		default:
			targets = []upstreamTarget{{service: v.upstreamService, addr: addr, source: hostVar}}
		}
	}
	if len(targets) == 0 {
		why := fmt.Sprintf("the cache's metrics name none (%v) and %s", metricsErr, envProblem)
		if v.viaUpstreamFailed() {
			v.add(upstreamCheck, v.upstreamService, false, "address unknown: %s; cannot tell whether the cluster DNS or the cache fails the cluster's names", why)
		} else {
			v.add(upstreamCheck, v.upstreamService, true, "answers the cluster's names through the cache; not asked directly, address unknown: %s", why)
		}
		return
	}

	down := true
	for _, t := range targets {
		target := t.service + " at " + t.addr
		r, err := v.askUpstream(ctx, t.addr)
		var problem string
		switch {
		case err != nil:
			problem = "does not answer: " + err.Error()
		case r.Rcode != dns.RcodeSuccess && r.Rcode != dns.RcodeNameError:
			problem = "answers " + dns.RcodeToString[r.Rcode]
		}
		if problem == "" {
			down = false
			detail := strings.Join(answers(r, dns.TypeA), ", ")
			if detail == "" {
				detail = dns.RcodeToString[r.Rcode] + ", no records"
			}
			v.add(upstreamCheck, target, true, "%s A over TCP: %s (address from %s)", dns.Fqdn(v.name), detail, t.source)
			continue
		}
		detail := fmt.Sprintf("the cluster DNS is unreachable from this node: %s A over TCP %s (address from %s)", dns.Fqdn(v.name), problem, t.source)
		if metricsErr == nil {
			detail += fmt.Sprintf("; the cache's metrics: %s %.0f (queries answered SERVFAIL at once, every address failing its health checks), %s %.0f for this address",
				failFastMetric, m.failFast, healthCheckFailureMetric, m.healthFailures[t.addr])
		}
		v.add(upstreamCheck, target, false, "%s", detail)
	}
	if !down {
		return
	}
	for i := range v.results {
		r := &v.results[i]
		if r.viaUpstream && !r.ok && v.answeredOn[r.server] {
			r.upstreamFault = true
			r.detail += "; the cluster DNS upstream does not answer (row " + upstreamCheck + "), and the cache answers on this address"
		}
	}
}

// viaUpstreamFailed says whether an answer the cache gets from the cluster DNS failed.
func (v *verifier) viaUpstreamFailed() bool {
	return slices.ContainsFunc(v.results, func(r verifyResult) bool { return r.viaUpstream && !r.ok })
}

// askUpstream asks addr for the cluster name over TCP, as upstreamsvc forwards by default, without
// counting it among the cache's lookups.
func (v *verifier) askUpstream(ctx context.Context, addr string) (*dns.Msg, error) {
	ctx, cancel := context.WithTimeout(ctx, v.timeout)
	defer cancel()
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(v.name), dns.TypeA)
	m.SetEdns0(1232, false)
	c := &dns.Client{Net: "tcp", Timeout: v.timeout}
	r, _, err := c.ExchangeContext(ctx, m, addr)
	return r, err
}

// scrapeUpstreamMetrics reads the cache's metrics (the prometheus plugin on -prometheus-listen-address or
// the first -localip, port 9253) and returns what they say about its upstream.
func (v *verifier) scrapeUpstreamMetrics(ctx context.Context) (upstreamMetrics, error) {
	m := upstreamMetrics{healthFailures: map[string]float64{}}
	if v.metricsURL == "" {
		return m, fmt.Errorf("no metrics address")
	}
	ctx, cancel := context.WithTimeout(ctx, v.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, v.metricsURL, nil)
	if err != nil {
		return m, err
	}
	req.Header.Set("Accept", string(expfmt.NewFormat(expfmt.TypeTextPlain)))
	// No proxy from the environment: the address is on this node.
	client := &http.Client{Transport: &http.Transport{Proxy: nil}}
	resp, err := client.Do(req)
	if err != nil {
		return m, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return m, fmt.Errorf("%s: %s", v.metricsURL, resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return m, fmt.Errorf("parsing %s: %w", v.metricsURL, err)
	}
	if f := families[upstreamInfoMetric]; f != nil {
		for _, s := range f.GetMetric() {
			if s.GetGauge().GetValue() != 1 {
				continue
			}
			l := labels(s)
			if slices.ContainsFunc(m.targets, func(t upstreamTarget) bool { return t.addr == l["to"] }) {
				continue // one series per server block; the address is the same
			}
			m.targets = append(m.targets, upstreamTarget{service: l["namespace"] + "/" + l["service"], addr: l["to"],
				source: "the cache's metrics, source " + l["source"]})
		}
	}
	if f := families[failFastMetric]; f != nil {
		for _, s := range f.GetMetric() {
			m.failFast += s.GetCounter().GetValue()
		}
	}
	if f := families[healthCheckFailureMetric]; f != nil {
		for _, s := range f.GetMetric() {
			if l := labels(s); l["proxy_name"] == "upstreamsvc" {
				m.healthFailures[l["to"]] += s.GetCounter().GetValue()
			}
		}
	}
	if len(m.targets) == 0 {
		return m, fmt.Errorf("%s has no %s series", v.metricsURL, upstreamInfoMetric)
	}
	return m, nil
}

func labels(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

// cacheMetricsAddress is where the cache serves its metrics: flag (-prometheus-listen-address) when given,
// else the address of the prometheus directive beside upstreamsvc in the Corefile the cache serves (conf;
// the manifests set the flag to the node's IP, which -verify is not given), else the drop-in default, the
// first local address port 9253. "" when there is none.
func cacheMetricsAddress(flag, conf string, listen []netip.Addr) string {
	if flag != "" {
		return flag
	}
	var first netip.Addr
	if len(listen) > 0 {
		first = listen[0]
	}
	if data, err := os.ReadFile(conf); err == nil {
		if f, err := corefile.Parse(data); err == nil {
			var found string
			for _, b := range f.Blocks {
				i := slices.IndexFunc(b.Directives, func(d *corefile.Directive) bool { return d.Name == "prometheus" && len(d.Args) > 0 })
				if i < 0 {
					continue
				}
				addr := b.Directives[i].Args[0]
				if host, port, err := net.SplitHostPort(addr); err == nil && host == "" && first.IsValid() {
					addr = net.JoinHostPort(first.String(), port) // the plugin listens on every address
				}
				if slices.ContainsFunc(b.Directives, func(d *corefile.Directive) bool { return d.Name == "upstreamsvc" }) {
					return addr
				}
				if found == "" {
					found = addr
				}
			}
			if found != "" {
				return found
			}
		}
	}
	if first.IsValid() {
		return netip.AddrPortFrom(first, corefile.DefaultMetricsPort).String()
	}
	return ""
}
