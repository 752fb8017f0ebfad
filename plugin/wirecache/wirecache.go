// Package wirecache implements a plugin that answers repeated queries from replies it packed once.
//
// Placed ahead of metrics, errors, log and cache, it lets a miss through the plugin chain, records the reply
// the chain writes and keeps it in wire format. A hit copies those bytes, patches in the query's ID, RD and CD
// bits and question name case, counts the TTLs down and writes the result once, without a dns.Msg, a copy of
// the records or a pack.
package wirecache

import (
	"context"
	"net"
	"sync"
	"time"

	"github.com/coredns/coredns/plugin"
	"github.com/coredns/coredns/request"

	"github.com/nodelocaldns/nodelocaldns/plugin/internal/zones"

	"github.com/miekg/dns"
)

const pluginName = "wirecache"

// Defaults: the cache plugin's capacity, a memory budget that 10000 usual answers (about 600 bytes each as the
// store counts them) stay inside, and entries served no longer than their TTLs and at most an hour. With
// serve_stale, an expired entry is kept for the cache plugin's default stale window and answers with the TTL
// RFC 8767 recommends.
const (
	DefaultCapacity  = 10000
	DefaultMaxMemory = 8 << 20
	DefaultMinTTL    = 0
	DefaultMaxTTL    = time.Hour

	DefaultStaleFor = time.Hour
	DefaultStaleTTL = 30

	// DefaultRefusedFor and DefaultServfailFor are how long an answer REFUSED or SERVFAIL is held: as long
	// as the cache plugin holds a SERVFAIL by default, and clamp's least TTL for a denial.
	DefaultRefusedFor  = 5 * time.Second
	DefaultServfailFor = 5 * time.Second
	// MaxFailureFor bounds RefusedFor and ServfailFor: RFC 2308's bound on holding a server failure, which
	// the cache plugin applies to SERVFAIL.
	MaxFailureFor = 5 * time.Minute

	// DefaultRecvBuffer is the receive buffer the fast path asks for its UDP socket: about a thousand
	// queries, half a second of a busy node's, where the kernel's default (net.core.rmem_default, 208 KiB
	// on most nodes) holds about 200.
	DefaultRecvBuffer = 1 << 20
)

// Bounds of RecvBuffer, other than 0.
const (
	MinRecvBuffer = 64 << 10
	MaxRecvBuffer = 256 << 20
)

// MinMaxMemory is the smallest memory budget: room for one entry of the largest size stored.
const MinMaxMemory = maxEntryBytes

// WireCache is a plugin that serves repeated queries from answers stored in wire format.
type WireCache struct {
	Next  plugin.Handler
	Zones []string

	// Capacity is the most entries held and MaxMemory the most bytes they may hold (heap, as the store
	// counts it); MinTTL and MaxTTL bound how long one is served.
	Capacity  int
	MaxMemory int64
	MinTTL    time.Duration
	MaxTTL    time.Duration
	// RefusedFor and ServfailFor are how long an answer whose rcode is REFUSED or SERVFAIL is held (it has
	// no TTL of its own); zero holds none. Only a reply the plugin chain wrote is held, the upstream's: not
	// one the server writes for a plugin's error (forward's max_concurrent REFUSED, the SERVFAIL for an
	// upstream that did not answer), which wirecache never sees.
	RefusedFor, ServfailFor time.Duration

	// StaleFor, when positive, keeps an entry that expired up to this long, to answer its query when the
	// plugin chain fails (RFC 8767, serve-stale); StaleTTL is the TTL of such an answer. StaleWait, when
	// positive, is how long such a query waits for the chain before the entry answers (the chain's answer,
	// when it comes, still replaces the entry); zero waits for the chain to answer or fail.
	StaleFor  time.Duration
	StaleTTL  uint32
	StaleWait time.Duration
	// PreferPositive keeps an expired entry that has answer records over a chain's answer that turns
	// NXDOMAIN or has none (serve_stale ... prefer_positive, as the cache plugin's serve_stale_policy
	// prefer_positive): the entry answers instead, for up to StaleFor past its expiry.
	PreferPositive bool

	// RepeatsOnly stores an answer only when its question was asked before (see doorkeeper), so that names
	// asked once are not held by both wirecache and the cache plugin.
	RepeatsOnly bool

	// stepAside, set at startup when the server block has a plugin that must see every query, turns
	// wirecache into a pass-through.
	stepAside bool
	// floorer, set at startup when the server block has clamp, gives the least TTL a hit may serve for
	// each answer stored.
	floorer ttlFloorer
	// metricsZones, set at startup when the block's prometheus plugin runs after wirecache, are that plugin's
	// zones; hits are then counted in CoreDNS's own series too (see coreSeries). Nil otherwise.
	metricsZones []string
	// bypass, set at startup, are the zones the block's handlers say no cache may hold (zoneBypasser).
	bypass []string
	// FastPath lets the block's hits be answered by the fast path (see fastpath.go) where it qualifies;
	// fast, set at startup when it does, are the fast paths of the instance.
	FastPath bool
	fast     *fastPaths
	// RecvBuffer is the receive buffer, in bytes, that the fast path asks for its socket on the block's
	// address (the largest of the blocks it answers for): the queries that wait while the process does not
	// run (a CPU limit's throttling, the collector, a busy node) are dropped beyond it. Zero leaves the
	// kernel's default.
	RecvBuffer int64
	// TCPConnections and TCPConnectionsPerClient bound the TCP connections the fast paths of the instance
	// accept: at once in all, and at once from one client address (the largest of the blocks' bounds).
	TCPConnections, TCPConnectionsPerClient int

	allZones   bool
	store      *store
	doorkeeper *doorkeeper // with RepeatsOnly
	metrics    serverMetricsSet
	buffers    sync.Pool
	now        func() time.Time
}

