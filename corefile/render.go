package corefile

import (
	"strconv"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/bytesize"
)

// staleDuration writes a serve_stale duration in its largest whole unit: "1h", "30m", "5s", "1500ms".
func staleDuration(d time.Duration) string {
	switch {
	case d > 0 && d%time.Hour == 0:
		return strconv.FormatInt(int64(d/time.Hour), 10) + "h"
	case d > 0 && d%time.Minute == 0:
		return strconv.FormatInt(int64(d/time.Minute), 10) + "m"
	case d%time.Second == 0:
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	}
	return d.String()
}

// reverseZones are served like the cluster domain, since the cluster DNS answers PTR queries for Pod and
// Service IPs.
var reverseZones = []string{"in-addr.arpa", "ip6.arpa"}

// Render returns the Corefile for c. It is Expand applied to Template(c) with c's Expansion and kube-dns
// settings: the same path a node-cache started with flags takes, so both produce the same Corefile.
func Render(c Config) ([]byte, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	base, err := Template(c)
	if err != nil {
		return nil, err
	}
	return Expand(base, c.Expansion(), c.kubeDNS())
}

// Template returns c as a node-local-dns ConfigMap Corefile: everything fixed is written out, and what
// node-cache fills in at start is a template variable (LocalDNSVar, DNSServerVar, ClusterDNSVar,
// UpstreamServersVar, PrometheusEndpointVar). The notrack and upstreamsvc directives are not in it: the
// node-cache flags add them.
func Template(c Config) ([]byte, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	c = c.withDefaults()
	port := ":" + strconv.Itoa(int(c.Port))

	bind := &Directive{Name: "bind", Args: []string{LocalDNSVar}}
	if c.Mode == ModeIPTables {
		bind.Args = append(bind.Args, DNSServerVar)
	}
	clusterForward := func() *Directive {
		d := &Directive{Name: "forward", Args: []string{".", ClusterDNSVar}}
		if !c.PreferUDP {
			d.Block = []*Directive{{Name: "force_tcp"}}
		}
		if c.MaxAttempts > 0 {
			d.Block = append(d.Block, &Directive{Name: "max_connect_attempts", Args: ints(c.MaxAttempts)})
		}
		return d
	}
	prometheus := &Directive{Name: "prometheus", Args: []string{PrometheusEndpointVar}}
	// caches returns the head of a block (errors, and log or its cache) and the directives that cache its
	// answers: wirecache with the block's share of the budget, or, in a block with log or without
	// wirecache, the cache plugin (fallback).
	caches := func(share int64, log bool, fallback *Directive) (head, cache []*Directive) {
		head = []*Directive{{Name: "errors"}}
		if log {
			head = append(head, &Directive{Name: "log"})
		}
		if log || c.WireCache.Disabled {
			return head, []*Directive{fallback}
		}
		return append(head, wireCache(c, share)), nil
	}
	// otherClamp keeps the TTLs of the other blocks inside [5, OtherTTL], the window their `cache TTL`
	// kept the cache's entries in.
	otherClamp := &Directive{Name: "clamp", Block: []*Directive{
		{Name: "success", Args: ints(min(5, c.Cache.OtherTTL), c.Cache.OtherTTL)},
		{Name: "denial", Args: ints(min(5, c.Cache.OtherTTL), c.Cache.OtherTTL)},
	}}
	otherCache := &Directive{Name: "cache", Args: []string{strconv.Itoa(c.Cache.OtherTTL)}}
	if !c.ServeStale.Disabled {
		otherCache.Block = cacheServeStale(c.ServeStale)
	}
	other := func(share int64) []*Directive {
		head, cache := caches(share, false, otherCache)
		if cache != nil {
			return append(head, cache...)
		}
		return append(head, otherClamp)
	}
	tail := []*Directive{{Name: "reload"}, {Name: "loop"}, bind}

	f := &File{}
	cluster := &Block{Keys: []string{c.ClusterDomain + port}}
	head, cache := caches(c.Cache.Memory*blockShares.cluster/blockShares.total, c.Log, clusterCache(c))
	cluster.Directives = append(head,
		&Directive{Name: "clamp", Block: []*Directive{
			{Name: "success", Args: ints(c.Clamp.SuccessMin, c.Clamp.SuccessMax)},
			{Name: "denial", Args: ints(c.Clamp.DenialMin, c.Clamp.DenialMax)},
		}},
	)
	cluster.Directives = append(cluster.Directives, cache...)
	cluster.Directives = append(cluster.Directives, tail...)
	cluster.Directives = append(cluster.Directives, clusterForward(), prometheus,
		&Directive{Name: "health", Args: []string{LocalDNSVar + ":" + strconv.Itoa(int(c.HealthPort))}},
		&Directive{Name: "ready", Args: []string{LocalDNSVar + ":" + strconv.Itoa(int(c.ReadyPort))}},
	)
	f.Blocks = append(f.Blocks, cluster)

	for _, zone := range reverseZones {
		b := &Block{Keys: []string{zone + port}}
		b.Directives = append(other(c.Cache.Memory*blockShares.reverse/blockShares.total), tail...)
		b.Directives = append(b.Directives, clusterForward(), prometheus)
		f.Blocks = append(f.Blocks, b)
	}

	root := &Block{Keys: []string{"." + port}}
	root.Directives = append(other(c.Cache.Memory*blockShares.root/blockShares.total), tail...)
	root.Directives = append(root.Directives, &Directive{Name: "forward", Args: []string{".", UpstreamServersVar}}, prometheus)
	f.Blocks = append(f.Blocks, root)

	// Blocks share some directive values above; that is fine for a tree that is only printed.
	return f.Format(), nil
}

