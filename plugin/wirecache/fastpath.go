package wirecache

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"
	"unsafe"

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
// An address gets a fast path only where CoreDNS's server would treat a datagram the fast path answers the
// same way: every option of the server and of its blocks is classified (serverFieldUses, configFieldUses),
// and those that change how the server reads or writes UDP (proxyproto, a writer decorator, views, more
// opcodes) keep the address in the chain while set.
//
// The steering is an optimization, not a condition: a packet that lands on CoreDNS's own socket is answered
// by the plugin chain, wirecache included, as before.

// fastPathsKey stores an instance's fastPaths in caddy's instance storage, so that every block of the
// instance shares one listener per address.
type fastPathsKey struct{}

// fastPaths are the fast-path listeners of one caddy instance: one per address whose blocks qualify, which
// starts when a server of the address handles its first query (the only place a *dnsserver.Server is
// reachable from a plugin) and stops with the instance. An address has several servers under multisocket,
// all built from the same blocks; the first one seen serves what the fast path passes on.
type fastPaths struct {
	mu      sync.Mutex
	blocks  map[*dnsserver.Config]*WireCache
	servers map[string]*fastPath // by dnsserver.Server.Addr; nil for an address tried and left to CoreDNS
	stopped bool
	// limits bound the TCP connections of all the instance's fast paths, from the blocks' bounds when the
	// first fast path starts; turns give the hits of them all a turn in a burst of their TCP work.
	limits *connLimits
	turns  hitTurns
	// starting counts the listeners being started, so stop waits for them.
	starting sync.WaitGroup
	// reloading is set from the instance's OnRestart callbacks on: quietReads leaves the servers' reads alone
	// (see there). quietFailed notes that it could not find them, logged once.
	reloading, quietFailed bool
}

// instanceFastPaths returns the fast paths of c's instance, and whether this call created them.
func instanceFastPaths(c *caddy.Controller) (*fastPaths, bool) {
	if fp, ok := c.Get(fastPathsKey{}).(*fastPaths); ok {
		return fp, false
	}
	fp := &fastPaths{blocks: map[*dnsserver.Config]*WireCache{}, servers: map[string]*fastPath{}}
	c.Set(fastPathsKey{}, fp)
	return fp, true
}

// register lets the fast path answer the hits of wc, the wirecache of the block cfg.
func (f *fastPaths) register(cfg *dnsserver.Config, wc *WireCache) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.blocks[cfg] = wc
}

// notice starts the fast path for the address of the server handling ctx's query, once.
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
	if _, seen := f.servers[srv.Addr]; seen {
		return
	}
	f.servers[srv.Addr] = nil
	blocks := maps.Clone(f.blocks)
	if f.limits == nil {
		f.limits = blockConnLimits(blocks)
	}
	limits := f.limits
	f.starting.Go(func() { f.start(srv, blocks, limits) })
}

// blockConnLimits returns the bounds on TCP connections of an instance: the largest of its blocks'.
func blockConnLimits(blocks map[*dnsserver.Config]*WireCache) *connLimits {
	total, perClient := 0, 0
	for _, wc := range blocks {
		total, perClient = max(total, wc.TCPConnections), max(perClient, wc.TCPConnectionsPerClient)
	}
	return newConnLimits(total, perClient)
}

