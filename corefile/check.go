package corefile

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/nodelocaldns/nodelocaldns/internal/bytesize"
)

// Hazard is a Corefile line that breaks or endangers a node, with what to do about it.
type Hazard struct {
	// Line is the Corefile line of the directive or block at fault.
	Line int
	// Kind names the hazard, one of the Hazard* constants.
	Kind string
	// Problem says what goes wrong on the node.
	Problem string
	// Fix says how to change the Corefile (or the node).
	Fix string
}

func (h Hazard) String() string {
	return fmt.Sprintf("line %d: %s: %s; fix: %s", h.Line, h.Kind, h.Problem, h.Fix)
}

// The hazards Check finds.
const (
	HazardResolvLoop     = "resolv-loop"
	HazardNoLoop         = "no-loop"
	HazardClusterUDP     = "cluster-udp"
	HazardNoBind         = "no-bind"
	HazardWildcardBind   = "wildcard-bind"
	HazardOpenListener   = "open-listener"
	HazardIPv6Port       = "ipv6-port"
	HazardCacheMemory    = "cache-memory"
	defaultCacheCapacity = 9984 // CoreDNS's 10000, rounded down to its 256 shards
)

// Memory a node cache needs, measured on amd64 with CoreDNS v1.15.0:
//   - baseBytes: resident memory of the build the manifests run (static, stripped, GOGC=50) serving the
//     rendered iptables Corefile on the simulated node with empty caches: 20.2 to 23.3 MiB at start
//     (bench/memory.sh, bench/flood.sh), rounded up.
//   - cacheEntryBytes: resident memory per cache plugin entry. BenchmarkCacheEntryMemory measures 495 heap
//     bytes for a positive entry and 535 for a negative one; filling both caches of upstream's cluster block
//     (19968 entries) raised the resident size by 23.4 MB, 1170 bytes an entry, 2.2 times the heap figure.
//     An entry of a larger answer takes more (BenchmarkLargeAnswerMemory): the cache plugin bounds entries,
//     not bytes, so this is the usual case, not a bound.
//   - wirecache bounds the heap its entries hold per block, by max_memory and by capacity times its
//     largest entry; residentPerHeap turns that bound into resident memory: under bench/flood.sh, which
//     fills 10.5 MiB of the rendered Corefile's 12 MiB with 3.9 KiB answers, the peak grew by 1.7 times
//     the bytes filled (the collector's headroom at GOGC=50 and the binary's pages serving touches).
//   - tcpConnectionBytes: resident memory per TCP connection a client holds open (a goroutine, a file
//     descriptor, the read buffer): the hostile tier held 2,500 connections with about 5.5 KiB each, rounded
//     up. wirecache's fast path bounds them (tcp_connections MAX); the cache holds that many at worst, and
//     up to maxHeldRefusals refused ones before their reset, at tcpHeldBytes each (a descriptor, its poller
//     entry and a timer; no goroutine).
const (
	baseBytes          = 24 << 20
	cacheEntryBytes    = 1200
	residentPerHeap    = 2.0
	tcpConnectionBytes = 6 << 10
	tcpHeldBytes       = 1 << 10
)

// The wirecache plugin's defaults (DefaultCapacity, DefaultMaxMemory), and a bound on its largest entry in
// heap bytes (MinMaxMemory, about 10 KiB, which moves with the entry's fields). A test keeps them in step.
const (
	defaultWireCacheCapacity  = 10000
	defaultWireCacheMaxMemory = 8 << 20
	wireCacheMaxEntryBytes    = 11 << 10
	// defaultTCPConnections and defaultTCPConnectionsPerClient are wirecache's DefaultTCPConnections and
	// DefaultTCPConnectionsPerClient.
	defaultTCPConnections          = 1024
	defaultTCPConnectionsPerClient = 128
	// maxHeldRefusals is wirecache's MaxHeldRefusals.
	maxHeldRefusals = 1024
)

// CheckOptions tells Check about the node the Corefile will run on. Every field is optional; a check
// without the facts it needs is skipped.
type CheckOptions struct {
	// ClusterDomain is the cluster's domain; default cluster.local.
	ClusterDomain string
	// ResolvConf is the resolv.conf the node cache reads for `forward . /etc/resolv.conf`: with dnsPolicy
	// Default, the kubelet's --resolv-conf.
	ResolvConf []byte
	// MemoryLimit is the container's memory limit in bytes.
	MemoryLimit int64
}