// New returns a WireCache with the default settings for every zone. It's up to the caller to set Next.
func New() *WireCache {
	wc := &WireCache{Zones: []string{"."}, Capacity: DefaultCapacity, MaxMemory: DefaultMaxMemory, MinTTL: DefaultMinTTL, MaxTTL: DefaultMaxTTL, RefusedFor: DefaultRefusedFor, ServfailFor: DefaultServfailFor, now: time.Now, FastPath: true, RecvBuffer: DefaultRecvBuffer,
		TCPConnections: DefaultTCPConnections, TCPConnectionsPerClient: DefaultTCPConnectionsPerClient}
	wc.buffers.New = func() any {
		b := make([]byte, 0, maxEntryWire+optLen)
		return &b
	}
	wc.prepare()
	return wc
}

// prepare applies Zones, Capacity and MaxMemory; parse calls it again once the Corefile has set them.
func (wc *WireCache) prepare() {
	wc.allZones = len(wc.Zones) == 1 && wc.Zones[0] == "."
	wc.store = newStore(wc.Capacity, wc.MaxMemory)
	wc.doorkeeper = nil
	if wc.RepeatsOnly {
		wc.doorkeeper = newDoorkeeper(wc.Capacity)
	}
}

// Name implements the plugin.Handler interface.
func (wc *WireCache) Name() string { return pluginName }

