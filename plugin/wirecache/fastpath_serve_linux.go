//go:build linux

package wirecache

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coredns/coredns/core/dnsserver"

	"github.com/miekg/dns"
)

const (
	// maxKeptServers bounds the goroutines a fast path keeps between the queries it hands to CoreDNS's
	// server. Under more concurrent misses than this, a query gets a goroutine of its own, as miekg/dns
	// gives each.
	maxKeptServers = 256
	// maxIdleServers is how many of them stay once idle for a whole trimPeriod, so that a burst (a slow
	// upstream holding many misses at once) leaves no more than this many grown stacks behind.
	maxIdleServers = 16
	// trimPeriod is how often the kept goroutines are trimmed while more than maxIdleServers of them are
	// idle: those idle for a whole period end, a period or two after a burst. With no more idle, no timer
	// runs, so an idle cache is not woken for it.
	trimPeriod = time.Second
)

// chainServers hand the queries the fast path holds no answer for to CoreDNS's server, as miekg/dns's UDP
// server would: unpacked by dns.Msg.Unpack into the request it would build, answered by the server's
// ServeDNS through a writer that packs and writes as miekg/dns's does. They get the plain queries it read
// (misses, expired entries), and the whole datagrams it did not read that the server's accept function lets
// through (serverAccepts: other classes, NOTIFY, DS, compressed names, ...), of a server without TSIG
// secrets (whose miekg/dns server checks no TSIG). One miekg/dns does not unpack goes on to the fast path's
// miekg/dns server (chainConn), which answers it FORMERR, as it does every datagram the accept function
// refuses or ignores, and every datagram cut short by the read.
//
// They differ from that server in what it costs: a miss goes deep into the plugin chain (cache, the upstream
// exchange), and a goroutine started for each query grows its stack again for each one. The goroutines here
// are kept between queries, so their stacks stay grown, and a query reaches one in a single hand-off.
type chainServers struct {
	fp  *fastPath
	ctx context.Context
	// jobs is unbuffered: a send succeeds only when a kept goroutine is idle and waiting.
	jobs chan passedQuery
	// trims ends the idle kept goroutine that receives from it; unbuffered, like jobs.
	trims chan struct{}
	// kept counts the kept goroutines, busy those of them answering a query, started those ever started.
	kept, busy, started atomic.Int32
	// fewestIdle is the fewest kept goroutines that were idle at once since the last trim.
	fewestIdle atomic.Int32
	inFly      sync.WaitGroup
	// trimEvery is the trim period (trimPeriod; tests set their own before the first query). trimTimer
	// runs trimTick, and trimArmed says whether it is set to.
	trimEvery time.Duration
	trimTimer *time.Timer
	trimArmed atomic.Bool
}

func newChainServers(fp *fastPath) *chainServers {
	// The context CoreDNS's server builds for each query; nothing in the chain changes it in place.
	ctx := context.WithValue(context.Background(), dnsserver.Key{}, fp.srv)
	ctx = context.WithValue(ctx, dnsserver.LoopKey{}, 0)
	s := &chainServers{fp: fp, ctx: ctx, jobs: make(chan passedQuery), trims: make(chan struct{}), trimEvery: trimPeriod}
	s.trimTimer = time.AfterFunc(time.Hour, s.trimTick)
	s.trimTimer.Stop()
	return s
}

// serve hands q, a plain query, to the server.
func (s *chainServers) serve(q passedQuery) {
	s.inFly.Add(1)
	select {
	case s.jobs <- q:
		return
	default:
	}
	s.fewestIdle.Store(0)
	if s.kept.Add(1) <= maxKeptServers {
		s.started.Add(1)
		go s.keep(q)
		return
	}
	s.kept.Add(-1)
	go s.answer(q)
}

// keep answers q, then whatever comes next, until close or until trim ends it.
func (s *chainServers) keep(q passedQuery) {
	defer s.kept.Add(-1)
	for {
		s.noteIdle(s.kept.Load() - s.busy.Add(1))
		s.answer(q)
		if s.kept.Load()-s.busy.Add(-1) > maxIdleServers {
			s.armTrim()
		}
		var ok bool
		select {
		case q, ok = <-s.jobs:
			if !ok {
				return
			}
		case <-s.trims:
			return
		}
	}
}

// noteIdle lowers fewestIdle to idle, the number of kept goroutines idle at this moment.
func (s *chainServers) noteIdle(idle int32) {
	for {
		fewest := s.fewestIdle.Load()
		if idle >= fewest || s.fewestIdle.CompareAndSwap(fewest, idle) {
			return
		}
	}
}

