package upstreamsvc

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// Pipelining limits. The cluster DNS (CoreDNS, and every server built on miekg/dns) answers the queries of
// one TCP connection one after another, so a slow answer holds up the queries sent after it on the same
// connection. A query that has waited stallAfter while its connection returned no answer, and that is not
// itself the oldest one waiting there, leaves the connection to forward (one query per connection); the
// connection then takes no new queries and closes once its last query is answered or gone.
const (
	stallAfter       = 25 * time.Millisecond
	pipeReadTimeout  = 2 * time.Second // forward's read timeout
	pipeDialTimeout  = 2 * time.Second
	pipeWriteTimeout = 2 * time.Second
	maxPipeConns     = 8
	pipeRedial       = time.Second // after a failed dial, forward carries the queries this long
	pipeReadBuffer   = 16 << 10
)

var (
	// errPipeUnavailable means the query was not sent: no connection could take it now.
	errPipeUnavailable = errors.New("no pipelined connection available")
	errPipeClosed      = errors.New("pipelined connection closed before the answer")
	errPipeStalled     = errors.New("pipelined connection held up by an earlier query")
	errPipeTimeout     = errors.New("no answer on the pipelined connection in time")
)

// pipeline carries queries to one address over TCP, many at once on one connection (RFC 7766,
// section 6.2.1.1), matching the answers to the queries by ID in whatever order they come. Queries that
// arrive while a write is pending go out with it in one write, so that under load a batch of misses costs
// the cache, and the cluster DNS, one TCP segment and one read instead of one per query. A connection takes
// new queries for expire after it opened; a new one then opens beside it and takes over (kube-proxy picks
// the cluster DNS Pod for each connection, so the load keeps moving between them), and the old one closes
// once its last query is answered.
//
// Every error leaves the query unanswered and tells the caller why; the caller sends it with forward.
type pipeline struct {
	addr   string
	expire time.Duration
	dialer net.Dialer

	mu         sync.Mutex
	conns      []*pipeConn // the last one takes new queries while usable
	dialing    bool
	dialFailed time.Time
	closed     bool
}

func newPipeline(addr string, expire time.Duration) *pipeline {
	return &pipeline{
		addr:   addr,
		expire: expire,
		dialer: net.Dialer{Timeout: pipeDialTimeout},
	}
}

// observe records an answer in CoreDNS's proxy metrics, as forward records its own.
func (p *pipeline) observe(m *dns.Msg, took time.Duration) {
	rc, known := dns.RcodeToString[m.Rcode]
	if !known {
		rc = strconv.Itoa(m.Rcode)
	}
	proxyRequestDuration.WithLabelValues(proxyName, p.addr, rc).Observe(took.Seconds())
}

// countConn counts a query sent on an open connection (reused) or a connection opened, as forward's
// connection cache hits and misses.
func (p *pipeline) countConn(reused bool) {
	if reused {
		proxyConnCacheHits.WithLabelValues(proxyName, p.addr, "tcp").Inc()
	} else {
		proxyConnCacheMisses.WithLabelValues(proxyName, p.addr, "tcp").Inc()
	}
}

// streamIO is how a pipelined connection is read and written: the net.Conn, or on Linux raw calls on its
// socket (streamio_linux.go).
type streamIO interface {
	io.Reader
	io.Writer
}

// pipeConn is one pipelined TCP connection.
type pipeConn struct {
	p      *pipeline
	c      net.Conn
	io     streamIO
	opened time.Time

	mu      sync.Mutex
	pending map[uint16]*pipeQuery
	nextID  uint16
	seq     uint64 // queries sent so far
	answers uint64 // answers read so far
	wbuf    []byte // frames waiting for the writer
	spare   []byte
	writing bool
	retired bool  // takes no new queries; closes when nothing is pending
	err     error // closed, and why
}

// pipeQuery is a query waiting for its answer on a connection.
type pipeQuery struct {
	seq  uint64
	done chan *dns.Msg // the answer, or closed when the connection closed
}