// ServeDNS implements the plugin.Handler interface.
func (wc *WireCache) ServeDNS(ctx context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
	if wc.stepAside {
		return plugin.NextOrFailure(wc.Name(), wc.Next, ctx, w, r)
	}
	var key [keyLen]byte
	q, n, ok := parseQuery(r, &key)
	if !ok {
		if !wc.inZones(r) {
			return plugin.NextOrFailure(wc.Name(), wc.Next, ctx, w, r)
		}
		wc.serverMetrics(ctx).misses.Inc()
		return plugin.NextOrFailure(wc.Name(), wc.Next, ctx, w, r)
	}

	h := wc.store.hash(key[:n])
	now := wc.now()
	e := wc.store.get(h, key[:n])
	// Only answers to queries in the zones are stored, and the zones match names in any case, so a query
	// that finds an entry is in them: the zones are checked only when none is found.
	if e == nil && !wc.inZones(r) {
		return plugin.NextOrFailure(wc.Name(), wc.Next, ctx, w, r)
	}
	m := wc.serverMetrics(ctx)
	if m.udpAside {
		if _, tcp := w.RemoteAddr().(*net.TCPAddr); !tcp {
			return plugin.NextOrFailure(wc.Name(), wc.Next, ctx, w, r)
		}
	}
	var stale *entry
	if e != nil {
		if e.expired(now) {
			if wc.StaleFor > 0 && e.answers() && !e.staleBeyond(now, wc.StaleFor) {
				// Kept until the chain answers: if it fails, this entry answers instead.
				stale = e
			} else {
				wc.store.remove(h, e)
				m.held(wc.store)
			}
		} else if served, err := wc.serveHit(w, r, e, &q, now, m); served {
			return dns.RcodeSuccess, err
		} else {
			// The entry's question does not pack as the client spelled it (replyFor): the chain answers;
			// its reply is not stored, the entry already answers the other clients.
			m.misses.Inc()
			return plugin.NextOrFailure(wc.Name(), wc.Next, ctx, w, r)
		}
	}
	m.misses.Inc()
	if stale != nil && wc.StaleWait > 0 {
		return wc.refreshStale(ctx, w, r, stale, h, string(key[:n]), &q, now, m)
	}

	// An expired entry's question is a repeat; so is every question without repeats_only.
	keep := stale != nil || wc.doorkeeper == nil || wc.doorkeeper.seen(h)
	rec := &recorder{ResponseWriter: w, wc: wc, metrics: m, hash: h, query: q, key: string(key[:n]), now: now, stale: stale, keep: keep}
	rcode, err := plugin.NextOrFailure(wc.Name(), wc.Next, ctx, rec, r)
	if err != nil {
		rec.forget()
	}
	if stale != nil && rec.writes == 0 && !plugin.ClientWrite(rcode) {
		// The chain failed without a reply (forward's upstream did not answer): the server would send
		// SERVFAIL; the expired answer is better.
		if served, werr := wc.serveStale(w, stale, &q, m); served {
			return dns.RcodeSuccess, werr
		}
	}
	return rcode, err
}

// refreshStale asks the chain for the query of stale, an expired entry kept for serve_stale, in the
// background, and waits up to StaleWait for its answer (RFC 8767 section 5, the client response timer):
// an answer that refreshes the entry goes to the client; a failure, or no answer in time, has the entry
// answer with the stale TTL. The chain's answer, whenever it comes, replaces the entry as a miss's would.
// One such refresh runs per entry at a time; a query of the entry meanwhile waits for it, within its own
// StaleWait, and gets the refreshed entry, or the stale answer when the refresh failed or took longer, as
// each client would with a refresh of its own.
func (wc *WireCache) refreshStale(ctx context.Context, w dns.ResponseWriter, r *dns.Msg, stale *entry, h uint64, key string, q *query, now time.Time, m *serverMetrics) (int, error) {
	timer := time.NewTimer(wc.StaleWait)
	defer timer.Stop()
	wait := make(chan struct{})
	if !stale.refresh.CompareAndSwap(nil, &wait) {
		if running := stale.refresh.Load(); running != nil {
			select {
			case <-*running:
			case <-timer.C:
			}
		}
		// The refresh ended (or it ran out of this query's wait): what it stored answers, if it stored.
		if e := wc.store.get(h, []byte(key)); e != nil && e != stale && !e.expired(wc.now()) {
			if served, err := wc.serveHit(w, r, e, q, wc.now(), m); served {
				return dns.RcodeSuccess, err
			}
		}
		if served, err := wc.serveStale(w, stale, q, m); served {
			return dns.RcodeSuccess, err
		}
		// The stale reply could not be rendered for this client (replyFor): it waits for the chain, as
		// without a wait.
		return wc.replay(w, <-wc.askDetached(ctx, w, r, h, key, q, now, m, nil))
	}
	done := wc.askDetached(ctx, w, r, h, key, q, now, m, stale)
	select {
	case res := <-done:
		if (res.msg != nil && wc.refreshes(stale, res.msg)) || res.raw != nil {
			return wc.replay(w, res)
		}
		if served, err := wc.serveStale(w, stale, q, m); served {
			return dns.RcodeSuccess, err
		}
		return wc.replay(w, res)
	case <-timer.C:
		if served, err := wc.serveStale(w, stale, q, m); served {
			return dns.RcodeSuccess, err
		}
		return wc.replay(w, <-done)
	}
}