// blockShares split Cache.Memory over the blocks, in sixteenths: most of it to the cluster domain, whose
// names every Pod asks, a quarter to everything else, and a sixteenth to each reverse zone.
var blockShares = struct{ cluster, root, reverse, total int64 }{cluster: 10, root: 4, reverse: 1, total: 16}

// wireCacheBytesPerEntry is the share of a block's budget its default entry count allows each entry: below
// what the smallest answers count against the budget (about 300 bytes: an A answer of a short name), so
// that the bytes bind first.
const wireCacheBytesPerEntry = 256

// wireCache is a block's wirecache: at most share bytes of answers, an entry count that lets the bytes bind
// first, and serve_stale.
func wireCache(c Config, share int64) *Directive {
	capacity := c.WireCache.Capacity
	if capacity == 0 {
		capacity = int(share / wireCacheBytesPerEntry)
	}
	d := &Directive{Name: "wirecache", Block: []*Directive{
		{Name: "capacity", Args: []string{strconv.Itoa(capacity)}},
		{Name: "max_memory", Args: []string{bytesize.Format(share)}},
	}}
	if c.WireCache.TCPConnections != 0 || c.WireCache.TCPConnectionsPerClient != 0 {
		total, perClient := c.WireCache.tcpConnections()
		d.Block = append(d.Block, &Directive{Name: "tcp_connections", Args: []string{strconv.Itoa(total), strconv.Itoa(perClient)}})
	}
	if !c.ServeStale.Disabled {
		d.Block = append(d.Block, wireCacheServeStale(c.ServeStale))
	}
	return d
}

// tcpConnections returns the bounds on TCP connections, wirecache's defaults where w leaves them.
func (w WireCache) tcpConnections() (total, perClient int) {
	total, perClient = w.TCPConnections, w.TCPConnectionsPerClient
	if total == 0 {
		total = defaultTCPConnections
	}
	if perClient == 0 {
		perClient = min(total, defaultTCPConnectionsPerClient)
	}
	return total, perClient
}

// clusterCache is the cluster-domain block's cache plugin, where wirecache is not (log, or no wirecache):
// capacities and TTL caps per kind, and serve_stale.
func clusterCache(c Config) *Directive {
	d := &Directive{Name: "cache", Block: []*Directive{
		{Name: "success", Args: ints(c.Cache.SuccessCapacity, c.Cache.SuccessTTL)},
		{Name: "denial", Args: ints(c.Cache.DenialCapacity, c.Cache.DenialTTL)},
	}}
	if !c.ServeStale.Disabled {
		d.Block = append(d.Block, cacheServeStale(c.ServeStale)...)
	}
	return d
}

// cacheServeStale is the cache plugin's serve_stale for s: serve an expired answer for s.For, after
// asking the upstream first (verify) for at most s.Verify, with TTL s.TTL. verify, not immediate: while the
// upstream answers, an expired answer is refreshed before it goes out, so no client sees a stale answer
// the upstream could have replaced. With s.PreferPositive, serve_stale_policy prefer_positive follows.
func cacheServeStale(s ServeStale) []*Directive {
	s = s.withDefaults()
	out := []*Directive{{Name: "serve_stale", Args: []string{staleDuration(s.For), "verify", staleDuration(s.Verify), staleDuration(s.TTL)}}}
	if s.PreferPositive {
		out = append(out, cachePreferPositive())
	}
	return out
}

// cachePreferPositive is the cache plugin's policy that keeps a positive answer over a refresh that turns
// NXDOMAIN or empty (CoreDNS v1.15 plugin/cache, serve_stale_policy).
func cachePreferPositive() *Directive {
	return &Directive{Name: "serve_stale_policy", Args: []string{"prefer_positive"}}
}

// wireCacheServeStale is wirecache's serve_stale for s: its expired entries answer, with TTL s.TTL, when
// the plugins after it fail or have not answered within s.Verify, as the cache plugin's would; with
// s.PreferPositive also when the chain's answer turns NXDOMAIN or empty for an entry that had records.
func wireCacheServeStale(s ServeStale) *Directive {
	s = s.withDefaults()
	d := &Directive{Name: "serve_stale", Args: []string{staleDuration(s.For), staleDuration(s.TTL), staleDuration(s.Verify)}}
	if s.PreferPositive {
		d.Args = append(d.Args, "prefer_positive")
	}
	return d
}

// Expansion returns what node-cache's flags would fill into Template(c): the values of the template
// variables and the notrack and upstreamsvc directives.
func (c Config) Expansion() Expansion {
	c = c.withDefaults()
	e := Expansion{
		LocalIPs:           c.listenIPs(),
		DNSDomain:          c.ClusterDomain,
		PrometheusEndpoint: c.MetricsAddress,
		Port:               c.Port,
	}
	u := c.Upstream
	e.Upstream = &u
	if !c.ServeStale.Disabled {
		s := c.ServeStale
		e.ServeStale = &s
	}
	if !c.Notrack.Disabled {
		n := c.Notrack
		e.Notrack = &n
		e.NotrackPorts = []uint16{c.HealthPort}
	}
	return e
}

func ints(vs ...int) []string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = strconv.Itoa(v)
	}
	return out
}
