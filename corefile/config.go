package corefile

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Mode is how kube-proxy routes Service traffic on the node, which decides what the node cache may bind.
type Mode string

const (
	// ModeIPTables: kube-proxy DNATs Service IPs in iptables, so the node cache binds the kube-dns ClusterIP
	// as well as its link-local address, and pods keep using the ClusterIP unchanged.
	ModeIPTables Mode = "iptables"
	// ModeIPVS: the ClusterIP already sits on kube-ipvs0 and IPVS takes its traffic, so the node cache binds
	// only the link-local address and the kubelet's --cluster-dns must point there.
	ModeIPVS Mode = "ipvs"
)

// Defaults of a node cache, the values upstream's nodelocaldns.yaml uses.
const (
	DefaultClusterDomain   = "cluster.local"
	DefaultPort            = 53
	DefaultHealthPort      = 8080
	DefaultReadyPort       = 8181
	DefaultMetricsPort     = 9253
	DefaultUpstreamService = "kube-dns-upstream"
	DefaultNamespace       = "kube-system"
	DefaultInterface       = "nodelocaldns"
	// ResolvConf is what the `.` block forwards to when the kube-dns ConfigMap names no upstreamNameservers.
	ResolvConf = "/etc/resolv.conf"
)

// Config is a node cache's configuration; Render turns it into a Corefile. The zero value of every field
// means the default named in its comment.
type Config struct {
	// ClusterDomain is the cluster's DNS domain; default cluster.local.
	ClusterDomain string
	// LocalIPs are the node-local addresses the cache answers on, e.g. 169.254.20.10 and, on a dual-stack
	// or IPv6 cluster, an IPv6 address. The first one also carries health, ready and, by default, metrics.
	LocalIPs []netip.Addr
	// ClusterDNSIPs are the kube-dns Service's ClusterIPs. In iptables mode the cache binds them too.
	ClusterDNSIPs []netip.Addr
	// Mode is kube-proxy's mode; default iptables.
	Mode Mode
	// Port is the DNS port of every block; default 53.
	Port uint16

	// Upstream is where cluster-domain and reverse-zone misses go.
	Upstream Upstream
	// PreferUDP sends those misses over UDP first. The default is TCP: UDP through the Service DNAT is
	// where conntrack races lose queries, the failure a node cache exists to avoid.
	PreferUDP bool
	// MaxAttempts is how many times one of those misses is sent to the cluster DNS at most, every copy
	// counted, before the client gets SERVFAIL (upstreamsvc's max_attempts, written as the cluster forward's
	// max_connect_attempts); 0 means upstreamsvc's default, 2.
	MaxAttempts int
	// NodeUpstreams are the kube-dns ConfigMap's upstreamNameservers: the `.` block forwards to them over
	// UDP. Empty means the node's resolv.conf.
	NodeUpstreams []string
	// StubDomains are the kube-dns ConfigMap's stubDomains: one block per domain, forwarding to its servers.
	StubDomains map[string][]string

	// Cache sizes the CoreDNS caches.
	Cache Cache
	// Clamp bounds the TTLs clients see for cluster-domain answers.
	Clamp Clamp
	// WireCache configures the hit cache in front of every block.
	WireCache WireCache
	// ServeStale configures the answers the caches give while the upstream does not answer.
	ServeStale ServeStale
	// Log adds the log plugin to the cluster-domain block (and takes wirecache out of it, since a query
	// answered by wirecache is never logged).
	Log bool

	// HealthPort is the health plugin's port on the first local address; default 8080.
	HealthPort uint16
	// ReadyPort is the ready plugin's port on the first local address; default 8181.
	ReadyPort uint16
	// MetricsAddress is the prometheus plugin's HOST:PORT; default the first local address, port 9253.
	MetricsAddress string

	// Notrack configures the notrack directive in every block.
	Notrack Notrack
}

// Upstream is the Service in front of the cluster DNS pods that the upstreamsvc plugin forwards to.
type Upstream struct {
	// Service is the Service's name; default kube-dns-upstream.
	Service string
	// Namespace is the Service's namespace; default kube-system.
	Namespace string
	// Fallback are the addresses to use until the Service's endpoints are known, typically its ClusterIP.
	Fallback []string
}

// Cache sizes the caches. Where wirecache is in a block (every block, unless WireCache.Disabled, or Log for
// the cluster block), it is the block's only cache and holds a share of Memory; CoreDNS's cache plugin, which
// bounds its entries in number only, is left out. The capacities below size the cache plugin where it is
// used instead.
type Cache struct {
	// Memory is the byte budget of the answers the caches hold, counted as wirecache counts its entries'
	// heap (max_memory), split over the blocks by blockShares; default DefaultCacheMemory. Each stub domain
	// adds a copy of the `.` block, and its share.
	Memory int64
	// SuccessCapacity and SuccessTTL bound positive cluster-domain answers; default 9984 entries, 30s.
	SuccessCapacity int
	SuccessTTL      int
	// DenialCapacity and DenialTTL bound negative cluster-domain answers; default 9984 entries, 5s.
	DenialCapacity int
	DenialTTL      int
	// OtherTTL is the TTL cap of the other blocks (their clamp's MAX, or their `cache TTL`); default 30s.
	OtherTTL int
}