// chainResult is what the plugin chain did with a query asked in the background: the first reply it wrote
// (a message or raw bytes, nil when it wrote none) and what it returned.
type chainResult struct {
	msg   *dns.Msg
	raw   []byte
	rcode int
	err   error
}

// askDetached runs the chain for a copy of r on a goroutine of its own, writing to a detachedWriter instead of
// w, so that it may go on after the client was answered; a reply it writes is stored as a miss's is. The
// result arrives on the channel; refreshing, when not nil, is the entry whose refresh this is, released then.
func (wc *WireCache) askDetached(ctx context.Context, w dns.ResponseWriter, r *dns.Msg, h uint64, key string, q *query, now time.Time, m *serverMetrics, refreshing *entry) <-chan chainResult {
	dw := &detachedWriter{local: w.LocalAddr(), remote: w.RemoteAddr()}
	// A refresh's recorder knows the expired entry, so that an answer that does not refresh it (a failure;
	// under prefer_positive, a denial of a name that had records) is neither stored nor given to the
	// client: the detached writer gets the stale answer instead.
	rec := &recorder{ResponseWriter: dw, wc: wc, metrics: m, hash: h, query: *q, key: key, now: now, keep: true, stale: refreshing}
	req := r.Copy() // the server may reuse r once the client is answered
	done := make(chan chainResult, 1)
	go func() {
		rcode, err := plugin.NextOrFailure(wc.Name(), wc.Next, context.WithoutCancel(ctx), rec, req)
		if err != nil {
			rec.forget()
		}
		if refreshing != nil {
			if wait := refreshing.refresh.Swap(nil); wait != nil {
				close(*wait)
			}
		}
		done <- chainResult{msg: dw.msg, raw: dw.raw, rcode: rcode, err: err}
	}()
	return done
}

// replay gives the client what the chain did with its query: the reply it wrote, or its rcode and error.
func (wc *WireCache) replay(w dns.ResponseWriter, res chainResult) (int, error) {
	switch {
	case res.msg != nil:
		if err := w.WriteMsg(res.msg); err != nil {
			return dns.RcodeServerFailure, plugin.Error(pluginName, err)
		}
	case res.raw != nil:
		if _, err := w.Write(res.raw); err != nil {
			return dns.RcodeServerFailure, plugin.Error(pluginName, err)
		}
	}
	return res.rcode, res.err
}

// detachedWriter is the writer of a query the chain answers in the background: it keeps the first reply
// instead of sending it, and the client's addresses, read before the client's own writer may be reused.
type detachedWriter struct {
	local, remote net.Addr
	msg           *dns.Msg
	raw           []byte
}

func (d *detachedWriter) LocalAddr() net.Addr  { return d.local }
func (d *detachedWriter) RemoteAddr() net.Addr { return d.remote }
func (d *detachedWriter) Close() error         { return nil }
func (d *detachedWriter) TsigStatus() error    { return nil }
func (d *detachedWriter) TsigTimersOnly(bool)  {}
func (d *detachedWriter) Hijack()              {}

// WriteMsg keeps m if it is the first reply.
func (d *detachedWriter) WriteMsg(m *dns.Msg) error {
	if d.msg == nil && d.raw == nil {
		d.msg = m
	}
	return nil
}

// Write keeps a copy of b if it is the first reply.
func (d *detachedWriter) Write(b []byte) (int, error) {
	if d.msg == nil && d.raw == nil {
		d.raw = append([]byte(nil), b...)
	}
	return len(b), nil
}

// refreshed reports whether res, the chain's reply to a query whose entry has expired, replaces that
// entry for the client: NOERROR and NXDOMAIN do; any other rcode is a failure to refresh, and the expired
// entry answers instead (RFC 8767 section 4, as the cache plugin's serve_stale decides).
func refreshed(res *dns.Msg) bool { return isAnswer(res.Rcode) }

// refreshes reports whether res replaces the expired entry e for the client: it is refreshed, and under
// PreferPositive, when e has answer records, res has some too (a NXDOMAIN or an empty answer does not
// replace the last positive one).
func (wc *WireCache) refreshes(e *entry, res *dns.Msg) bool {
	if !refreshed(res) {
		return false
	}
	return !wc.PreferPositive || !e.positive() || (res.Rcode == dns.RcodeSuccess && len(res.Answer) > 0)
}

