package upstreamsvc

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/coredns/coredns/plugin/metadata"
	"github.com/coredns/coredns/plugin/metrics"
	"github.com/coredns/coredns/plugin/pkg/proxy"
	"github.com/coredns/coredns/request"

	"github.com/nodelocaldns/nodelocaldns/plugin/internal/packbuf"
	"github.com/nodelocaldns/nodelocaldns/plugin/internal/series"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
)

// Pipelining limits. The cluster DNS (CoreDNS, and every server built on miekg/dns) answers the queries of
// one TCP connection one after another, so a slow answer holds up the queries sent after it on the same
// connection. A query that has waited stallAfter while its connection returned no answer, and that is not
// itself the oldest one waiting there, is stalled: the connection takes no new queries (it closes once its
// last query is answered or gone), and the query is sent once more, through forward's proxy on a connection
// of its own, while its pipelined copy goes on waiting. A stalled query is sent twice at most.
const (
	stallAfter       = 25 * time.Millisecond
	pipeReadTimeout  = 2 * time.Second // forward's read timeout
	pipeDialTimeout  = 2 * time.Second
	pipeWriteTimeout = 2 * time.Second
	maxPipeConns     = 8
	pipeRedial       = time.Second // after a failed dial, forward carries the queries this long
	// pipeWriteBuffer bounds the frames queued on a connection while a write is under way; a query that
	// finds no room waits for the writer to take them (or for the write to fail, after pipeWriteTimeout).
	pipeWriteBuffer = 64 << 10
	// maxLateIDs bounds the IDs a connection keeps for the queries given up on, whose answers may still
	// come; a connection with that many takes no new queries.
	maxLateIDs = 1024
	// maxStallResends bounds the stalled queries re-sent at once to one address: the extra load a slow
	// cluster DNS gets. A stalled query beyond it waits on its pipelined connection only.
	maxStallResends = 16
)

var (
	// errPipeUnavailable means the query was not sent: no connection could take it now.
	errPipeUnavailable = errors.New("no pipelined connection available")
	errPipeClosed      = errors.New("pipelined connection closed before the answer")
	errPipeTimeout     = errors.New("no answer on the pipelined connection in time")
	// errPipeStalled means the query stalled, and got no answer, pipelined or sent once more (or could not
	// be sent once more, too many re-sends being under way): it is not to be sent again.
	errPipeStalled = errors.New("no answer to a stalled query")
)

// pipeline carries queries to one address over TCP, many at once on one connection (RFC 7766,
// section 6.2.1.1), matching the answers to the queries by ID in whatever order they come. Queries that
// arrive while a write is pending go out with it in one write, so that under load a batch of misses costs
// the cache, and the cluster DNS, one TCP segment and one read instead of one per query. A connection takes
// new queries for expire after it opened; a new one then opens beside it and takes over (kube-proxy picks
// the cluster DNS Pod for each connection, so the load keeps moving between them), and the old one closes
// once its last query is answered.
//
// Every error leaves the query unanswered and tells the caller why; the caller sends it through the
// proxies, if its budget allows, except after errPipeStalled.
type pipeline struct {
	addr   string
	expire time.Duration
	dialer net.Dialer
	zones  string // metrics label: the server block's zones
	// resender is forward's proxy to addr, which sends a stalled query once more; nil: stalled queries
	// only wait.
	resender *lazyProxy
	resends  chan struct{} // one token per re-send under way
	// forwardUpstream is forward/upstream's metadata value for the queries sent here.
	forwardUpstream metadata.Func
	// newIO returns how a new connection is read and written (newStreamIO; tests wrap it).
	newIO func(net.Conn) (streamIO, error)
	// series are where the queries sent here are counted.
	series pipeSeries
	// stallTimers keeps the timers of pipeConn.wait, stopped, between queries: a timer is three objects,
	// a tenth of what a miss allocated in upstreamsvc.
	stallTimers sync.Pool
	// queries keeps the pipeQuery of each answered query, with its channel, for the next (reuse); packs
	// keeps the buffers queries are packed into.
	queries sync.Pool
	packs   packbuf.Pool

	mu         sync.Mutex
	conns      []*pipeConn // the last one takes new queries while usable
	dialing    bool
	dialFailed time.Time
	closed     bool
}

