package wirecache

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"sync"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin/pkg/transport"

	"github.com/miekg/dns"
)

// The fast path: a UDP socket of wirecache's own in the reuseport group of each address CoreDNS serves with
// blocks that qualify, which the group is steered to. It reads queries in batches (recvmmsg) on a few
// goroutines, answers those its blocks' stores hold and writes the replies in batches (sendmmsg); every
// other query goes to CoreDNS's server (dnsserver.Server.ServeDNS) for that address, through a miekg/dns
// server reading from a connection of its own, exactly as CoreDNS's own UDP listener would pass it. So the
// plugin chain, the server's checks and every metric apply to whatever the fast path does not answer, and a
// hit is the reply the chain's wirecache would have written (parseWireQuery reads only the queries it reads
// as parseQuery does; the block is chosen as the server chooses it).
//
// The steering is an optimization, not a condition: a packet that lands on CoreDNS's own socket is answered
// by the plugin chain, wirecache included, as before.

// fastPathsKey stores an instance's fastPaths in caddy's instance storage, so that every block of the
// instance shares one listener per address.
type fastPathsKey struct{}

// fastPaths are the fast-path listeners of one caddy instance: one per server (address) whose blocks
// qualify. They start when the server handles its first query (the only place a *dnsserver.Server is
// reachable from a plugin) and stop with the instance.
type fastPaths struct {
	mu      sync.Mutex
	blocks  map[*dnsserver.Config]*WireCache
	servers map[*dnsserver.Server]*fastPath // nil for a server tried and left to CoreDNS
	stopped bool
	// starting counts the listeners being started, so stop waits for them.
	starting sync.WaitGroup
}

// instanceFastPaths returns the fast paths of c's instance, and whether this call created them.
func instanceFastPaths(c *caddy.Controller) (*fastPaths, bool) {
	if fp, ok := c.Get(fastPathsKey{}).(*fastPaths); ok {
		return fp, false
	}
	fp := &fastPaths{blocks: map[*dnsserver.Config]*WireCache{}, servers: map[*dnsserver.Server]*fastPath{}}
	c.Set(fastPathsKey{}, fp)
	return fp, true
}

// register lets the fast path answer the hits of wc, the wirecache of the block cfg.
func (f *fastPaths) register(cfg *dnsserver.Config, wc *WireCache) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.blocks[cfg] = wc
}

// notice starts the fast path for the server handling ctx's query, once.
func (f *fastPaths) notice(ctx context.Context) {
	srv, ok := ctx.Value(dnsserver.Key{}).(*dnsserver.Server)
	if !ok {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped {
		return
	}
	if _, seen := f.servers[srv]; seen {
		return
	}
	f.servers[srv] = nil
	blocks := maps.Clone(f.blocks)
	f.starting.Go(func() { f.start(srv, blocks) })
}

func (f *fastPaths) start(srv *dnsserver.Server, blocks map[*dnsserver.Config]*WireCache) {
	routes, local, err := fastRoutes(srv, blocks)
	if err != nil {
		log.Infof("no fast path on %s: %v; its queries go through the plugin chain", srv.Addr, err)
		return
	}
	fp, err := startFastPath(srv, local, routes)
	if err != nil {
		log.Warningf("no fast path on %s: %v; its queries go through the plugin chain", srv.Addr, err)
		return
	}
	f.mu.Lock()
	stopped := f.stopped
	if !stopped {
		f.servers[srv] = fp
	}
	f.mu.Unlock()
	if stopped {
		fp.stop()
		return
	}
	log.Infof("fast path on %s answers hits of %d of its server blocks", srv.Addr, routes.blocks())
}

// stop stops every listener of the instance, letting each finish the queries it has read.
func (f *fastPaths) stop() error {
	f.mu.Lock()
	f.stopped = true
	f.mu.Unlock()
	f.starting.Wait()
	f.mu.Lock()
	var running []*fastPath
	for _, fp := range f.servers {
		if fp != nil {
			running = append(running, fp)
		}
	}
	f.mu.Unlock()
	var wg sync.WaitGroup
	for _, fp := range running {
		wg.Go(fp.stop)
	}
	wg.Wait()
	return nil
}

// fastBlock is a block the fast path answers hits for, with its metrics on the server.
type fastBlock struct {
	wc      *WireCache
	metrics *serverMetrics
}

// fastRouting chooses a query's block as dnsserver.Server.ServeDNS does: the longest zone match, the root
// zone last. A zone whose block the fast path does not answer for maps to nil.
type fastRouting map[string]*fastBlock

// route returns the block for name, lowered and in presentation format, or nil.
func (r fastRouting) route(name string) *fastBlock {
	for off := 0; ; {
		if b, ok := r[name[off:]]; ok {
			return b
		}
		next, end := dns.NextLabel(name, off)
		if end {
			break
		}
		off = next
	}
	return r["."]
}

func (r fastRouting) blocks() int {
	n := 0
	for _, b := range r {
		if b != nil {
			n++
		}
	}
	return n
}

// fastRoutes returns how the fast path of srv routes queries, and the address it listens on; an error says
// why srv gets no fast path.
func fastRoutes(srv *dnsserver.Server, blocks map[*dnsserver.Config]*WireCache) (fastRouting, netip.AddrPort, error) {
	local, err := serverAddrPort(srv.Addr)
	if err != nil {
		return nil, local, err
	}
	zones, opcodes, err := serverZones(srv)
	if err != nil {
		return nil, local, err
	}
	if opcodes > 0 {
		return nil, local, errors.New("a plugin accepts opcodes other than QUERY and NOTIFY on it")
	}
	routes := fastRouting{}
	for zone, cfgs := range zones {
		for _, cfg := range cfgs {
			if len(cfg.FilterFuncs) > 0 || cfg.ViewName != "" {
				return nil, local, fmt.Errorf("server block %q selects queries with a view", zone)
			}
		}
		// Without filters the server picks the zone's first block.
		if wc, ok := blocks[cfgs[0]]; ok {
			routes[zone] = &fastBlock{wc: wc, metrics: wc.metrics.forAddr(srv.Addr, wc.metricsZones)}
		} else {
			routes[zone] = nil
		}
	}
	if routes.blocks() == 0 {
		return nil, local, errors.New("none of its server blocks qualifies")
	}
	return routes, local, nil
}

// serverAddrPort reads a server's address ("dns://169.254.20.10:53"). Only a specific address qualifies:
// on a wildcard one, replies must carry the address each query came to, which CoreDNS's listener reads from
// control messages.
func serverAddrPort(addr string) (netip.AddrPort, error) {
	hostPort, ok := strings.CutPrefix(addr, transport.DNS+"://")
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("%s is not plain DNS", addr)
	}
	ap, err := netip.ParseAddrPort(hostPort)
	if err != nil {
		return ap, fmt.Errorf("listen address %s: %w", hostPort, err)
	}
	if ap.Addr().IsUnspecified() || ap.Addr().Zone() != "" {
		return ap, fmt.Errorf("listen address %s is not a single address (use bind)", hostPort)
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), nil
}

