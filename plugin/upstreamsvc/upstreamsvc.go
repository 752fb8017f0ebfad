// Package upstreamsvc is a CoreDNS plugin that forwards to the cluster DNS behind a Kubernetes
// Service (kube-dns-upstream by default) and follows the Service when its ClusterIP changes.
//
// A node-local cache owns the kube-dns ClusterIP, so it reaches CoreDNS through a second Service.
// The address is taken from the Kubernetes API (watched), else from the variables Kubernetes
// injects into the pod, else from a static fallback. Over TCP, queries are pipelined on one connection
// per address (pipeline.go); CoreDNS's proxy package carries the rest (UDP, dnstap, a query that failed on
// its pipelined connection, and once more a query held up there) and keeps the health checks. One client
// query is sent at most max_attempts times in all (attempts.go). A changed address swaps in new proxies
// without failing queries that are already on their way.
package upstreamsvc

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coredns/coredns/plugin"
	"github.com/coredns/coredns/plugin/dnstap"
	"github.com/coredns/coredns/plugin/forward"
	"github.com/coredns/coredns/plugin/metadata"
	"github.com/coredns/coredns/plugin/metrics"
	clog "github.com/coredns/coredns/plugin/pkg/log"
	"github.com/coredns/coredns/plugin/pkg/proxy"
	"github.com/coredns/coredns/request"

	"github.com/nodelocaldns/nodelocaldns/plugin/internal/series"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
)

const pluginName = "upstreamsvc"

// proxyName labels CoreDNS's proxy metrics (coredns_proxy_*{proxy_name="upstreamsvc"}).
const proxyName = pluginName

var log = clog.NewWithPlugin(pluginName)

// Config is the parsed upstreamsvc block.
type Config struct {
	Service   string
	Namespace string
	// Port overrides the port from the API or environment; 0 means not set.
	Port uint16
	// PreferUDP sends queries over UDP (TCP after truncation); otherwise every query goes over TCP.
	PreferUDP bool
	// Kubeconfig, when set, is used instead of in-cluster credentials.
	Kubeconfig string
	// Fallback is used when neither the API nor the environment yields an address.
	Fallback []netip.AddrPort
	// MaxConcurrent caps queries in flight (0: no cap); excess queries get REFUSED.
	MaxConcurrent int64
	// Expire is how long an idle upstream connection is kept, and how long a pipelined connection takes new
	// queries; at least minExpire.
	Expire time.Duration
	// HealthCheck is the interval between health checks of an upstream that failed.
	HealthCheck time.Duration
	// MaxAttempts is how many times one client query is sent upstream at most, every copy counted (the
	// pipelined one, a stalled query's copy sent once more, each one through the proxies); 0 means
	// defaultMaxAttempts.
	MaxAttempts int
}

// Defaults that match CoreDNS's forward plugin.
const (
	defaultService     = "kube-dns-upstream"
	defaultNamespace   = "kube-system"
	defaultExpire      = 10 * time.Second
	defaultHealthCheck = 500 * time.Millisecond
	// defaultMaxAttempts is one retry: a query that got no answer goes once more, on another connection
	// (kube-proxy may pick another cluster DNS Pod for it). Each attempt that gets no answer takes the read
	// timeout, 2 s, so the client has SERVFAIL after 4 s, inside the 5 s a glibc stub resolver waits for an
	// answer by default; a third attempt would answer a client that has given up.
	defaultMaxAttempts = 2
)

// minExpire is the shortest expire. A pipelined connection takes new queries for expire, then a new one
// opens beside it: with forward's expire 0 (no idle connection kept), every query would open a connection.
const minExpire = time.Second