// newPipeline returns a pipeline to addr whose stalled queries resender sends once more.
func newPipeline(addr string, expire time.Duration, resender *lazyProxy, zones string) *pipeline {
	return &pipeline{
		addr:            addr,
		expire:          expire,
		dialer:          net.Dialer{Timeout: pipeDialTimeout},
		zones:           zones,
		resender:        resender,
		resends:         make(chan struct{}, maxStallResends),
		forwardUpstream: func() string { return addr },
		newIO:           newStreamIO,
	}
}

// observe records an answer in CoreDNS's proxy metrics, as forward records its own.
func (p *pipeline) observe(m *dns.Msg, took time.Duration) {
	rcode := m.Rcode
	duration := func() prometheus.Observer {
		rc, known := dns.RcodeToString[rcode]
		if !known {
			rc = strconv.Itoa(rcode)
		}
		return proxyRequestDuration.WithLabelValues(proxyName, p.addr, rc)
	}
	if rcode < 0 || rcode >= len(p.series.duration) {
		duration().Observe(took.Seconds()) // an extended rcode beyond BADCOOKIE: labelled each time
		return
	}
	p.series.duration[rcode].Get(duration).Observe(took.Seconds())
}

// countConn counts a query sent on an open connection (reused) or a connection opened, as forward's
// connection cache hits and misses.
func (p *pipeline) countConn(reused bool) {
	if reused {
		p.series.reused.Get(func() prometheus.Counter {
			return proxyConnCacheHits.WithLabelValues(proxyName, p.addr, "tcp")
		}).Inc()
	} else {
		p.series.opened.Get(func() prometheus.Counter {
			return proxyConnCacheMisses.WithLabelValues(proxyName, p.addr, "tcp")
		}).Inc()
	}
}

// pipeSeries are a pipeline's children of CoreDNS's proxy series, resolved on first use.
type pipeSeries struct {
	reused, opened series.Slot[prometheus.Counter]
	duration       [dns.RcodeBadCookie + 1]series.Slot[prometheus.Observer] // by rcode
}

// streamIO is how a pipelined connection is read and written: through the net.Conn (connIO), or on Linux
// with raw calls on its socket (streamio_linux.go).
type streamIO interface {
	io.Writer
	// readMessages reads the connection's messages, each after its length, and hands each to deliver, which
	// must not keep it, until the connection fails or ends: it returns why.
	readMessages(deliver func(msg []byte)) error
	// shutdown ends the connection both ways without waiting for its reader, which may be the caller: its
	// reading then ends, and pipeConn.fail closes it.
	shutdown()
}

// pipeConn is one pipelined TCP connection.
type pipeConn struct {
	p      *pipeline
	c      net.Conn
	io     streamIO
	opened time.Time

	mu      sync.Mutex
	pending map[uint16]*pipeQuery
	// late holds the IDs of the queries given up on whose answers may still come: no new query takes one
	// until its answer came, so a late answer is never taken for another query's.
	late    map[uint16]struct{}
	nextID  uint16
	seq     uint64 // queries sent so far
	answers uint64 // answers read so far
	wbuf    []byte // frames waiting for the writer, at most pipeWriteBuffer bytes but for a lone frame
	spare   []byte
	room    chan struct{} // closed when the writer takes wbuf or the connection closes; nil: nobody waits
	writing bool
	retired bool  // takes no new queries; closes when nothing is pending
	err     error // closed, and why
}

// pipeQuery is a query waiting for its answer on a connection.
type pipeQuery struct {
	seq  uint64
	done chan *dns.Msg // the answer, or closed when the connection closed
}