// Check reads a Corefile, or a node-cache template with __PILLAR__ variables in it, and returns its
// hazards in line order. The error is for a Corefile it cannot parse.
func Check(corefile []byte, opts CheckOptions) ([]Hazard, error) {
	f, err := Parse(corefile)
	if err != nil {
		return nil, err
	}
	if opts.ClusterDomain == "" {
		opts.ClusterDomain = DefaultClusterDomain
	}
	c := &checker{opts: opts, file: f}
	c.collectLocal()
	for _, b := range f.Blocks {
		if len(b.Keys) == 1 && strings.HasPrefix(b.Keys[0], "(") {
			continue // a snippet; it is checked where it is imported, which Check does not follow
		}
		c.bind(b)
		c.loop(b)
		c.clusterTransport(b)
		c.listeners(b)
		c.forwardTargets(b)
	}
	c.cacheMemory()
	slices.SortStableFunc(c.hazards, func(a, b Hazard) int { return a.Line - b.Line })
	return c.hazards, nil
}

type checker struct {
	opts    CheckOptions
	file    *File
	hazards []Hazard
	// local are the addresses the Corefile binds, which must never be its own upstream.
	local []netip.Addr
	// anyLocal is set when some block binds every address, so any address of the node loops back.
	anyLocal bool
}

func (c *checker) add(line int, kind, problem, fix string) {
	c.hazards = append(c.hazards, Hazard{Line: line, Kind: kind, Problem: problem, Fix: fix})
}

func (c *checker) collectLocal() {
	for _, b := range c.file.Blocks {
		binds := b.Find("bind")
		if len(binds) == 0 {
			c.anyLocal = true
		}
		for _, d := range binds {
			for _, a := range d.Args {
				if ip, err := netip.ParseAddr(strings.Trim(a, "[]")); err == nil {
					if ip.IsUnspecified() {
						c.anyLocal = true
					}
					c.local = append(c.local, ip)
				}
			}
		}
	}
}

// isLocal reports whether the node cache itself listens on ip.
func (c *checker) isLocal(ip netip.Addr) bool {
	return slices.Contains(c.local, ip) || (c.anyLocal && (ip.IsLoopback() || ip.IsUnspecified()))
}

func (c *checker) bind(b *Block) {
	binds := b.Find("bind")
	if len(binds) == 0 {
		c.add(b.Line, HazardNoBind, fmt.Sprintf("server block %s has no bind, so it answers on every address "+
			"of the node: an open resolver on the node's own IPs", strings.Join(b.Keys, " ")),
			"add `bind` with the node-local address (and, in iptables mode, the kube-dns ClusterIP)")
		return
	}
	for _, d := range binds {
		for _, a := range d.Args {
			if ip, err := netip.ParseAddr(strings.Trim(a, "[]")); err == nil && ip.IsUnspecified() {
				c.add(d.Line, HazardWildcardBind, fmt.Sprintf("bind %s listens on every address of the node: an "+
					"open resolver on the node's own IPs, and a clash with any other DNS server there", a),
					"bind only the node-local address (and, in iptables mode, the kube-dns ClusterIP)")
			}
		}
	}
}

func (c *checker) loop(b *Block) {
	if b.Has("loop") {
		return
	}
	for _, name := range []string{"forward", "upstreamsvc"} {
		if ds := b.Find(name); len(ds) > 0 {
			c.add(b.Line, HazardNoLoop, fmt.Sprintf("server block %s forwards (line %d) without the loop plugin: "+
				"a forwarding loop spins at full CPU until the pod is killed instead of stopping at start",
				strings.Join(b.Keys, " "), ds[0].Line), "add `loop` to the block")
			return
		}
	}
}

// clusterZone reports whether a block serves the cluster domain or a reverse zone, whose misses go to the
// cluster DNS through a Service.
func (c *checker) clusterZone(b *Block) bool {
	for _, k := range b.Keys {
		zone, _, ok := splitKey(k)
		if !ok {
			continue
		}
		if zone == strings.ToLower(strings.TrimSuffix(c.opts.ClusterDomain, ".")) || zone == strings.ToLower(DNSDomainVar) ||
			slices.Contains(reverseZones, zone) {
			return true
		}
	}
	return false
}

func (c *checker) clusterTransport(b *Block) {
	if !c.clusterZone(b) {
		return
	}
	for _, d := range b.Find("forward") {
		if slices.Contains(d.Args, ResolvConf) || slices.Contains(d.Args, UpstreamServersVar) {
			continue // not the cluster DNS
		}
		if d.Option("force_tcp") == nil || d.Option("prefer_udp") != nil {
			c.add(d.Line, HazardClusterUDP, "the forward to the cluster DNS uses UDP: through the Service DNAT, "+
				"conntrack races drop UDP queries, the timeouts a node cache exists to remove",
				"add `force_tcp` in the forward's block (or use upstreamsvc, which defaults to TCP)")
		}
	}
	for _, d := range b.Find("upstreamsvc") {
		if d.Option("prefer_udp") != nil {
			c.add(d.Line, HazardClusterUDP, "upstreamsvc prefers UDP to the cluster DNS, the path that "+
				"loses queries to conntrack races", "use `force_tcp` (the default) instead of `prefer_udp`")
		}
	}
}