// UpstreamSvc forwards every query it receives to the Service's current address.
type UpstreamSvc struct {
	Next plugin.Handler

	cfg     Config
	zones   string        // metrics label: the server block's zones
	initial upstreamSet   // chosen during setup, used from OnStartup on
	watch   *serviceWatch // nil without API access
	own     ownListeners  // addresses that would loop back into this block
	pool    *proxyPool    // the proxies, shared with the Corefile's other blocks
	tap     *dnstap.Dnstap

	errLimitExceeded error
	concurrent       atomic.Int64
	attemptsSent     series.PerServer[prometheus.Counter] // attempts_total, by server

	current atomic.Pointer[upstream]

	mu      sync.Mutex // serialises switches and guards the fields below
	active  upstreamSet
	stopped bool
}

// upstream is the proxies to one address list. It is stopped once it has been replaced and the last query
// using it has returned.
type upstream struct {
	// proxies are CoreDNS's proxies, one per address: they send the queries the pipelines do not carry,
	// and health-check their address. Each starts when it is first used (lazyProxy), and the blocks that
	// forward to the same address share it (proxyPool).
	proxies []*lazyProxy
	pool    *proxyPool
	// pipes carry the queries over pipelined TCP connections, one per address; nil where forward carries
	// every query (prefer_udp, dnstap).
	pipes    []*pipeline
	inflight atomic.Int64
	retired  atomic.Bool
	stopOnce sync.Once
}

// New returns a handler for cfg. Setup gives it the address to start with and, when the Kubernetes
// API is available, the watch to follow.
func New(cfg Config) *UpstreamSvc {
	if cfg.MaxAttempts == 0 {
		cfg.MaxAttempts = defaultMaxAttempts
	}
	return &UpstreamSvc{
		cfg:              cfg,
		pool:             newProxyPool(),
		errLimitExceeded: fmt.Errorf("concurrent queries exceeded maximum %d", cfg.MaxConcurrent),
	}
}

// Name implements plugin.Handler.
func (u *UpstreamSvc) Name() string { return pluginName }

var (
	errStopped = errors.New("upstreamsvc is not running")
	// errAllDown is forward's ErrNoHealthy, so logs read the same as forward's failfast_all_unhealthy_upstreams.
	errAllDown = forward.ErrNoHealthy
)

// maxFails is forward.New's max_fails: a proxy is down after more health checks than this failed in a row.
const maxFails = 2

// down reports whether every address of up failed its last health checks: the upstream is known not to
// answer. forward health-checks a proxy only after a query to it failed, and then every HealthCheck
// interval until a check succeeds, so down turns false again on its own once the Service answers.
func (up *upstream) down() bool {
	for _, p := range up.proxies {
		if !p.Down(maxFails) {
			return false
		}
	}
	return len(up.proxies) > 0
}

// ServeDNS implements plugin.Handler.
func (u *UpstreamSvc) ServeDNS(ctx context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
	if u.cfg.MaxConcurrent > 0 {
		n := u.concurrent.Add(1)
		defer u.concurrent.Add(-1)
		if n > u.cfg.MaxConcurrent {
			maxConcurrentRejects.WithLabelValues(metrics.WithServer(ctx), u.zones).Inc()
			return dns.RcodeRefused, u.errLimitExceeded
		}
	}

	up := u.acquire()
	if up == nil {
		return dns.RcodeServerFailure, errStopped
	}
	if up.down() {
		// Every address failed its health checks: answer SERVFAIL now rather than after the proxies'
		// connection attempts, which would keep the client waiting up to its timeout (5 s) for nothing.
		// A cache in front serves what it holds, stale if need be. This is forward's
		// failfast_all_unhealthy_upstreams, always on: the health checks go to the same Service over
		// the same transport as the queries, so a failed check means a failed query.
		u.release(up)
		failFasts.WithLabelValues(metrics.WithServer(ctx), u.zones).Inc()
		return dns.RcodeServerFailure, errAllDown
	}
	server := metrics.WithServer(ctx)
	budget := newAttempts(u.cfg.MaxAttempts, u.attemptsSent.Get(server, func() prometheus.Counter {
		return attemptsSent.WithLabelValues(server, u.zones)
	}))
	answered, err := u.pipelined(ctx, up, w, r, budget)
	var rcode int
	switch {
	case answered:
		u.release(up)
		return dns.RcodeSuccess, nil
	case errors.Is(err, errPipeStalled):
		u.release(up)
		rcode = dns.RcodeServerFailure
	default:
		rcode, err = u.forwarded(ctx, up, w, r, budget, err)
	}
	if rcode == dns.RcodeServerFailure && err != nil && budget.spent() && ctx.Err() == nil {
		attemptsExhausted.WithLabelValues(server, u.zones).Inc()
	}
	return rcode, err
}