// newQuery returns a pipeQuery with an empty channel, one an answered query left if there is one.
func (p *pipeline) newQuery() *pipeQuery {
	if q, _ := p.queries.Get().(*pipeQuery); q != nil {
		return q
	}
	return &pipeQuery{done: make(chan *dns.Msg, 1)}
}

// reuse keeps q, whose answer was received from q.done, for a later query. Only then is q sure to be
// nobody else's: deliver took it from the pending queries before it sent the answer, which was the one
// send or close its channel gets. A query given up, or whose connection closed, is left to the collector:
// an answer may still be sent to it, or its channel is closed.
func (p *pipeline) reuse(q *pipeQuery) {
	q.seq = 0
	p.queries.Put(q)
}

// exchange sends r and returns the answer, with r's ID. w is the client's writer, which forward's proxy
// reads the transport from when the query stalls and is sent once more. The copy sent here, and the one
// sent once more, are spent from budget; with none left, nothing is sent (errPipeUnavailable).
func (p *pipeline) exchange(ctx context.Context, w dns.ResponseWriter, r *dns.Msg, budget *attempts) (*dns.Msg, error) {
	if !budget.left() {
		return nil, errPipeUnavailable
	}
	c, reused, err := p.conn()
	if err != nil {
		return nil, err
	}
	// enqueue copies the packed query into the connection's write buffer: the buffer is free once it returns.
	buf := p.packs.Get()
	packed, err := buf.Pack(r)
	if err != nil {
		p.packs.Put(buf)
		return nil, err
	}
	start := time.Now()
	q := p.newQuery()
	id, err := c.enqueue(ctx, q, packed)
	p.packs.Put(buf)
	if err != nil {
		p.reuse(q) // never pending: nothing can send to it
		return nil, err
	}
	budget.spend()
	if reused {
		p.countConn(true)
	}
	m, err := c.wait(ctx, q, id, start, w, r, budget)
	if err != nil {
		return nil, err
	}
	m.Id = r.Id
	return m, nil
}

// resendResult is the outcome of a stalled query sent once more.
type resendResult struct {
	m   *dns.Msg
	err error
}

// resend sends a copy of r through forward's proxy, on a connection of its own, unless maxStallResends
// are under way already. It returns where the outcome will come and what stops the copy once it is not
// needed, or nils when it sent nothing.
func (p *pipeline) resend(ctx context.Context, w dns.ResponseWriter, r *dns.Msg) (<-chan resendResult, context.CancelFunc) {
	if p.resender == nil {
		return nil, nil
	}
	select {
	case p.resends <- struct{}{}:
	default:
		return nil, nil
	}
	ctx, cancel := context.WithCancel(ctx)
	stallResends.WithLabelValues(metrics.WithServer(ctx), p.zones, p.addr).Inc()
	// A copy, since the proxy sets its ID on the wire while this query goes on waiting; the size the
	// proxy reads is computed here, where the client's writer is still this query's.
	state := request.Request{W: w, Req: r.Copy()}
	state.Size()
	out := make(chan resendResult, 1)
	go func() {
		defer func() { <-p.resends }()
		px := p.resender.started()
		for {
			m, _, _, err := px.Connect(ctx, state, proxy.Options{ForceTCP: true})
			if errors.Is(err, proxy.ErrCachedClosed) {
				continue // closed before the query went out, as forward retries it
			}
			if err != nil && ctx.Err() == nil {
				px.Healthcheck() // as forward does after a failed exchange, not one stopped here
			}
			out <- resendResult{m, err}
			return
		}
	}()
	return out, cancel
}