// serveStale writes the reply the expired entry e gives q, with the stale TTL, and counts it; it reports
// whether it could.
func (wc *WireCache) serveStale(w dns.ResponseWriter, e *entry, q *query, m *serverMetrics) (bool, error) {
	bp := wc.buffers.Get().(*[]byte)
	defer wc.buffers.Put(bp)
	out, ok := replyFor(clientOf(w), bp, e, func(buf []byte, c client) ([]byte, bool) { return e.renderStale(buf, q, c, wc.StaleTTL) })
	if !ok {
		return false, nil
	}
	m.servedStale.Inc()
	return true, out.write(w)
}

// cachedReply is what a reply from the cache writes: the entry's bytes rendered for the client (wire), or,
// where CoreDNS's server fits the reply to the client itself, the reply whole as a message (msg).
type cachedReply struct {
	wire []byte
	msg  *dns.Msg
}

// clientOf says how the server writes to w's client.
func clientOf(w dns.ResponseWriter) client {
	state := request.Request{W: w}
	return client{tcp: state.Proto() == "tcp", v6: state.Family() == 2}
}

// replyFor renders e's reply for client c into *bp with render. Where render cannot, because the reply
// needs truncation, or compression whose pointers depend on how the client spelled the question, it
// renders the reply whole, as for TCP, and returns it as a message: CoreDNS's server truncates and
// compresses it as it writes any plugin's reply (as it does the hits of CoreDNS's cache plugin), where the
// chain would have been asked again otherwise (each such query went to the upstream: a client without EDNS
// asking for a large answer, a headless Service's, every time).
func replyFor(c client, bp *[]byte, e *entry, render func(buf []byte, c client) ([]byte, bool)) (cachedReply, bool) {
	if need := len(e.wire(e.plain)) + optLen; cap(*bp) < need {
		*bp = make([]byte, 0, need)
	}
	if out, ok := render((*bp)[:cap(*bp)], c); ok {
		return cachedReply{wire: out}, true
	}
	if c.tcp {
		return cachedReply{}, false // expired, or a question that packs otherwise than the stored one
	}
	whole, ok := render((*bp)[:cap(*bp)], client{tcp: true, v6: c.v6})
	if !ok {
		return cachedReply{}, false
	}
	msg := new(dns.Msg)
	if err := msg.Unpack(whole); err != nil {
		return cachedReply{}, false
	}
	return cachedReply{msg: msg}, true
}

// write writes the reply to w. Both of miekg/dns's transports copy the bytes before Write returns, so the
// buffer can be reused.
func (rp cachedReply) write(w dns.ResponseWriter) error {
	var err error
	if rp.msg != nil {
		err = w.WriteMsg(rp.msg)
	} else {
		_, err = w.Write(rp.wire)
	}
	if err != nil {
		return plugin.Error(pluginName, err)
	}
	return nil
}

// serverMetrics returns the metrics of the server handling ctx's query and, the first time, tells the
// instance's fast paths of that server.
func (wc *WireCache) serverMetrics(ctx context.Context) *serverMetrics {
	m := wc.metrics.forServer(ctx, wc.metricsZones)
	if wc.fast != nil && !m.fastNoticed.Load() {
		m.fastNoticed.Store(true)
		wc.fast.notice(ctx)
	}
	return m
}

func (wc *WireCache) inZones(r *dns.Msg) bool {
	if len(wc.bypass) > 0 && (len(r.Question) == 0 || zones.Matches(wc.bypass, r.Question[0].Name) != "") {
		return false
	}
	if wc.allZones {
		return true
	}
	return len(r.Question) > 0 && zones.Matches(wc.Zones, r.Question[0].Name) != ""
}