// pipelined sends r over a pipelined connection to one of up's addresses, picked at random as forward
// picks, sets forward's forward/upstream metadata to it, and writes the answer as forward would. It
// reports false when it wrote nothing, with why: errPipeStalled when the query stalled there and got no
// answer from the copies sent (it is not to be sent again), any other error when the query was not sent
// (no pipelined connection) or got no answer there (the connection closed or returned nothing in time), and
// the proxies are to carry it.
func (u *UpstreamSvc) pipelined(ctx context.Context, up *upstream, w dns.ResponseWriter, r *dns.Msg, budget *attempts) (bool, error) {
	if len(up.pipes) == 0 {
		return false, nil
	}
	p := up.pipes[0]
	if len(up.pipes) > 1 {
		p = up.pipes[rand.IntN(len(up.pipes))] //nolint:gosec // spreading queries needs no unpredictable choice
	}
	metadata.SetValueFunc(ctx, "forward/upstream", p.forwardUpstream)
	ret, err := p.exchange(ctx, w, r, budget)
	if err != nil {
		return false, err
	}
	state := request.Request{W: w, Req: r}
	if !state.Match(ret) {
		// As forward answers a reply that does not match the query.
		formerr := new(dns.Msg)
		formerr.SetRcode(r, dns.RcodeFormatError)
		_ = w.WriteMsg(formerr)
		return true, nil
	}
	_ = w.WriteMsg(ret)
	return true, nil
}

// acquire returns the current upstream with a hold on it, or nil after shutdown.
func (u *UpstreamSvc) acquire() *upstream {
	for {
		up := u.current.Load()
		if up == nil {
			return nil
		}
		up.inflight.Add(1)
		if !up.retired.Load() {
			return up
		}
		// Replaced between Load and Add: let go and take the new one.
		u.release(up)
	}
}

func (u *UpstreamSvc) release(up *upstream) {
	if up.inflight.Add(-1) == 0 && up.retired.Load() {
		up.stop()
	}
}

// retire stops up as soon as no query holds it. Together with acquire this relies on sequentially
// consistent atomics: either acquire sees retired, or retire sees the hold.
func (u *UpstreamSvc) retire(up *upstream) {
	up.retired.Store(true)
	if up.inflight.Load() == 0 {
		up.stop()
	}
}

func (up *upstream) stop() {
	up.stopOnce.Do(func() {
		for _, p := range up.pipes {
			p.close()
		}
		for _, p := range up.proxies {
			up.pool.release(p)
		}
	})
}

// OnStartup starts forwarding to the address chosen during setup and starts following the API.
func (u *UpstreamSvc) OnStartup() error {
	u.switchTo(u.initial)
	if u.watch != nil {
		u.watch.subscribe(u)
	}
	return nil
}

// OnShutdown stops following the API and stops the forwarder once its queries have returned.
// upstream_info is left alone: on a reload the new instance has already published its series (often
// with the same labels), and it replaces this block's series whenever it changes them.
func (u *UpstreamSvc) OnShutdown() error {
	if u.watch != nil {
		u.watch.unsubscribe(u)
	}
	u.mu.Lock()
	u.stopped = true
	old := u.current.Swap(nil)
	u.mu.Unlock()
	if old != nil {
		u.retire(old)
	}
	return nil
}