// conn returns the connection that takes new queries, and whether it was open already. Without one, it
// opens one, unless another query is opening one or a dial failed within pipeRedial (forward then carries
// the query). The connection that has been open for expire goes on taking queries while a new one opens
// beside it.
func (p *pipeline) conn() (*pipeConn, bool, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, false, errPipeUnavailable
	}
	var c *pipeConn
	if n := len(p.conns); n > 0 {
		last := p.conns[n-1]
		last.mu.Lock()
		if last.err == nil && !last.retired {
			c = last
		}
		last.mu.Unlock()
	}
	canDial := !p.dialing && len(p.conns) < maxPipeConns && time.Since(p.dialFailed) >= pipeRedial
	if c != nil {
		if canDial && time.Since(c.opened) >= p.expire {
			p.dialing = true
			go func() { _, _ = p.dial() }() // a failed one leaves this connection in use
		}
		p.mu.Unlock()
		return c, true, nil
	}
	if !canDial {
		p.mu.Unlock()
		return nil, false, errPipeUnavailable
	}
	p.dialing = true
	p.mu.Unlock()
	c, err := p.dial()
	return c, false, err
}

// dial opens a connection, which takes the new queries from then on; the others are retired.
func (p *pipeline) dial() (*pipeConn, error) {
	nc, err := p.dialer.Dial("tcp", p.addr)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dialing = false
	if err != nil {
		p.dialFailed = time.Now()
		return nil, err
	}
	p.countConn(false)
	if p.closed {
		nc.Close()
		return nil, errPipeUnavailable
	}
	sio, err := p.newIO(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	for _, o := range p.conns {
		o.retire()
	}
	c := &pipeConn{p: p, c: nc, io: sio, opened: time.Now(), pending: map[uint16]*pipeQuery{}, late: map[uint16]struct{}{}}
	p.conns = append(p.conns, c)
	go c.read()
	return c, nil
}

// remove forgets a closed connection.
func (p *pipeline) remove(c *pipeConn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.conns = slices.DeleteFunc(p.conns, func(o *pipeConn) bool { return o == c })
}

// close closes every connection; the queries waiting on them return errPipeClosed.
func (p *pipeline) close() {
	p.mu.Lock()
	p.closed = true
	conns := append([]*pipeConn(nil), p.conns...)
	p.mu.Unlock()
	for _, c := range conns {
		c.fail(errPipeClosed)
	}
}

// enqueue registers q under a free ID, queues its frame, and writes the queued frames unless a writer is
// at it already. While the queued frames leave no room for this one, it waits for the writer to take them
// (back-pressure), until ctx ends. It returns errPipeUnavailable when the connection takes no new queries.
func (c *pipeConn) enqueue(ctx context.Context, q *pipeQuery, packed []byte) (uint16, error) {
	c.mu.Lock()
	for c.err == nil && len(c.wbuf) > 0 && len(c.wbuf)+2+len(packed) > pipeWriteBuffer {
		if c.room == nil {
			c.room = make(chan struct{})
		}
		room := c.room
		c.mu.Unlock()
		select {
		case <-room:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		c.mu.Lock()
	}
	if c.err != nil || c.retired || len(c.pending)+len(c.late) >= 1<<16-1 {
		c.mu.Unlock()
		return 0, errPipeUnavailable
	}
	id := c.nextID
	for c.takenLocked(id) {
		id++
	}
	c.nextID = id + 1
	c.seq++
	q.seq = c.seq
	c.pending[id] = q
	binary.BigEndian.PutUint16(packed, id)
	c.wbuf = binary.BigEndian.AppendUint16(c.wbuf, uint16(len(packed)))
	c.wbuf = append(c.wbuf, packed...)
	write := !c.writing
	c.writing = true
	c.mu.Unlock()
	if write {
		c.flush()
	}
	return id, nil
}

// takenLocked reports whether id is a waiting query's, or a given-up query's whose answer may still come.
func (c *pipeConn) takenLocked(id uint16) bool {
	if c.pending[id] != nil {
		return true
	}
	_, late := c.late[id]
	return late
}

// wakeLocked wakes the queries waiting for room in the write buffer.
func (c *pipeConn) wakeLocked() {
	if c.room != nil {
		close(c.room)
		c.room = nil
	}
}

// flush writes the queued frames until none is left. It first yields, so that the goroutines ready to
// send (the other misses of the batch the fast path just read) queue theirs to go in the same write.
func (c *pipeConn) flush() {
	for {
		runtime.Gosched()
		c.mu.Lock()
		if len(c.wbuf) == 0 || c.err != nil {
			c.writing = false
			c.mu.Unlock()
			return
		}
		buf := c.wbuf
		c.wbuf, c.spare = c.spare[:0], nil
		c.wakeLocked()
		c.mu.Unlock()
		err := c.c.SetWriteDeadline(time.Now().Add(pipeWriteTimeout))
		if err == nil {
			_, err = c.io.Write(buf)
		}
		c.mu.Lock()
		c.spare = buf[:0]
		c.mu.Unlock()
		if err != nil {
			c.fail(err)
			c.mu.Lock()
			c.writing = false
			c.mu.Unlock()
			return
		}
	}
}

// wait waits for q's answer. It gives up when ctx ends, and when the connection closes or returns nothing
// for q in pipeReadTimeout: the caller then sends the query with forward, unless it stalled. A stalled query
// (see stalled) is sent once more through forward's proxy, when fewer than maxStallResends are under way,
// while its pipelined copy goes on waiting; the first answer wins. One that found no room is sent once more
// if it is still stalled at a later check and there is room then, or when its pipelined copy gets no
// answer, if there is room then. It is sent once more only if budget has a copy left. A stalled query is
// never sent a third time: when no copy is answered, wait returns errPipeStalled.
func (c *pipeConn) wait(ctx context.Context, q *pipeQuery, id uint16, start time.Time, w dns.ResponseWriter, r *dns.Msg, budget *attempts) (*dns.Msg, error) {
	t, _ := c.p.stallTimers.Get().(*time.Timer)
	if t == nil {
		t = time.NewTimer(stallAfter)
	} else {
		t.Reset(stallAfter)
	}
	defer func() {
		// Since Go 1.23 a timer stopped delivers nothing, so the next query's wait starts clean.
		t.Stop()
		c.p.stallTimers.Put(t)
	}()
	c.mu.Lock()
	seen := c.answers
	c.mu.Unlock()
	var (
		done      = q.done
		tick      = t.C
		lost      error               // why the pipelined copy gets no answer; nil while it may
		held      bool                // q stalled
		resending bool                // q was sent once more
		resent    <-chan resendResult // the copy sent once more, while under way
		resendErr error               // why that copy got no answer
	)
	// A copy sent once more is not needed once this returns: ending its context ends a dial to an upstream
	// that does not answer, which would hold its place among the re-sends for up to the proxy's 30 s.
	var stopResend context.CancelFunc
	defer func() {
		if stopResend != nil {
			stopResend()
		}
	}()
	for {
		retry := false // q is to be sent once more, if it was not and there is room
		select {
		case m, ok := <-done:
			if ok {
				c.p.observe(m, time.Since(start))
				c.p.reuse(q)
				return m, nil
			}
			lost, done, tick, retry = errPipeClosed, nil, nil, held
		case res := <-resent:
			if res.err == nil {
				c.forget(id, q, false)
				return res.m, nil
			}
			resent, resendErr = nil, res.err
		case <-ctx.Done():
			c.forget(id, q, false)
			return nil, ctx.Err()
		case <-tick:
			if time.Since(start) >= pipeReadTimeout {
				c.forget(id, q, true)
				lost, done, tick, retry = errPipeTimeout, nil, nil, held
				break
			}
			if c.stalled(q, id, held, &seen) {
				if !held {
					held = true
					stalls.WithLabelValues(metrics.WithServer(ctx), c.p.zones, c.p.addr).Inc()
				}
				retry = true
			}
			t.Reset(stallAfter)
		}
		if retry && !resending && budget.left() {
			resent, stopResend = c.p.resend(ctx, w, r)
			resending = resent != nil
			if resending {
				budget.spend()
			}
		}
		switch {
		case lost == nil || resent != nil:
			// A copy may still be answered.
		case !held:
			return nil, lost
		case !resending:
			return nil, fmt.Errorf("%w (pipelined: %w; not sent once more)", errPipeStalled, lost)
		default:
			return nil, fmt.Errorf("%w (pipelined: %w; sent once more: %w)", errPipeStalled, lost, resendErr)
		}
	}
}

// stalled reports whether q waits behind a slow answer: no answer came on the connection since the last
// check (seen), q still waits, and an earlier query waits too, or did when q was found stalled before
// (held), which spares a held query the look for it. Either way, a connection that returned no answer
// since the last check takes no new queries: only later queries would gain by its closing.
func (c *pipeConn) stalled(q *pipeQuery, id uint16, held bool, seen *uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	progressed := c.answers != *seen
	*seen = c.answers
	if progressed || c.pending[id] != q {
		return false
	}
	c.retireLocked()
	return held || !c.oldestLocked(q)
}

// oldestLocked reports whether q is the earliest query still waiting on c.
func (c *pipeConn) oldestLocked(q *pipeQuery) bool {
	for _, o := range c.pending {
		if o.seq < q.seq {
			return false
		}
	}
	return true
}

// forget stops waiting for q's answer; with retire, the connection takes no new queries. q's ID stays
// taken until its answer comes or the connection closes; a connection with maxLateIDs such IDs is retired.
func (c *pipeConn) forget(id uint16, q *pipeQuery, retire bool) {
	c.mu.Lock()
	if c.pending[id] == q {
		delete(c.pending, id)
		c.late[id] = struct{}{}
		retire = retire || len(c.late) >= maxLateIDs
	}
	if retire {
		c.retireLocked()
	} else {
		c.closeIfDoneLocked()
	}
	c.mu.Unlock()
}

func (c *pipeConn) retire() {
	c.mu.Lock()
	c.retireLocked()
	c.mu.Unlock()
}

func (c *pipeConn) retireLocked() {
	c.retired = true
	c.closeIfDoneLocked()
}

// closeIfDoneLocked ends a retired connection that has nothing pending (late answers it no longer waits
// for); its reader then ends, and closes it. Closing it here would wait for the reader's read under way,
// which may be the caller's (an answer delivered) or wait for c.mu.
func (c *pipeConn) closeIfDoneLocked() {
	if c.retired && len(c.pending) == 0 && c.err == nil {
		c.err = errPipeClosed
		c.wakeLocked()
		c.io.shutdown()
	}
}

// fail closes the connection for err; the queries waiting on it return errPipeClosed.
func (c *pipeConn) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	for id, q := range c.pending {
		close(q.done)
		delete(c.pending, id)
	}
	clear(c.late) // no answer comes any more
	c.wakeLocked()
	c.mu.Unlock()
	c.c.Close()
	c.p.remove(c)
}

// read reads the answers and hands each to its query, until the connection closes.
func (c *pipeConn) read() {
	c.fail(c.io.readMessages(c.deliver))
}

// deliver hands the answer in b to the query waiting for it. The answer to a query given up on frees its
// ID; one for an ID nobody took is dropped.
func (c *pipeConn) deliver(b []byte) {
	if len(b) < 2 {
		return
	}
	id := binary.BigEndian.Uint16(b)
	c.mu.Lock()
	q := c.pending[id]
	if q != nil {
		delete(c.pending, id)
	} else {
		delete(c.late, id)
	}
	c.answers++
	c.closeIfDoneLocked()
	c.mu.Unlock()
	if q == nil {
		return
	}
	m := new(dns.Msg)
	if err := m.Unpack(b); err != nil {
		close(q.done)
		return
	}
	q.done <- m
}