// serveHit writes the reply e gives q and counts the hit, and reports whether it could; it cannot when e has
// expired meanwhile. The error is the one writing to the client returned.
func (wc *WireCache) serveHit(w dns.ResponseWriter, r *dns.Msg, e *entry, q *query, now time.Time, m *serverMetrics) (bool, error) {
	c := clientOf(w)
	bp := wc.buffers.Get().(*[]byte)
	defer wc.buffers.Put(bp)
	out, ok := replyFor(c, bp, e, func(buf []byte, c client) ([]byte, bool) { return e.render(buf, q, c, now) })
	if !ok {
		return false, nil
	}
	// Counted before the reply leaves, so whoever sees the reply sees the count.
	m.hits.Inc()
	if m.core != nil {
		m.core.count(&hit{
			zone: int(e.metricsZone), tcp: c.tcp, v6: c.v6, do: q.do(), qtype: q.qtype, rcode: int(e.rcode),
			reqSize: r.Len(), respSize: int(e.chainLen), start: now,
		})
	}
	return true, out.write(w)
}

// recorder passes the plugin chain's reply on to the client and keeps it in wire format when it can be
// replayed. It builds the entry before the reply goes out, because the server fits the reply to the client
// (OPT, truncation, compression) in place, and stores it then too, so the client's next query finds it.
type recorder struct {
	dns.ResponseWriter
	wc      *WireCache
	metrics *serverMetrics
	hash    uint64
	query   query
	key     string
	now     time.Time

	// keep is false when the reply is passed on but not stored (repeats_only, the question's first ask).
	keep   bool
	writes int
	entry  *entry // the entry stored from this reply, until forgotten
	// stale is the expired entry of this query, kept under serve_stale; it answers if the chain fails.
	stale *entry
}

// WriteMsg implements the dns.ResponseWriter interface.
func (r *recorder) WriteMsg(m *dns.Msg) error {
	r.writes++
	if r.stale != nil && r.writes == 1 && m != nil && !r.wc.refreshes(r.stale, m) {
		if served, err := r.wc.serveStale(r.ResponseWriter, r.stale, &r.query, r.metrics); served {
			return err
		}
	}
	if r.writes > 1 {
		// Only a single reply is replayed; a second one makes the first suspect.
		r.forget()
	} else if m != nil && r.keep {
		// A buffer hits are rendered in holds any answer the cache stores, packed.
		bp := r.wc.buffers.Get().(*[]byte)
		e, err := newEntry(m, &r.query, r.key, r.now, r.wc.lifetimes(), (*bp)[:cap(*bp)])
		r.wc.buffers.Put(bp)
		if err == nil {
			e.ttlFloor = r.wc.ttlFloor(m)
			if r.wc.metricsZones != nil {
				// #nosec G115 -- an index of the block's zones, and a message's length
				e.metricsZone, e.chainLen = int32(metricsZone(r.wc.metricsZones, r.query.name)), int32(m.Len())
			}
			r.entry = e
			r.wc.store.add(r.hash, e, r.now)
			r.metrics.held(r.wc.store)
		}
	}
	if err := r.ResponseWriter.WriteMsg(m); err != nil {
		r.forget()
		return err
	}
	return nil
}

// Write implements the dns.ResponseWriter interface. Bytes written by the chain are passed on, never stored.
func (r *recorder) Write(b []byte) (int, error) {
	r.writes++
	r.forget()
	return r.ResponseWriter.Write(b)
}

// lifetimes returns the bounds newEntry puts on how long an answer is held.
func (wc *WireCache) lifetimes() lifetimes {
	return lifetimes{min: wc.MinTTL, max: wc.MaxTTL, refused: wc.RefusedFor, servfail: wc.ServfailFor}
}

// ttlFloorer is a plugin behind wirecache that keeps the TTLs of the answers it passes at or above a
// minimum: clamp. TTLFloor returns that minimum for res, and false when the plugin leaves res alone.
type ttlFloorer interface {
	TTLFloor(res *dns.Msg) (floor uint32, ok bool)
}

// ttlFloor returns the least TTL a hit of the answer m may serve: the minimum the block's clamp applies to
// m, or 0. It is asked once per answer stored, so a hit only compares.
func (wc *WireCache) ttlFloor(m *dns.Msg) uint32 {
	if wc.floorer == nil {
		return 0
	}
	if floor, ok := wc.floorer.TTLFloor(m); ok {
		return floor
	}
	return 0
}

// forget removes the entry stored from this reply, if any.
func (r *recorder) forget() {
	if r.entry == nil {
		return
	}
	r.wc.store.remove(r.hash, r.entry)
	r.metrics.held(r.wc.store)
	r.entry = nil
}