// listeners finds health, ready and prometheus listening on every address of the node.
func (c *checker) listeners(b *Block) {
	for _, name := range []string{"health", "ready", "prometheus"} {
		for _, d := range b.Find(name) {
			addr := ""
			if len(d.Args) > 0 {
				addr = d.Args[0]
			} else if name == "prometheus" {
				continue // defaults to localhost:9153
			}
			if strings.Contains(addr, "__") {
				continue // a template variable, filled in with a local address
			}
			host, _, err := net.SplitHostPort(addr)
			if err != nil && addr != "" {
				if strings.Count(addr, ":") > 1 && !strings.HasPrefix(addr, "[") {
					c.add(d.Line, HazardIPv6Port, fmt.Sprintf("%s %s: an IPv6 address with a port needs brackets; "+
						"CoreDNS refuses to start", name, addr), "write "+bracketHint(addr))
				}
				continue
			}
			ip, perr := netip.ParseAddr(host)
			if host == "" || (perr == nil && ip.IsUnspecified()) {
				shown := addr
				if shown == "" {
					shown = "(default :8080)"
					if name == "ready" {
						shown = "(default :8181)"
					}
				}
				c.add(d.Line, HazardOpenListener, fmt.Sprintf("%s %s listens on every address of the node, "+
					"reachable from outside it", name, shown),
					fmt.Sprintf("give %s the node-local address, e.g. `%s 169.254.20.10:PORT`, or for prometheus the "+
						"node's own IP through -prometheus-listen-address", name, name))
			}
		}
	}
}

// forwardTargets finds loops through resolv.conf, forwards to the cache itself, and ambiguous IPv6.
func (c *checker) forwardTargets(b *Block) {
	targets := func(d *Directive) []string {
		switch d.Name {
		case "forward":
			if len(d.Args) > 1 {
				return d.Args[1:]
			}
		case "upstreamsvc":
			if o := d.Option("fallback"); o != nil {
				return o.Args
			}
		}
		return nil
	}
	for _, d := range b.Directives {
		for _, t := range targets(d) {
			switch {
			case t == ResolvConf || t == UpstreamServersVar:
				c.resolvLoop(d)
			case strings.Contains(t, "__"):
			default:
				c.target(d, t)
			}
		}
	}
}

func (c *checker) target(d *Directive, t string) {
	addr := strings.TrimPrefix(t, "dns://")
	if ip, err := netip.ParseAddr(addr); err == nil {
		if suspectPort(addr) {
			c.add(d.Line, HazardIPv6Port, fmt.Sprintf("%s %s reads as the IPv6 address %s on port 53; if the "+
				"last group is a port, it is being ignored", d.Name, t, ip),
				fmt.Sprintf("write %s for a port, or [%s] for the address", bracketHint(addr), addr))
		}
		if c.isLocal(ip) {
			c.add(d.Line, HazardResolvLoop, fmt.Sprintf("%s sends queries to %s, an address the node cache "+
				"itself listens on: a forwarding loop", d.Name, t), "forward to the cluster DNS or the node's "+
				"real resolvers instead")
		}
		return
	}
	if host, _, err := net.SplitHostPort(addr); err == nil {
		if ip, err := netip.ParseAddr(host); err == nil && c.isLocal(ip) {
			c.add(d.Line, HazardResolvLoop, fmt.Sprintf("%s sends queries to %s, an address the node cache "+
				"itself listens on: a forwarding loop", d.Name, t), "forward to the cluster DNS or the node's "+
				"real resolvers instead")
		}
	}
}

// suspectPort reports an unbracketed IPv6 address whose last group reads as a port: "fd00::10:53" is the
// address fd00::10:53, which is rarely what was meant.
func suspectPort(addr string) bool {
	i := strings.LastIndex(addr, ":")
	if i < 0 || strings.Count(addr, ":") < 2 {
		return false
	}
	last := addr[i+1:]
	if _, err := strconv.ParseUint(last, 10, 16); err != nil || len(last) < 2 {
		return false
	}
	_, err := netip.ParseAddr(addr[:i])
	return err == nil
}

func bracketHint(addr string) string {
	i := strings.LastIndex(addr, ":")
	return "[" + addr[:i] + "]" + addr[i:]
}