// armTrim sets the trim timer, unless it is set already.
func (s *chainServers) armTrim() {
	if s.trimArmed.CompareAndSwap(false, true) {
		s.trimTimer.Reset(s.trimEvery)
	}
}

// trimTick trims, and sets the timer again while more than maxIdleServers kept goroutines are idle: after
// a burst, the first trim starts a period and the second ends the goroutines idle all through it.
func (s *chainServers) trimTick() {
	s.trim()
	s.trimArmed.Store(false)
	if s.kept.Load()-s.busy.Load() > maxIdleServers {
		s.armTrim()
	}
}

// trim ends the kept goroutines beyond maxIdleServers that stayed idle since the last trim, and starts the
// next period; it returns how many it ended. Ending a goroutine only after a whole period idle keeps the
// stacks a steady load needs. Under misses at full speed, goroutines ended as soon as more than
// maxIdleServers were idle (between two batches of queries) were started again for the next batch, and
// growing their stacks again took 8 % of the cache's CPU.
func (s *chainServers) trim() (ended int) {
	idle := s.kept.Load() - s.busy.Load()
	for excess := min(s.fewestIdle.Swap(idle), idle) - maxIdleServers; excess > 0; excess-- {
		select {
		case s.trims <- struct{}{}:
			ended++
		default:
			return ended // the rest went busy meanwhile
		}
	}
	return ended
}

func (s *chainServers) answer(q passedQuery) {
	defer s.inFly.Done()
	req := new(dns.Msg)
	if err := req.Unpack(q.b); err != nil {
		// The query gets the answer miekg/dns's server gives to what it cannot read.
		s.fp.chain.passQuery(q)
		return
	}
	s.fp.srv.ServeDNS(s.ctx, &chainWriter{fp: s.fp, to: q.from}, req)
}

// close lets the kept goroutines end once idle. No serve may follow it.
func (s *chainServers) close() {
	close(s.jobs)
	s.trimTimer.Stop()
}

// wait waits for the queries handed over to be answered, or ctx to end.
func (s *chainServers) wait(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		s.inFly.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// serverAccepts reports whether miekg/dns's server, with CoreDNS's accept function for a server whose
// plugins accept no other opcode (dns.DefaultMsgAcceptFunc; the fast path does not run for one that does),
// would go on to unpack the datagram b, as it reads it, and serve it, rather than answer it itself (FORMERR,
// NOTIMP) or ignore it (a response, a datagram shorter than a header). It reads the first maxFastQuery bytes
// of a datagram: a longer one it does not read whole is left to it.
func serverAccepts(b []byte) bool {
	if len(b) < headerLen || len(b) > maxFastQuery {
		return false
	}
	return dns.DefaultMsgAcceptFunc(wireHeader(b)) == dns.MsgAccept
}

// chainWriter is the dns.ResponseWriter of a query chainServers hands over: miekg/dns's UDP response writer
// for a server with no TSIG secrets, writing through the fast path's socket.
type chainWriter struct {
	fp     *fastPath
	to     *net.UDPAddr
	closed bool
}

var (
	errWriteAfterClose = errors.New("dns: Write called after Close")
	errClosedTwice     = errors.New("dns: connection already closed")
)

// WriteMsg implements dns.ResponseWriter.
func (w *chainWriter) WriteMsg(m *dns.Msg) error {
	if w.closed {
		return errWriteAfterClose
	}
	return w.fp.sendMsg(m, w.to)
}

// Write implements dns.ResponseWriter.
func (w *chainWriter) Write(b []byte) (int, error) {
	if w.closed {
		return 0, errWriteAfterClose
	}
	return w.fp.sendTo(b, w.to)
}

// LocalAddr implements dns.ResponseWriter.
func (w *chainWriter) LocalAddr() net.Addr { return w.fp.conn.LocalAddr() }

// RemoteAddr implements dns.ResponseWriter.
func (w *chainWriter) RemoteAddr() net.Addr { return w.to }

// TsigStatus implements dns.ResponseWriter: the query carried no TSIG.
func (w *chainWriter) TsigStatus() error { return nil }

// TsigTimersOnly implements dns.ResponseWriter.
func (w *chainWriter) TsigTimersOnly(bool) {}

// Hijack implements dns.ResponseWriter; a UDP writer has nothing to give up.
func (w *chainWriter) Hijack() {}

// Close implements dns.ResponseWriter; the socket is the fast path's.
func (w *chainWriter) Close() error {
	if w.closed {
		return errClosedTwice
	}
	w.closed = true
	return nil
}

// ConnectionState implements dns.ConnectionStater as miekg/dns's writer does for UDP.
func (w *chainWriter) ConnectionState() *tls.ConnectionState { return nil }