// DefaultCacheMemory is the default byte budget of the caches: with the Go collector's headroom (GOGC=50)
// and the process's own 20 to 30 MiB it fits the manifests' 56 MiB memory request (examples/kubernetes,
// Memory).
const DefaultCacheMemory = 12 << 20

// MinCacheMemory is the least Cache.Memory: the smallest share, a sixteenth, must hold one entry of the
// largest size wirecache stores (its MinMaxMemory, about 10 KiB).
const MinCacheMemory = 16 * wireCacheMaxEntryBytes

// Clamp is the TTL window of cluster-domain answers, in seconds.
type Clamp struct {
	// SuccessMin and SuccessMax default to 5 and Cache.SuccessTTL.
	SuccessMin, SuccessMax int
	// DenialMin and DenialMax default to 5 and Cache.DenialTTL.
	DenialMin, DenialMax int
}

// WireCache configures the wirecache plugin, each block's cache.
type WireCache struct {
	// Disabled leaves wirecache out of every block; CoreDNS's cache plugin caches instead, bounded in
	// entries (Cache's capacities), not in bytes.
	Disabled bool
	// Capacity is its entry count per block; zero means one entry per 256 bytes of the block's share of
	// Cache.Memory, less than the smallest answers count, so that the bytes bind first.
	Capacity int
	// TCPConnections and TCPConnectionsPerClient bound the TCP connections the cache holds open at once,
	// in all and from one client address (every wirecache's tcp_connections); zero leaves wirecache's
	// default (1024, and 128 or TCPConnections if lower).
	TCPConnections, TCPConnectionsPerClient int
}

// ServeStale is serving expired answers while the upstream does not answer (RFC 8767): the serve_stale of
// every cache and wirecache. The zero value is the default: an hour, TTL 5 s, a 1 s wait for the upstream.
type ServeStale struct {
	// Disabled leaves serve_stale out: an answer is never served past its TTL.
	Disabled bool
	// For is how long past its expiry an answer may still be served; default 1h.
	For time.Duration
	// TTL is the TTL of a stale answer, whole seconds; default 5s, clamp's default MIN, so clients ask
	// again soon and see the upstream's answer within seconds of its return.
	TTL time.Duration
	// Verify is how long the cache waits for the upstream to refresh an expired answer before it serves
	// the answer stale (the refresh goes on and updates the cache when it succeeds); default 1s.
	Verify time.Duration
	// PreferPositive keeps a name's last positive answer when its refresh turns NXDOMAIN or empty
	// (kubernetes/dns#747: a cluster DNS that restarts, or loses its API server, answers NXDOMAIN for names
	// that exist): the cache's serve_stale_policy prefer_positive and wirecache's prefer_positive. The
	// positive answer is then served, with TTL, for up to For past its expiry, so a name that was really
	// deleted keeps resolving that long too; off by default.
	PreferPositive bool
}

// Defaults of ServeStale.
const (
	DefaultServeStaleFor    = time.Hour
	DefaultServeStaleTTL    = 5 * time.Second
	DefaultServeStaleVerify = time.Second
)

func (s ServeStale) withDefaults() ServeStale {
	if s.For == 0 {
		s.For = DefaultServeStaleFor
	}
	if s.TTL == 0 {
		s.TTL = DefaultServeStaleTTL
	}
	if s.Verify == 0 {
		s.Verify = DefaultServeStaleVerify
	}
	return s
}

// Validate reports what makes s impossible to write into a Corefile.
func (s ServeStale) Validate() error {
	var errs []error
	if s.For < 0 || s.Verify < 0 || s.TTL < 0 {
		errs = append(errs, fmt.Errorf("serve_stale durations are negative: for %v, TTL %v, verify %v", s.For, s.TTL, s.Verify))
	}
	if s.TTL%time.Second != 0 {
		errs = append(errs, fmt.Errorf("serve_stale TTL %v is not a whole number of seconds", s.TTL))
	}
	return errors.Join(errs...)
}

