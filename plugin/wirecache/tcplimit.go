package wirecache

import (
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The bound on the TCP connections a cache holds: CoreDNS's server accepts every connection its listener
// hands it, each costing a goroutine, a file descriptor and its buffers, so one client that keeps thousands
// open holds hundreds of MiB of the process every other client shares. The fast path's TCP listener
// (tcpFront) accepts through connLimits instead.

// The default bounds: about 5.5 KiB resident per connection (the README's limits), so the defaults hold at
// most about 5.5 MiB, which corefile.Check counts; a client is one address, and a node's Pods each have their own.
const (
	DefaultTCPConnections          = 1024
	DefaultTCPConnectionsPerClient = 128
)

// Why a connection was refused, the reason label of coredns_wirecache_tcp_refused_total.
const (
	refusedTotal  = "total"
	refusedClient = "client"
)

// connLimits counts the TCP connections the fast paths of an instance hold, in all and per client address,
// and admits a new one only while both counts are below their bounds.
type connLimits struct {
	max, perClient int

	mu      sync.Mutex
	open    int
	clients map[netip.Addr]int
}

func newConnLimits(max, perClient int) *connLimits {
	return &connLimits{max: max, perClient: perClient, clients: map[netip.Addr]int{}}
}

// admit takes a slot for a connection from client; a refusal says which bound it met.
func (l *connLimits) admit(client netip.Addr) (refused string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.open >= l.max:
		return refusedTotal
	case l.clients[client] >= l.perClient:
		return refusedClient
	}
	l.open++
	l.clients[client]++
	return ""
}

// release gives back the slot of a connection from client.
func (l *connLimits) release(client netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.open--
	if n := l.clients[client] - 1; n > 0 {
		l.clients[client] = n
	} else {
		delete(l.clients, client)
	}
}

// A refused connection is held for RefusedHold before it is reset: a client that connects again as soon as
// its connection ends (a resolver's retry loop, an attack) is paced by the hold, instead of making the cache
// accept and reset as fast as it can connect (bench/hostile.sh, whose attacker does that: with resets at once
// the attacker's CPU went from 0.3 to 2.1 s per 3 s and the cache's up by 0.5 s). The hold is CoreDNS's
// default read timeout, as long as an accepted connection that sends nothing lasts, so that a client gains no
// faster loop by opening connections beyond its bound than by holding idle ones within it (held 1 s, the
// attacker's loops turned faster: the well-behaved Pod kept 85 % of its rate, against 89 % with 3 s). At
// most MaxHeldRefusals are held at once, each a descriptor with the kernel's smallest receive buffer and no
// goroutine (about 1 KiB resident, and the kernel's socket); one beyond them is reset at once (with 256,
// bursts of the attack's idle connections took every place, and the other attacks' loops spun again).
//
// The resets are paced too, resetBatch at most every resetPace (1,000 a second): a client's connections that
// were refused together (its idle ones, opened again together as they ended) are reset over a second, so
// that the client's next connections come back spread out instead of in one burst, which took both CPUs of
// the hostile benchmark's node for tens of milliseconds every cycle.
const (
	RefusedHold     = 3 * time.Second
	MaxHeldRefusals = 1024

	resetBatch = 16
	resetPace  = 16 * time.Millisecond
)

// refusals holds refused connections until their reset: in the order they were refused, which is the order
// of their resets, all reset by one timer's goroutine, which gives the hits a turn between them (hitTurns).
// A timer and a goroutine for each (time.AfterFunc) readied them all at once when a burst's holds ended, and
// the hits waited behind hundreds of goroutines.
type refusals struct {
	hold  time.Duration
	max   int
	pace  time.Duration // between two batches of resets (resetPace)
	turns *hitTurns

	mu     sync.Mutex
	held   []heldConn
	timer  *time.Timer // resets the due ones; armed while held is not empty
	closed bool
}

// heldConn is a refused connection and the end of its hold.
type heldConn struct {
	c   net.Conn
	due time.Time
}

func newRefusals(hold time.Duration, max int, turns *hitTurns) *refusals {
	r := &refusals{hold: hold, max: max, pace: resetPace, turns: turns}
	r.timer = time.AfterFunc(time.Hour, r.resetDue)
	r.timer.Stop()
	return r
}

// refuse resets c once the hold is over, or at once when as many are held as may be.
func (r *refusals) refuse(c net.Conn) {
	r.mu.Lock()
	if r.closed || len(r.held) >= r.max {
		r.mu.Unlock()
		reset(c)
		return
	}
	r.held = append(r.held, heldConn{c: c, due: time.Now().Add(r.hold)})
	if len(r.held) == 1 {
		r.timer.Reset(r.hold)
	}
	r.mu.Unlock()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetReadBuffer(1) // the kernel's least: what the client sends meanwhile is dropped
	}
}

// resetDue resets the connections whose hold is over, resetBatch at most, and arms the timer for the next
// ones: a pace later when the batch came full.
func (r *refusals) resetDue() {
	var due [resetBatch]net.Conn
	r.mu.Lock()
	now, n := time.Now(), 0
	for n < len(r.held) && n < len(due) && !r.held[n].due.After(now) {
		due[n] = r.held[n].c
		r.held[n] = heldConn{}
		n++
	}
	r.held = r.held[n:]
	if len(r.held) > 0 && !r.closed {
		wait := r.held[0].due.Sub(now)
		if n == len(due) {
			wait = max(wait, r.pace)
		}
		r.timer.Reset(wait)
	}
	r.mu.Unlock()
	for _, c := range due[:n] {
		reset(c)
		r.turns.worked()
	}
}

// close resets every connection held, and those refused from now on at once.
func (r *refusals) close() {
	r.mu.Lock()
	r.closed = true
	r.timer.Stop()
	held := r.held
	r.held = nil
	r.mu.Unlock()
	for _, h := range held {
		reset(h.c)
	}
}

// reset closes c with a reset, so that the client learns at once (a resolver then tries its next server).
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	c.Close()
}

// limitedListener accepts the connections its limits admit. One they refuse is held (refusals) and reset,
// and Accept goes on to the next.
type limitedListener struct {
	net.Listener
	limits   *connLimits
	refusals *refusals
	turns    *hitTurns // given one as each connection is accepted and closed
	open     prometheus.Gauge
	refused  *prometheus.CounterVec // by reason
}

// Close implements net.Listener: it resets the connections held too.
func (l *limitedListener) Close() error {
	l.refusals.close()
	return l.Listener.Close()
}

// Accept implements net.Listener.
func (l *limitedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		l.turns.worked()
		client := remoteAddr(c)
		if why := l.limits.admit(client); why != "" {
			l.refused.WithLabelValues(why).Inc()
			l.refusals.refuse(c)
			continue
		}
		l.open.Inc()
		return &limitedConn{Conn: readsWhole(c), release: func() {
			l.limits.release(client)
			l.open.Dec()
			// Connections that end together (a client's idle ones, each on a goroutine of its own readied
			// by its deadline) close in a burst too, each close delivering the FIN to the client in the
			// kernel: tens to hundreds of microseconds.
			l.turns.worked()
		}}, nil
	}
}

// remoteAddr returns the address of c's peer, unmapped.
func remoteAddr(c net.Conn) netip.Addr {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return a.AddrPort().Addr().Unmap().WithZone("")
	}
	return netip.Addr{}
}

// limitedConn gives its slot back when it is closed, once.
type limitedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

// Close implements net.Conn.
func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