// resolvLoop finds a forward to resolv.conf on a node whose resolv.conf names the node cache.
func (c *checker) resolvLoop(d *Directive) {
	if c.opts.ResolvConf == nil {
		return
	}
	for _, ns := range resolvConfNameservers(c.opts.ResolvConf) {
		if c.isLocal(ns) {
			c.add(d.Line, HazardResolvLoop, fmt.Sprintf("%s reads %s, whose nameserver %s is the node cache "+
				"itself: every query outside the cluster loops until it times out", d.Name, ResolvConf, ns),
				"point the kubelet's --resolv-conf (what dnsPolicy Default gives the pod) at a file with the "+
					"node's real resolvers, or set upstreamNameservers in the kube-dns ConfigMap")
			return
		}
	}
}

func resolvConfNameservers(data []byte) []netip.Addr {
	var out []netip.Addr
	s := bufio.NewScanner(bytes.NewReader(data))
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) >= 2 && fields[0] == "nameserver" {
			if ip, err := netip.ParseAddr(fields[1]); err == nil {
				out = append(out, ip.WithZone(""))
			}
		}
	}
	return out
}

// cacheMemory compares the entries every cache may hold with the memory limit.
func (c *checker) cacheMemory() {
	if c.opts.MemoryLimit <= 0 {
		return
	}
	entries, wireEntries, line := 0, 0, 0
	var wireHeap int64
	// connections is the bound on TCP connections: the largest of the wirecaches' (the fast path takes it).
	connections := 0
	for _, b := range c.file.Blocks {
		for _, d := range b.Find("cache") {
			success, denial := defaultCacheCapacity, defaultCacheCapacity
			for _, o := range d.Block {
				if len(o.Args) == 0 {
					continue
				}
				n, err := strconv.Atoi(o.Args[0])
				if err != nil {
					continue
				}
				switch o.Name {
				case "success":
					success = shardedCapacity(n)
				case "denial":
					denial = shardedCapacity(n)
				}
			}
			entries += success + denial
			if line == 0 {
				line = d.Line
			}
		}
		// wirecache steps aside in a block with log, and then holds nothing.
		for _, d := range b.Find("wirecache") {
			if b.Has("log") {
				continue
			}
			capacity, maxMemory := defaultWireCacheCapacity, int64(defaultWireCacheMaxMemory)
			if o := d.Option("capacity"); o != nil && len(o.Args) == 1 {
				if n, err := strconv.Atoi(o.Args[0]); err == nil {
					capacity = n
				}
			}
			if o := d.Option("max_memory"); o != nil && len(o.Args) == 1 {
				if n, err := bytesize.Parse(o.Args[0]); err == nil {
					maxMemory = n
				}
			}
			wireEntries += capacity
			wireHeap += min(int64(capacity)*wireCacheMaxEntryBytes, maxMemory)
			bound := defaultTCPConnections
			if o := d.Option("tcp_connections"); o != nil && len(o.Args) >= 1 {
				if n, err := strconv.Atoi(o.Args[0]); err == nil {
					bound = n
				}
			}
			connections = max(connections, bound)
			if line == 0 {
				line = d.Line
			}
		}
	}
	need := int64(baseBytes) + int64(entries)*cacheEntryBytes + int64(float64(wireHeap)*residentPerHeap)
	if connections > 0 {
		need += int64(connections)*tcpConnectionBytes + maxHeldRefusals*tcpHeldBytes
	}
	if entries+wireEntries == 0 || need <= c.opts.MemoryLimit {
		return
	}
	var held []string
	if wireEntries > 0 {
		held = append(held, fmt.Sprintf("wirecache holds up to %d entries, at most %d MiB of answers, and up to %d TCP connections",
			wireEntries, wireHeap>>20, connections))
	}
	if entries > 0 {
		held = append(held, fmt.Sprintf("the cache plugin holds up to %d entries, bounded in number only (usual "+
			"answers assumed; large ones take more)", entries))
	}
	c.add(line, HazardCacheMemory, fmt.Sprintf("%s; full, the node cache needs about %d MiB, above the %d MiB memory "+
		"limit, and is OOM-killed (a DNS outage on the node) once they fill", strings.Join(held, ", and "), need>>20, c.opts.MemoryLimit>>20),
		fmt.Sprintf("raise the limit to at least %d MiB or lower wirecache's max_memory and tcp_connections (and the cache plugin's capacities)", (need>>20)+1))
}

// shardedCapacity is what CoreDNS's cache really holds for a capacity: 256 shards of at least 4 entries.
func shardedCapacity(n int) int { return max(n/256, 4) * 256 }