func (f *fastPaths) start(srv *dnsserver.Server, blocks map[*dnsserver.Config]*WireCache, limits *connLimits) {
	routes, local, err := fastRoutes(srv, blocks)
	if err != nil {
		log.Infof("no fast path on %s: %v; its queries go through the plugin chain", srv.Addr, err)
		return
	}
	fp, err := startFastPath(srv, local, routes, limits, &f.turns, func() { f.quietReads(srv) })
	if err != nil {
		log.Warningf("no fast path on %s: %v; its queries go through the plugin chain", srv.Addr, err)
		return
	}
	f.mu.Lock()
	stopped := f.stopped
	if !stopped {
		f.servers[srv.Addr] = fp
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

// quietReads takes the read deadline off the sockets CoreDNS's server srv reads its UDP queries from. The fast
// path calls it whenever it finds its address's UDP group steered to its own socket, so that those sockets
// get nothing: miekg/dns's server sets a deadline 2 s ahead before each read only so that its read loop wakes
// to see whether the server stopped, and with nothing to read that woke an idle cache every 2 s for each
// address, with several of its threads each time. Without the deadline the loop still reads at once what
// reaches the socket (a probe, the group given back to the kernel's hash), and sets its deadline again until
// the next look takes it off; the server's Shutdown still ends the read, with a deadline in the past.
//
// A deadline taken off after a Shutdown set its own would keep that read waiting until the shutdown gives up
// and closes the socket (its grace period, 5 s by default). A server stops only at a reload, after the
// instance's OnRestart callbacks (caddy.Instance.Restart), so from reload on (reloading) nothing is taken off;
// at the process's end caddy runs the shutdown callbacks and exits without stopping the servers.
func (f *fastPaths) quietReads(srv *dnsserver.Server) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.reloading {
		return
	}
	conns, err := serverPacketConns(srv)
	if err != nil {
		if !f.quietFailed {
			log.Infof("fast path on %s: %v; CoreDNS's UDP read loop keeps waking every 2 s", srv.Addr, err)
			f.quietFailed = true
		}
		return
	}
	for _, pc := range conns {
		// An error is a socket closed by its server's stop, which has nothing left to wake.
		_ = pc.SetReadDeadline(time.Time{})
	}
}

// reload is the instance's OnRestart callback: its servers are about to stop (quietReads).
func (f *fastPaths) reload() error {
	f.setReloading(true)
	return nil
}

// reloadFailed is its OnRestartFailed callback: the servers serve on.
func (f *fastPaths) reloadFailed() error {
	f.setReloading(false)
	return nil
}

func (f *fastPaths) setReloading(on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reloading = on
}

// fastBlock is a block the fast path answers hits for, with its metrics on the server.
type fastBlock struct {
	wc      *WireCache
	metrics *serverMetrics
}

// fastRouting chooses a query's block as dnsserver.Server.ServeDNS does: the longest zone match, the root
// zone last. A zone whose block the fast path does not answer for maps to nil. The zero fastRouting routes
// every name to nil.
type fastRouting struct {
	byZone map[string]*fastBlock
	// zoneLabels[n] is set when a zone has n labels; maxLabels is the most any zone has. A name's suffixes
	// of other lengths are not looked up: a hit for a cluster name costs one lookup instead of one per label.
	zoneLabels [maxNameLabels + 1]bool
	maxLabels  int
}

// maxNameLabels is the most labels a name has: 255 bytes in wire format.
const maxNameLabels = 127

func newFastRouting(byZone map[string]*fastBlock) fastRouting {
	r := fastRouting{byZone: byZone}
	for zone := range byZone {
		n := dns.CountLabel(zone)
		r.zoneLabels[n] = true
		r.maxLabels = max(r.maxLabels, n)
	}
	return r
}

// route returns the block for name, lowered and in presentation format, fully qualified, or nil.
func (r *fastRouting) route(name string) *fastBlock {
	off, labels := labelSuffix(name, r.maxLabels)
	for ; labels > 0; labels-- {
		if r.zoneLabels[labels] {
			if b, ok := r.byZone[name[off:]]; ok {
				return b
			}
		}
		off, _ = dns.NextLabel(name, off)
	}
	return r.byZone["."]
}

// labelSuffix returns where the suffix of name (fully qualified, presentation format) with k labels
// starts, and how many labels that suffix has: all of name's when it has k or fewer.
func labelSuffix(name string, k int) (off, labels int) {
	if k == 0 {
		return len(name), 0
	}
	if strings.IndexByte(name, '\\') >= 0 {
		// An escaped dot is not a label's end: walk as miekg/dns does. The fast path's names have no escapes.
		n := dns.CountLabel(name)
		for ; n > k; n-- {
			off, _ = dns.NextLabel(name, off)
		}
		return off, n
	}
	for i := len(name) - 2; i >= 0; i-- {
		if name[i] == '.' {
			if labels++; labels == k {
				return i + 1, k
			}
		}
	}
	if name == "." {
		return 0, 0
	}
	return 0, labels + 1
}

func (r *fastRouting) blocks() int {
	n := 0
	for _, b := range r.byZone {
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
		return fastRouting{}, local, err
	}
	zones, err := serverZones(srv)
	if err != nil {
		return fastRouting{}, local, err
	}
	if reasons := serverOptionReasons(srv, zones); len(reasons) > 0 {
		return fastRouting{}, local, errors.New(strings.Join(reasons, "; "))
	}
	byZone := map[string]*fastBlock{}
	for zone, cfgs := range zones {
		// Without filters (serverOptionReasons) the server picks the zone's first block.
		if wc, ok := blocks[cfgs[0]]; ok {
			byZone[zone] = &fastBlock{wc: wc, metrics: wc.metrics.of(srv, wc.metricsZones)}
		} else {
			byZone[zone] = nil
		}
	}
	routes := newFastRouting(byZone)
	if routes.blocks() == 0 {
		return fastRouting{}, local, errors.New("none of its server blocks qualifies")
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

// serverZones reads the blocks a server routes to, by zone. CoreDNS keeps them unexported (Server.zones) and
// offers no accessor; they are read, never written. If a CoreDNS version changes them, this fails and the
// server keeps its queries (TestServerZonesReadsCoreDNS notices first).
func serverZones(srv *dnsserver.Server) (map[string][]*dnsserver.Config, error) {
	zones := reflect.ValueOf(srv).Elem().FieldByName("zones")
	if !zones.IsValid() || zones.Type() != reflect.TypeFor[map[string][]*dnsserver.Config]() {
		return nil, errors.New("this CoreDNS version's server does not keep its blocks where wirecache reads them")
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
	return out, nil
}

// serverPacketConns returns the sockets CoreDNS's server reads its UDP queries from: the PacketConn of each of
// its miekg/dns servers that has one (ServePacket's), none before ServePacket ran. CoreDNS keeps those servers
// unexported (Server.server, set under the server's lock Server.m) and offers no accessor; they are read under
// that lock, never written. If a CoreDNS version changes them, this fails and the reads keep their deadlines
// (TestServerPacketConnsReadsCoreDNS notices first).
func serverPacketConns(srv *dnsserver.Server) ([]net.PacketConn, error) {
	v := reflect.ValueOf(srv).Elem()
	servers, m := v.FieldByName("server"), v.FieldByName("m")
	if !servers.IsValid() || servers.Kind() != reflect.Array || servers.Type().Elem() != reflect.TypeFor[*dns.Server]() ||
		!m.IsValid() || m.Type() != reflect.TypeFor[sync.Mutex]() {
		return nil, errors.New("this CoreDNS version's server does not keep its miekg/dns servers where wirecache reads them")
	}
	mu := (*sync.Mutex)(unsafe.Pointer(m.UnsafeAddr()))
	mu.Lock()
	defer mu.Unlock()
	var conns []net.PacketConn
	for i := range servers.Len() {
		// A read-only value (unexported field): its pointer is readable, not its interface.
		if s := (*dns.Server)(servers.Index(i).UnsafePointer()); s != nil && s.PacketConn != nil {
			conns = append(conns, s.PacketConn)
		}
	}
	return conns, nil
}

// optionUse is how the fast path treats one field of CoreDNS's server (dnsserver.Server) or of a server
// block's configuration (dnsserver.Config): every field either changes nothing the fast path does to a
// datagram, or keeps the address's queries in the plugin chain while it is set.
type optionUse int

const (
	// followed: the fast path reads the field and does with it what the server does (the address, the
	// blocks and their chains).
	followed optionUse = iota
	// passedOn: the server applies it to what the fast path passes on, which is everything but a hit, and a
	// hit (a plain class IN query read from its bytes, answered from a store) does not depend on it.
	passedOn
	// notUDP: it applies to TCP or to another transport; CoreDNS's UDP listener for plain DNS ignores it.
	// The fast path's TCP server (tcpServer) takes the server's TCP settings as CoreDNS's own does.
	notUDP
	// keepsChain: while it is set on the server or on one of its blocks, the address has no fast path.
	keepsChain
	// serverState: the server's own running state, not configuration.
	serverState
)

// fieldUse says how the fast path treats a field, and why.
type fieldUse struct {
	use optionUse
	why string
}

// serverFieldUses classifies every field of dnsserver.Server in the CoreDNS version this module builds
// with. A field missing here keeps every address in the chain (serverOptionReasons), and
// TestFastPathKnowsEveryServerOption fails first.
var serverFieldUses = map[string]fieldUse{
	"Addr":                          {followed, "the address the fast path joins"},
	"IdleTimeout":                   {notUDP, "TCP connections (timeouts), which the fast path's TCP server has too"},
	"ReadTimeout":                   {notUDP, "TCP connections (timeouts), which the fast path's TCP server has too"},
	"WriteTimeout":                  {notUDP, "TCP connections (timeouts), which the fast path's TCP server has too"},
	"MaxTCPQueries":                 {notUDP, "TCP connections (timeouts max_queries), which the fast path's TCP server has too"},
	"TsigSecret":                    {passedOn, "a query with a TSIG record is passed on to a miekg/dns server with these secrets, and every query of a server that has secrets is answered through it (tsig)"},
	"connPolicy":                    {keepsChain, "proxyproto wraps the server's UDP socket, which reads the PROXY header the fast path would not"},
	"udpSessionTrackingTTL":         {keepsChain, "proxyproto's UDP session tracking"},
	"udpSessionTrackingMaxSessions": {keepsChain, "proxyproto's UDP session tracking"},
	"proxyProtoTLVMetadata":         {keepsChain, "proxyproto's TLV metadata"},
	"server":                        {serverState, "the server's miekg/dns servers; the fast path takes the read deadline off the UDP one's socket while its group is steered (quietReads)"},
	"m":                             {serverState, "their lock, which quietReads reads them under"},
	"zones":                         {followed, "the blocks by zone: the fast path picks a query's block as the server does"},
	"graceTimeout":                  {serverState, "how long the server's stop waits; the fast path stops with the instance"},
	"trace":                         {passedOn, "the trace plugin, which the server only hands out (Tracer); as a plugin ahead of wirecache it keeps its block's hits in the chain"},
	"debug":                         {passedOn, "debug: no recover around the chain; a hit runs no plugin"},
	"stacktrace":                    {passedOn, "errors stacktrace: how a recovered panic is logged; a hit runs no plugin"},
	"classChaos":                    {passedOn, "queries of classes other than IN reach the chain (chaos, forward); the fast path answers class IN only"},
	"allowedOpcodes":                {keepsChain, "a plugin accepts opcodes other than QUERY and NOTIFY (dynupdate), which the server's listener lets through"},
	"udpDecorateWriterFunc":         {keepsChain, "a UDP writer decorator (shed) must see every reply"},
	"stopOnce":                      {serverState, "the server's stop"},
	"stopErr":                       {serverState, "the server's stop"},
}

// configFieldUses classifies every field of dnsserver.Config in the CoreDNS version this module builds
// with, as serverFieldUses does for the server.
var configFieldUses = map[string]fieldUse{
	"Zone":                            {followed, "the block's zone: the fast path picks a query's block as the server does"},
	"ListenHosts":                     {followed, "the addresses (bind): one server, and one fast path, each; a wildcard address has none"},
	"Port":                            {followed, "part of the server's address"},
	"NumSockets":                      {followed, "multisocket: the address's servers share one fast path, which passes queries to one of them (all are built from the same blocks)"},
	"Root":                            {passedOn, "root: where plugins find their files"},
	"Debug":                           {passedOn, "debug (the server's debug)"},
	"Stacktrace":                      {passedOn, "errors stacktrace (the server's stacktrace)"},
	"Transport":                       {followed, "only plain DNS (dns://) servers get a fast path"},
	"HTTPRequestValidateFunc":         {notUDP, "DNS over HTTPS"},
	"UDPDecorateWriterFunc":           {keepsChain, "a UDP writer decorator (shed) must see every reply"},
	"FilterFuncs":                     {keepsChain, "a view selects the block per query"},
	"ViewName":                        {keepsChain, "a view selects the block per query"},
	"TLSConfig":                       {notUDP, "tls: DNS over TLS, HTTPS, gRPC and QUIC"},
	"tlsConfigIdentity":               {notUDP, "tls"},
	"MaxQUICStreams":                  {notUDP, "quic"},
	"MaxQUICConnections":              {notUDP, "quic"},
	"MaxQUICWorkerPoolSize":           {notUDP, "quic"},
	"ProxyProtoConnPolicy":            {keepsChain, "proxyproto wraps the server's UDP socket, which reads the PROXY header the fast path would not"},
	"ProxyProtoUDPSessionTrackingTTL": {keepsChain, "proxyproto's UDP session tracking"},
	"ProxyProtoUDPSessionTrackingMaxSessions": {keepsChain, "proxyproto's UDP session tracking"},
	"ProxyProtoTLVMetadata":                   {keepsChain, "proxyproto's TLV metadata"},
	"MaxGRPCStreams":                          {notUDP, "grpc_server"},
	"MaxGRPCConnections":                      {notUDP, "grpc_server"},
	"MaxHTTPSConnections":                     {notUDP, "https"},
	"MaxHTTPSStreams":                         {notUDP, "https"},
	"MaxHTTPS3Streams":                        {notUDP, "https3"},
	"MaxHTTPS3Connections":                    {notUDP, "https3"},
	"ReadTimeout":                             {notUDP, "timeouts (the server's)"},
	"WriteTimeout":                            {notUDP, "timeouts (the server's)"},
	"IdleTimeout":                             {notUDP, "timeouts (the server's)"},
	"MaxTCPQueries":                           {notUDP, "timeouts max_queries (the server's)"},
	"TsigSecret":                              {passedOn, "tsig (the server's TsigSecret)"},
	"allowedOpcodes":                          {keepsChain, "a plugin accepts opcodes other than QUERY and NOTIFY (dynupdate), which the server's listener lets through"},
	"Plugin":                                  {followed, "the block's plugins: the block qualifies when every plugin ahead of wirecache may be skipped for a hit"},
	"pluginChain":                             {followed, "the block's chain, run for everything the fast path passes on"},
	"registry":                                {followed, "the block's handlers by name (Handler), which tell the plugins ahead of wirecache"},
	"firstConfigInBlock":                      {followed, "the block the zone belongs to"},
	"metaCollector":                           {followed, "metadata, which the server collects before the chain; as a plugin ahead of wirecache it keeps its block's hits in the chain"},
}

// unknownFields returns the fields of the struct type t that uses does not classify.
func unknownFields(t reflect.Type, uses map[string]fieldUse) []string {
	var unknown []string
	for f := range t.Fields() {
		if _, ok := uses[f.Name]; !ok {
			unknown = append(unknown, f.Name)
		}
	}
	return unknown
}

// serverOptionReasons says why srv's address may not have a fast path, from the fields of the server and of
// its blocks' configurations (zones); none means it may. Every field the fast path does not know keeps the
// address in the chain, as does every keepsChain field that is set.
func serverOptionReasons(srv *dnsserver.Server, zones map[string][]*dnsserver.Config) []string {
	var reasons []string
	add := func(reason string) {
		if !slices.Contains(reasons, reason) {
			reasons = append(reasons, reason)
		}
	}
	if unknown := unknownFields(reflect.TypeFor[dnsserver.Server](), serverFieldUses); len(unknown) > 0 {
		add(fmt.Sprintf("this CoreDNS version's server has options wirecache does not know (%s)", strings.Join(unknown, ", ")))
	}
	if unknown := unknownFields(reflect.TypeFor[dnsserver.Config](), configFieldUses); len(unknown) > 0 {
		add(fmt.Sprintf("this CoreDNS version's server blocks have options wirecache does not know (%s)", strings.Join(unknown, ", ")))
	}
	keptBy := func(v reflect.Value, uses map[string]fieldUse) {
		for name, u := range uses {
			if u.use != keepsChain {
				continue
			}
			if f := v.FieldByName(name); !f.IsValid() || isSet(f) {
				add(u.why)
			}
		}
	}
	keptBy(reflect.ValueOf(srv).Elem(), serverFieldUses)
	for _, cfgs := range zones {
		for _, cfg := range cfgs {
			keptBy(reflect.ValueOf(cfg).Elem(), configFieldUses)
		}
	}
	slices.Sort(reasons)
	return reasons
}

// isSet reports whether a field holds a setting: a map or slice with elements, any other value not zero.
func isSet(v reflect.Value) bool {
	switch v.Kind() {
	case reflect.Map, reflect.Slice:
		return v.Len() > 0
	}
	return !v.IsZero()
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