// serverZones reads the blocks a server routes to, by zone, and how many opcodes beyond QUERY and NOTIFY its
// plugins let through. CoreDNS keeps both unexported (Server.zones, Server.allowedOpcodes) and offers no
// accessor; they are read, never written, and only once, when the fast path starts. If a CoreDNS version
// changes them, this fails and the server keeps its queries (TestServerZonesReadsCoreDNS notices first).
func serverZones(srv *dnsserver.Server) (map[string][]*dnsserver.Config, int, error) {
	v := reflect.ValueOf(srv).Elem()
	zones := v.FieldByName("zones")
	if !zones.IsValid() || zones.Type() != reflect.TypeFor[map[string][]*dnsserver.Config]() {
		return nil, 0, errors.New("this CoreDNS version's server does not keep its blocks where wirecache reads them")
	}
	opcodes := v.FieldByName("allowedOpcodes")
	if !opcodes.IsValid() || opcodes.Kind() != reflect.Map {
		return nil, 0, errors.New("this CoreDNS version's server does not keep its opcodes where wirecache reads them")
	}
	out := make(map[string][]*dnsserver.Config, zones.Len())
	for it := zones.MapRange(); it.Next(); {
		list := it.Value()
		cfgs := make([]*dnsserver.Config, list.Len())
		for i := range cfgs {
			// A read-only value (unexported field): its pointer is readable, not its interface.
			cfgs[i] = (*dnsserver.Config)(list.Index(i).UnsafePointer())
		}
		if len(cfgs) > 0 {
			out[it.Key().String()] = cfgs
		}
	}
	return out, opcodes.Len(), nil
}

// cacheBypassable is implemented by a plugin that runs ahead of wirecache and does nothing to a query
// wirecache answers from its store (notrack: it answers only its own probes, which are never stored), so
// that the fast path may answer such a query without running it.
type cacheBypassable interface {
	BypassedByCacheHits() bool
}

// fastPathReasons says why the fast path may not answer hits of the block of cfg; none means it may. The
// fast path skips every plugin the server block runs ahead of wirecache, so each must be bypassable.
func fastPathReasons(cfg *dnsserver.Config, order []string) []string {
	var reasons []string
	for _, name := range order {
		if name == pluginName {
			break
		}
		h := cfg.Handler(name)
		if h == nil {
			continue
		}
		if b, ok := h.(cacheBypassable); !ok || !b.BypassedByCacheHits() {
			reasons = append(reasons, name+" runs ahead of wirecache")
		}
	}
	return slices.Clip(reasons)
}