// exchange sends r and returns the answer, with r's ID.
func (p *pipeline) exchange(ctx context.Context, r *dns.Msg) (*dns.Msg, error) {
	c, reused, err := p.conn()
	if err != nil {
		return nil, err
	}
	packed, err := r.Pack()
	if err != nil {
		return nil, err
	}
	start := time.Now()
	q := &pipeQuery{done: make(chan *dns.Msg, 1)}
	id, ok := c.enqueue(q, packed)
	if !ok {
		return nil, errPipeUnavailable
	}
	if reused {
		p.countConn(true)
	}
	m, err := c.wait(ctx, q, id, start)
	if err != nil {
		return nil, err
	}
	m.Id = r.Id
	p.observe(m, time.Since(start))
	return m, nil
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
	sio, err := newStreamIO(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	for _, o := range p.conns {
		o.retire()
	}
	c := &pipeConn{p: p, c: nc, io: sio, opened: time.Now(), pending: map[uint16]*pipeQuery{}}
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
// at it already. It reports false when the connection takes no new queries.
func (c *pipeConn) enqueue(q *pipeQuery, packed []byte) (uint16, bool) {
	c.mu.Lock()
	if c.err != nil || c.retired || len(c.pending) >= 1<<16-1 {
		c.mu.Unlock()
		return 0, false
	}
	id := c.nextID
	for c.pending[id] != nil {
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
	return id, true
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

// wait waits for q's answer. It gives up when the connection closes, when ctx ends, after pipeReadTimeout,
// and after stallAfter without an answer on the connection while an earlier query waits there too.
func (c *pipeConn) wait(ctx context.Context, q *pipeQuery, id uint16, start time.Time) (*dns.Msg, error) {
	t := time.NewTimer(stallAfter)
	defer t.Stop()
	c.mu.Lock()
	seen := c.answers
	c.mu.Unlock()
	for {
		select {
		case m, ok := <-q.done:
			if !ok {
				return nil, errPipeClosed
			}
			return m, nil
		case <-ctx.Done():
			c.forget(id, q, false)
			return nil, ctx.Err()
		case <-t.C:
		}
		c.mu.Lock()
		progressed, oldest := c.answers != seen, c.oldestLocked(q)
		seen = c.answers
		c.mu.Unlock()
		switch {
		case time.Since(start) >= pipeReadTimeout:
			c.forget(id, q, true)
			return nil, errPipeTimeout
		case progressed:
		case oldest:
			// Nothing earlier holds it up: only later queries would gain by leaving, so new ones stay off.
			c.retire()
		default:
			c.forget(id, q, true)
			return nil, errPipeStalled
		}
		t.Reset(stallAfter)
	}
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

// forget stops waiting for q's answer; with retire, the connection takes no new queries.
func (c *pipeConn) forget(id uint16, q *pipeQuery, retire bool) {
	c.mu.Lock()
	if c.pending[id] == q {
		delete(c.pending, id)
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

// closeIfDoneLocked closes a retired connection that has nothing pending; its reader then ends.
func (c *pipeConn) closeIfDoneLocked() {
	if c.retired && len(c.pending) == 0 && c.err == nil {
		c.err = errPipeClosed
		c.c.Close()
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
	c.mu.Unlock()
	c.c.Close()
	c.p.remove(c)
}

// read reads the answers and hands each to its query, until the connection closes.
func (c *pipeConn) read() {
	r := bufio.NewReaderSize(c.io, pipeReadBuffer)
	var length [2]byte
	buf := make([]byte, dns.MaxMsgSize)
	for {
		if _, err := io.ReadFull(r, length[:]); err != nil {
			c.fail(err)
			return
		}
		n := int(binary.BigEndian.Uint16(length[:]))
		if _, err := io.ReadFull(r, buf[:n]); err != nil {
			c.fail(err)
			return
		}
		if n < 2 {
			continue
		}
		id := binary.BigEndian.Uint16(buf)
		c.mu.Lock()
		q := c.pending[id]
		delete(c.pending, id)
		c.answers++
		c.closeIfDoneLocked()
		c.mu.Unlock()
		if q == nil {
			continue // given up on, or not ours
		}
		m := new(dns.Msg)
		if err := m.Unpack(buf[:n]); err != nil {
			close(q.done)
			continue
		}
		q.done <- m
	}
}