// Notrack configures the notrack plugin, which puts the bind addresses on the node-local interface and
// keeps the NOTRACK rules for them.
type Notrack struct {
	// Disabled leaves notrack out: something else provides the addresses and the rules (a CNI's local
	// redirect, for instance).
	Disabled bool
	// Interface is the link that carries the addresses; default nodelocaldns.
	Interface string
	// Sync is how often the rules and the link are checked; zero means the plugin's default.
	Sync time.Duration
	// Backend is auto, legacy or nft; empty means the plugin's default.
	Backend string
	// NoInterface leaves the link alone (the addresses are managed elsewhere).
	NoInterface bool
	// NoRules leaves the NOTRACK rules out.
	NoRules bool
	// SkipTeardown keeps the link and the rules at exit, so a restart has no gap.
	SkipTeardown bool
	// Lock is the node-lock file that keeps a second cache off the node; empty means the plugin's default
	// (/run/nodelocaldns.lock).
	Lock string
	// Handover hands the node to the cluster DNS at exit instead of tearing it down (notrack handover):
	// the local addresses that are not ServiceAddresses are diverted to the kube-dns-upstream Service at
	// HandoverUpstream (one ClusterIP per family; none leaves them undiverted), and ServiceAddresses, the
	// kube-dns ClusterIPs among the local addresses, go back to kube-proxy.
	Handover         bool
	HandoverUpstream []netip.Addr
	ServiceAddresses []netip.Addr
}

// withDefaults returns c with every zero field set to its default.
func (c Config) withDefaults() Config {
	if c.ClusterDomain == "" {
		c.ClusterDomain = DefaultClusterDomain
	}
	c.ClusterDomain = strings.TrimSuffix(c.ClusterDomain, ".")
	if c.Mode == "" {
		c.Mode = ModeIPTables
	}
	if c.Port == 0 {
		c.Port = DefaultPort
	}
	if c.Upstream.Service == "" {
		c.Upstream.Service = DefaultUpstreamService
	}
	if c.Upstream.Namespace == "" {
		c.Upstream.Namespace = DefaultNamespace
	}
	if c.Cache.SuccessCapacity == 0 {
		c.Cache.SuccessCapacity = 9984
	}
	if c.Cache.SuccessTTL == 0 {
		c.Cache.SuccessTTL = 30
	}
	if c.Cache.DenialCapacity == 0 {
		c.Cache.DenialCapacity = 9984
	}
	if c.Cache.DenialTTL == 0 {
		c.Cache.DenialTTL = 5
	}
	if c.Cache.OtherTTL == 0 {
		c.Cache.OtherTTL = 30
	}
	if c.Cache.Memory == 0 {
		c.Cache.Memory = DefaultCacheMemory
	}
	if c.Clamp.SuccessMin == 0 {
		c.Clamp.SuccessMin = 5
	}
	if c.Clamp.SuccessMax == 0 {
		c.Clamp.SuccessMax = c.Cache.SuccessTTL
	}
	if c.Clamp.DenialMin == 0 {
		c.Clamp.DenialMin = 5
	}
	if c.Clamp.DenialMax == 0 {
		c.Clamp.DenialMax = c.Cache.DenialTTL
	}
	if c.HealthPort == 0 {
		c.HealthPort = DefaultHealthPort
	}
	if c.ReadyPort == 0 {
		c.ReadyPort = DefaultReadyPort
	}
	if c.MetricsAddress == "" && len(c.LocalIPs) > 0 {
		c.MetricsAddress = hostPort(c.LocalIPs[0], DefaultMetricsPort)
	}
	if c.Notrack.Interface == "" {
		c.Notrack.Interface = DefaultInterface
	}
	c.ServeStale = c.ServeStale.withDefaults()
	return c
}