// follow implements follower: it applies what the API says about the Service.
func (u *UpstreamSvc) follow(v serviceView) {
	switch {
	case v.exists && v.problem == nil:
		set := u.cfg.apiSet(v)
		if err := u.own.refuse(set, u.cfg.origin(set)); err != nil {
			log.Errorf("%v; keeping %s", err, u.activeString())
			return
		}
		u.switchTo(set)
	case v.exists:
		log.Errorf("%v; keeping %s", v.problem, u.activeString())
	default:
		u.mu.Lock()
		fromAPI := u.active.source == sourceAPI
		u.mu.Unlock()
		if !fromAPI {
			// Not found, and we never had it from the API: the env/fallback choice made at setup stands.
			return
		}
		if len(u.cfg.Fallback) > 0 {
			log.Warningf("Service %s/%s was deleted; using fallback", u.cfg.Namespace, u.cfg.Service)
			u.switchTo(u.cfg.fallbackSet())
			return
		}
		log.Warningf("Service %s/%s was deleted; keeping %s until it is back", u.cfg.Namespace, u.cfg.Service, u.activeString())
	}
}

func (u *UpstreamSvc) activeString() string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return strings.Join(u.active.addrs, ",")
}

// switchTo makes set the upstream. Queries already sent keep their forwarder until they return.
func (u *UpstreamSvc) switchTo(set upstreamSet) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.stopped || len(set.addrs) == 0 {
		return
	}
	old := u.current.Load()
	if old != nil && slices.Equal(u.active.addrs, set.addrs) {
		if u.active.source != set.source {
			u.active.source = set.source
			u.publishInfo()
		}
		return
	}
	proxies := u.newProxies(set.addrs)
	up := &upstream{proxies: proxies, pool: u.pool}
	if !u.cfg.PreferUDP && u.tap == nil {
		for i, addr := range set.addrs {
			up.pipes = append(up.pipes, newPipeline(addr, u.cfg.Expire, proxies[i], u.zones))
		}
	}
	u.current.Store(up)
	previous := u.active
	u.active = set
	u.publishInfo()
	if old == nil {
		// Export the count at zero from the first upstream on: a dashboard shows no changes, not no data.
		upstreamChanges.WithLabelValues(u.zones, u.cfg.Service, u.cfg.Namespace)
		log.Infof("Forwarding to %s (Service %s/%s, from %s)", strings.Join(set.addrs, ","), u.cfg.Namespace, u.cfg.Service, set.source)
		return
	}
	upstreamChanges.WithLabelValues(u.zones, u.cfg.Service, u.cfg.Namespace).Inc()
	log.Infof("Service %s/%s moved from %s to %s (from %s)", u.cfg.Namespace, u.cfg.Service,
		strings.Join(previous.addrs, ","), strings.Join(set.addrs, ","), set.source)
	u.retire(old)
}

// publishInfo replaces this block's upstream_info series. Called with u.mu held.
func (u *UpstreamSvc) publishInfo() {
	upstreamInfo.DeletePartialMatch(map[string]string{"zones": u.zones, "service": u.cfg.Service, "namespace": u.cfg.Namespace})
	for _, addr := range u.active.addrs {
		upstreamInfo.WithLabelValues(u.zones, u.cfg.Service, u.cfg.Namespace, u.active.source, addr).Set(1)
	}
}

// newProxies returns CoreDNS's proxies to addrs, with this plugin's transport and timing options, from the
// pool the Corefile's blocks share, to be started when first used: each health-checks its address every
// HealthCheck interval once a query to it failed.
func (u *UpstreamSvc) newProxies(addrs []string) []*lazyProxy {
	proxies := make([]*lazyProxy, 0, len(addrs))
	for _, addr := range addrs {
		proxies = append(proxies, u.pool.acquire(addr, u.cfg))
	}
	return proxies
}

// proxyOptions are the transport of every query the proxies send: forward's force_tcp or prefer_udp. (The
// health checks keep the proxy's own, `. NS` with recursion desired, over TCP unless prefer_udp.)
func (u *UpstreamSvc) proxyOptions() proxy.Options {
	return proxy.Options{ForceTCP: !u.cfg.PreferUDP, PreferUDP: u.cfg.PreferUDP}
}
