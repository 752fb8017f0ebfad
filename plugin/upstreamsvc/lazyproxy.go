package upstreamsvc

import (
	"sync"
	"time"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/plugin/pkg/proxy"
	"github.com/coredns/coredns/plugin/pkg/transport"
)

// CoreDNS's proxies, which carry the queries the pipelines do not, started when first used and shared by the
// server blocks of one Corefile load.
//
// A started proxy runs a connection manager that wakes every 10 s to close idle connections, whether it holds
// any or not: 0.1 wake-ups a second per proxy, and each one wakes several threads of an idle node. With the
// pipelines carrying the queries (force_tcp, the default) a proxy carries only those sent while a pipelined
// connection opens or after one failed, so a healthy upstream may never need one; and the blocks of a
// Corefile that forward to the same address with the same options (the drop-in's cluster.local, in-addr.arpa
// and ip6.arpa) need one between them, not one each. Sharing it also shares its health: a failed check of
// the address is one for every block, as the blocks' queries go to the same place over the same transport.

// lazyProxy is one of CoreDNS's proxies, started only when a query or a health check first goes through it.
// A proxy that was never started holds no connection and has no health check under way: nothing of it needs
// a timer.
type lazyProxy struct {
	px          *proxy.Proxy
	healthCheck time.Duration
	once        sync.Once
}

func newLazyProxy(px *proxy.Proxy, healthCheck time.Duration) *lazyProxy {
	return &lazyProxy{px: px, healthCheck: healthCheck}
}

// started returns the proxy, started first if it was not yet: what sends a query or health-checks through it
// takes it from here, so that its health checks run every healthCheck (an unstarted one would run them
// back to back) and its idle connections are closed.
func (p *lazyProxy) started() *proxy.Proxy {
	p.once.Do(func() { p.px.Start(p.healthCheck) })
	return p.px
}

// Addr is the proxy's address.
func (p *lazyProxy) Addr() string { return p.px.Addr() }

// Down reports whether the proxy failed more than maxFails health checks in a row (never, unstarted).
func (p *lazyProxy) Down(maxFails uint32) bool { return p.px.Down(maxFails) }

// proxyKey is what makes two blocks' proxies to an address the same one.
type proxyKey struct {
	addr                string
	preferUDP           bool
	expire, healthCheck time.Duration
}

// proxyPool hands out one proxy per proxyKey, counting who holds it; the last release stops it.
type proxyPool struct {
	mu      sync.Mutex
	proxies map[proxyKey]*pooledProxy
}

type pooledProxy struct {
	*lazyProxy
	holders int
}

func newProxyPool() *proxyPool { return &proxyPool{proxies: map[proxyKey]*pooledProxy{}} }

// poolKey identifies the shared proxyPool in the caddy instance's storage.
type poolKey struct{}

// sharedProxyPool returns the proxy pool of the Corefile load c belongs to, creating it on first use. The
// instance storage lives for one load, so a reload builds new proxies and the old instance's blocks release
// the old ones.
func sharedProxyPool(c *caddy.Controller) *proxyPool {
	if pp, ok := c.Get(poolKey{}).(*proxyPool); ok {
		return pp
	}
	pp := newProxyPool()
	c.Set(poolKey{}, pp)
	return pp
}

// acquire returns the proxy to addr for cfg's transport and timing options, with a hold on it.
func (pp *proxyPool) acquire(addr string, cfg Config) *lazyProxy {
	k := proxyKey{addr: addr, preferUDP: cfg.PreferUDP, expire: cfg.Expire, healthCheck: cfg.HealthCheck}
	pp.mu.Lock()
	defer pp.mu.Unlock()
	p := pp.proxies[k]
	if p == nil {
		px := proxy.NewProxy(proxyName, addr, transport.DNS)
		px.SetExpire(cfg.Expire)
		if !cfg.PreferUDP {
			px.GetHealthchecker().SetTCPTransport()
		}
		p = &pooledProxy{lazyProxy: newLazyProxy(px, cfg.HealthCheck)}
		pp.proxies[k] = p
	}
	p.holders++
	return p.lazyProxy
}

// release gives back a hold acquire returned; the last one stops the proxy's health checks (its connections
// close once it is collected, as forward's do).
func (pp *proxyPool) release(lp *lazyProxy) {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	for k, p := range pp.proxies {
		if p.lazyProxy != lp {
			continue
		}
		if p.holders--; p.holders == 0 {
			delete(pp.proxies, k)
			lp.px.Stop()
		}
		return
	}
}