// Validate reports what makes c impossible to render, all problems at once.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	if len(validation.IsDNS1123Subdomain(c.ClusterDomain)) > 0 {
		errs = append(errs, fmt.Errorf("cluster domain %q is not a valid domain name", c.ClusterDomain))
	}
	if len(c.LocalIPs) == 0 {
		errs = append(errs, errors.New("no local IPs: the cache needs at least one address to answer on"))
	}
	for _, ip := range c.LocalIPs {
		if !ip.IsValid() || ip.IsUnspecified() || ip.Zone() != "" {
			errs = append(errs, fmt.Errorf("local IP %v: want a unicast address without zone", ip))
		}
	}
	switch c.Mode {
	case ModeIPTables:
		if len(c.ClusterDNSIPs) == 0 {
			errs = append(errs, errors.New("iptables mode needs the kube-dns ClusterIPs, which the cache binds"))
		}
	case ModeIPVS:
	default:
		errs = append(errs, fmt.Errorf("mode %q: want %q or %q", c.Mode, ModeIPTables, ModeIPVS))
	}
	for _, ip := range c.ClusterDNSIPs {
		if !ip.IsValid() || ip.IsUnspecified() {
			errs = append(errs, fmt.Errorf("cluster DNS IP %v is not a usable address", ip))
		}
	}
	if len(validation.IsDNS1035Label(c.Upstream.Service)) > 0 {
		errs = append(errs, fmt.Errorf("upstream service %q is not a valid Service name", c.Upstream.Service))
	}
	if len(validation.IsDNS1123Label(c.Upstream.Namespace)) > 0 {
		errs = append(errs, fmt.Errorf("upstream namespace %q is not a valid namespace", c.Upstream.Namespace))
	}
	for _, f := range c.Upstream.Fallback {
		if _, err := parseNameserver(f); err != nil {
			errs = append(errs, fmt.Errorf("upstream fallback: %w", err))
		}
	}
	if err := c.kubeDNS().Validate(); err != nil {
		errs = append(errs, err)
	}
	for _, n := range []struct {
		what  string
		value int
	}{
		{"cache success capacity", c.Cache.SuccessCapacity}, {"cache success TTL", c.Cache.SuccessTTL},
		{"cache denial capacity", c.Cache.DenialCapacity}, {"cache denial TTL", c.Cache.DenialTTL},
		{"cache TTL of the other blocks", c.Cache.OtherTTL},
	} {
		if n.value < 0 {
			errs = append(errs, fmt.Errorf("%s is negative: %d", n.what, n.value))
		}
	}
	if c.MaxAttempts < 0 {
		errs = append(errs, fmt.Errorf("max attempts is negative: %d", c.MaxAttempts))
	}
	if c.Clamp.SuccessMin > c.Clamp.SuccessMax || c.Clamp.DenialMin > c.Clamp.DenialMax {
		errs = append(errs, fmt.Errorf("clamp window upside down: success %d..%d, denial %d..%d",
			c.Clamp.SuccessMin, c.Clamp.SuccessMax, c.Clamp.DenialMin, c.Clamp.DenialMax))
	}
	if err := c.ServeStale.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.Cache.Memory < MinCacheMemory {
		errs = append(errs, fmt.Errorf("cache memory %d bytes is below %d, a sixteenth of which holds one answer of the largest size", c.Cache.Memory, MinCacheMemory))
	}
	if c.WireCache.Capacity < 0 {
		errs = append(errs, fmt.Errorf("wirecache capacity is negative: %d", c.WireCache.Capacity))
	}
	if total, perClient := c.WireCache.tcpConnections(); c.WireCache.TCPConnections < 0 || c.WireCache.TCPConnectionsPerClient < 0 || perClient > total {
		errs = append(errs, fmt.Errorf("wirecache TCP connections: %d in all and %d per client; want positive bounds, the one per client at most the other",
			c.WireCache.TCPConnections, c.WireCache.TCPConnectionsPerClient))
	}
	if _, err := parseListenAddress(c.MetricsAddress); err != nil && len(c.LocalIPs) > 0 {
		errs = append(errs, fmt.Errorf("metrics address: %w", err))
	}
	if c.HealthPort == c.ReadyPort || c.HealthPort == c.Port || c.ReadyPort == c.Port {
		errs = append(errs, fmt.Errorf("ports collide: dns %d, health %d, ready %d", c.Port, c.HealthPort, c.ReadyPort))
	}
	switch c.Notrack.Backend {
	case "", "auto", "legacy", "nft":
	default:
		errs = append(errs, fmt.Errorf("notrack backend %q: want auto, legacy or nft", c.Notrack.Backend))
	}
	if c.Notrack.Sync < 0 {
		errs = append(errs, fmt.Errorf("notrack sync interval is negative: %v", c.Notrack.Sync))
	}
	if strings.ContainsAny(c.Notrack.Lock, " \t\n\"'{}#`") {
		errs = append(errs, fmt.Errorf("notrack lock file %q: a Corefile token cannot hold blanks, quotes, braces or #", c.Notrack.Lock))
	}
	return errors.Join(errs...)
}

// listenIPs are the addresses the cache binds: the local ones, plus the kube-dns ClusterIPs in iptables mode.
func (c Config) listenIPs() []netip.Addr {
	ips := append([]netip.Addr(nil), c.LocalIPs...)
	if c.Mode == ModeIPTables {
		ips = append(ips, c.ClusterDNSIPs...)
	}
	return ips
}

// kubeDNS is the part of c that the kube-dns ConfigMap carries in a drop-in deployment.
func (c Config) kubeDNS() KubeDNS {
	return KubeDNS{StubDomains: c.StubDomains, UpstreamNameservers: c.NodeUpstreams}
}

// hostPort joins an address and a port, with brackets around IPv6.
func hostPort(ip netip.Addr, port uint16) string {
	return netip.AddrPortFrom(ip, port).String()
}

// parseListenAddress checks a HOST:PORT for an HTTP listener (health, ready, prometheus).
func parseListenAddress(s string) (netip.AddrPort, error) {
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("%q is not IP:PORT (IPv6 in brackets): %w", s, err)
	}
	return ap, nil
}
