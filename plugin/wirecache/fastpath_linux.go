//go:build linux

package wirecache

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin/pkg/reuseport"
	"github.com/nodelocaldns/nodelocaldns/nodelocal/drain"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
)

const (
	// fastBatch is how many datagrams one recvmmsg or sendmmsg moves.
	fastBatch = 16
	// fastReadSize holds any query CoreDNS reads whole, and one byte more to tell a longer one.
	fastReadSize = maxFastQuery + 1
	// fastArena holds the replies of one batch; a batch whose replies do not fit is sent in parts.
	fastArena = 16 << 10
	// maxFastReaders bounds the goroutines reading one socket.
	maxFastReaders = 4
	// passQueue is how many queries wait for CoreDNS's server before the readers wait for it.
	passQueue = 256

	// steerCheck is how often the fast path reads who is in its address's group, steerVerify how often it
	// checks with a probe that the group still sends packets to it, and probeWait bounds the wait for one
	// probe.
	steerCheck  = time.Second
	steerVerify = 10 * time.Second
	probeWait   = time.Second
	// passDrainWait bounds the wait for CoreDNS's server to take the queries passed to it when stopping.
	passDrainWait = 2 * time.Second
	// shutdownWait bounds the wait for the queries CoreDNS's server is still answering when stopping.
	shutdownWait = 5 * time.Second
	// writeErrorEvery spaces the log lines about replies the kernel refused.
	writeErrorEvery = 10 * time.Second
)

// fastPath is the listener of one server (address).
type fastPath struct {
	srv    *dnsserver.Server
	local  netip.AddrPort
	v6     bool
	routes fastRouting

	conn  *net.UDPConn
	raw   syscall.RawConn
	fd    int // conn's, to find it among the group's sockets
	chain *chainConn
	inner *dns.Server
	// servers answers the plain queries the fast path passes on; nil when the server has TSIG secrets, whose
	// replies miekg/dns's own writer signs.
	servers *chainServers

	readers  sync.WaitGroup
	stopping atomic.Bool

	// probe is the query steer sends, recognized by the readers; probeSeen tells steer one arrived.
	probe     atomic.Pointer[[]byte]
	probeSeen chan struct{}
	steerStop context.CancelFunc
	steerDone chan struct{}

	queries prometheus.Counter
	passed  prometheus.Counter
	steered prometheus.Gauge

	lastWriteError atomic.Int64
}

func startFastPath(srv *dnsserver.Server, local netip.AddrPort, routes fastRouting) (*fastPath, error) {
	fp := &fastPath{
		srv: srv, local: local, v6: local.Addr().Is6(), routes: routes,
		probeSeen: make(chan struct{}, 1), steerDone: make(chan struct{}),
		queries: fastPathQueries.WithLabelValues(srv.Addr), passed: fastPathPassed.WithLabelValues(srv.Addr), steered: fastPathSteered.WithLabelValues(srv.Addr),
	}
	// Opened as CoreDNS opens its own (dnsserver.Server.ListenPacket), so it joins that socket's group.
	pc, err := reuseport.ListenPacket("udp", local.String())
	if err != nil {
		return nil, fmt.Errorf("join the reuseport group of %s: %w", local, err)
	}
	fp.conn = pc.(*net.UDPConn)
	if fp.raw, err = fp.conn.SyscallConn(); err != nil {
		fp.conn.Close()
		return nil, err
	}
	if err := fp.raw.Control(func(fd uintptr) { fp.fd = int(fd) }); err != nil {
		fp.conn.Close()
		return nil, err
	}
	fp.chain = &chainConn{fp: fp, queue: make(chan passedQuery, passQueue), closed: make(chan struct{}), earlier: make(chan struct{}, 1)}

	// CoreDNS's own UDP server, minus the socket: the same handler, the same defaults.
	started := make(chan struct{})
	fp.inner = &dns.Server{PacketConn: fp.chain, Net: "udp", TsigSecret: srv.TsigSecret,
		Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
			ctx := context.WithValue(context.Background(), dnsserver.Key{}, srv)
			ctx = context.WithValue(ctx, dnsserver.LoopKey{}, 0)
			srv.ServeDNS(ctx, w, r)
		}),
		NotifyStartedFunc: func() { close(started) },
	}
	if len(srv.TsigSecret) == 0 {
		fp.servers = newChainServers(fp)
	}
	served := make(chan error, 1)
	go func() { served <- fp.inner.ActivateAndServe() }()
	select {
	case <-started:
	case err := <-served:
		fp.conn.Close()
		return nil, fmt.Errorf("start the server for queries the fast path passes on: %w", err)
	}

	for range min(runtime.GOMAXPROCS(0), maxFastReaders) {
		r := newFastReader(fp)
		fp.readers.Go(r.run)
	}

	ctx, cancel := context.WithCancel(context.Background())
	fp.steerStop = cancel
	go fp.keepSteered(ctx)
	return fp, nil
}

// stop hands the address back to CoreDNS's socket, answers what the fast path's socket holds and closes it.
func (fp *fastPath) stop() {
	fp.steerStop()
	<-fp.steerDone
	if group, err := drain.Group(drain.UDP, fp.local); err != nil {
		log.Warningf("fast path on %s: reading the sockets bound to %s: %v", fp.srv.Addr, fp.local, err)
	} else if !hasForeign(group) && !drain.TakingOver(fp.local) {
		if err := fp.steer(context.Background(), group, false); err != nil {
			log.Warningf("fast path on %s: %v", fp.srv.Addr, err)
		}
	}
	fp.stopping.Store(true)
	// Wakes the readers waiting for a packet; each then empties the socket without waiting, and returns.
	_ = fp.conn.SetReadDeadline(time.Now())
	fp.readers.Wait()

	ctx, cancel := context.WithTimeout(context.Background(), shutdownWait)
	defer cancel()
	if fp.servers != nil {
		fp.servers.close()
		if err := fp.servers.wait(ctx); err != nil {
			log.Warningf("fast path on %s: stopping: queries still being answered: %v", fp.srv.Addr, err)
		}
	}
	// The queries passed on must reach CoreDNS's server before it stops reading.
	for deadline := time.Now().Add(passDrainWait); len(fp.chain.queue) > 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	if err := fp.inner.ShutdownContext(ctx); err != nil {
		log.Warningf("fast path on %s: stopping: %v", fp.srv.Addr, err)
	}
	fp.conn.Close()
}

// keepSteered steers the group to the fast path's socket, and checks every steerCheck who is in the group.
// While this process takes the address over from an older one (drain.TakingOver) it leaves the group's
// program to the takeover. While another process has sockets there (a successor that must prove it answers, then takes the node
// over and steers the group itself), the fast path gives the group back to the kernel's hash once, if it
// was steered to the fast path, and leaves it alone. Otherwise it steers again when the group changed, and
// checks with a probe every steerVerify that packets still come to it. Each round also ends the goroutines
// the chainServers keep beyond what the last round needed (trim).
func (fp *fastPath) keepSteered(ctx context.Context) {
	defer close(fp.steerDone)
	t := time.NewTicker(steerCheck)
	defer t.Stop()
	var (
		steered, yielded bool
		lastGroup        string
		lastErr          string
		lastVerified     time.Time
	)
	setSteered := func(now bool) {
		if now == steered {
			return
		}
		steered = now
		if steered {
			fp.steered.Inc()
			log.Infof("fast path on %s: the address's UDP queries come to it", fp.srv.Addr)
		} else {
			fp.steered.Dec()
		}
	}
	defer setSteered(false)
	for {
		if fp.servers != nil {
			fp.servers.trim()
		}
		group, err := drain.Group(drain.UDP, fp.local)
		switch {
		case err != nil:
			if msg := err.Error(); msg != lastErr {
				log.Warningf("fast path on %s: reading the sockets bound to %s: %v", fp.srv.Addr, fp.local, err)
				lastErr = msg
			}
		case drain.TakingOver(fp.local):
			// This process takes the address over from an older one: the takeover owns the group's
			// program until the older sockets are gone (see drain.TakeOver).
			setSteered(false)
		case hasForeign(group):
			if yielded {
				break
			}
			// Only a group steered to this socket is given back: a program another process attached is
			// that process's business.
			landed, err := fp.probeOnce(ctx)
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				break // asked again next time
			}
			setSteered(false)
			yielded = true
			if !landed {
				log.Infof("fast path on %s: another process listens on the address too; the group is left to it", fp.srv.Addr)
				break
			}
			if err := drain.Unsteer(drain.UDP, fp.local); err != nil {
				log.Warningf("fast path on %s: %v", fp.srv.Addr, err)
			}
			log.Infof("fast path on %s: another process listens on the address too; its packets are spread by the kernel's hash and the group is left to that process", fp.srv.Addr)
		default:
			yielded = false
			if sig := groupSignature(group); sig != lastGroup || !steered || time.Since(lastVerified) >= steerVerify {
				err := fp.steer(ctx, group, true)
				if ctx.Err() != nil {
					return
				}
				lastGroup, lastVerified = sig, time.Now()
				if err != nil {
					if msg := err.Error(); msg != lastErr {
						log.Infof("fast path on %s: %v; the plugin chain's socket answers meanwhile", fp.srv.Addr, err)
						lastErr = msg
					}
				} else {
					lastErr = ""
				}
				setSteered(err == nil)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func hasForeign(group []drain.Socket) bool {
	for _, s := range group {
		if s.FD < 0 {
			return true
		}
	}
	return false
}

// groupSignature names the sockets of a group, in any order.
func groupSignature(group []drain.Socket) string {
	inodes := make([]uint64, len(group))
	for i, s := range group {
		inodes[i] = s.Inode
	}
	slices.Sort(inodes)
	return fmt.Sprint(inodes)
}

// steer points the address's reuseport group at the fast path's socket (toUs) or at another socket of this
// process, and checks with a probe that packets land there. group is the group's sockets, all this
// process's: another process's group is not this one's to steer. Socket indexes move as sockets leave, so each
// index is tried until a probe lands where it should.
func (fp *fastPath) steer(ctx context.Context, group []drain.Socket, toUs bool) error {
	if !slices.ContainsFunc(group, func(s drain.Socket) bool { return s.FD == fp.fd }) {
		return fmt.Errorf("the fast path's socket is no longer bound to %s", fp.local)
	}
	n := len(group)
	if n < 2 {
		return nil // nobody to share with, nothing to steer
	}
	order := make([]uint32, 0, n)
	order = append(order, uint32(n-1)) // the socket that joined last: ours, unless one left since
	for i := range n - 1 {
		order = append(order, uint32(i))
	}
	for _, index := range order {
		if err := drain.SteerTo(drain.UDP, fp.local, index); err != nil {
			return err
		}
		landed, err := fp.probeOnce(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			continue
		}
		if landed == toUs {
			return nil
		}
	}
	if err := drain.Unsteer(drain.UDP, fp.local); err != nil {
		return err
	}
	if toUs {
		return fmt.Errorf("no socket index of %s's group sends packets to the fast path; the kernel spreads them by hash", fp.local)
	}
	return fmt.Errorf("no socket index of %s's group keeps packets from the fast path; the kernel spreads them by hash", fp.local)
}

// probeOnce sends a query to the address and reports whether it landed on the fast path's socket. The query
// has EDNS version 1: the fast path does not answer it, and CoreDNS's server answers BADVERS before any
// plugin sees it, so a probe that lands elsewhere changes nothing and is answered at once.
func (fp *fastPath) probeOnce(ctx context.Context) (landed bool, err error) {
	var nonce [8]byte
	_, _ = rand.Read(nonce[:])
	q := new(dns.Msg)
	q.SetQuestion(fmt.Sprintf("%x.steer.wirecache.invalid.", nonce), dns.TypeTXT)
	q.Id = binary.BigEndian.Uint16(nonce[:])
	q.SetEdns0(dns.MinMsgSize, false)
	q.IsEdns0().SetVersion(1)
	wire, err := q.Pack()
	if err != nil {
		return false, err
	}
	select {
	case <-fp.probeSeen:
	default:
	}
	fp.probe.Store(&wire)
	defer fp.probe.Store(nil)

	conn, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(fp.local))
	if err != nil {
		return false, fmt.Errorf("probe %s: %w", fp.local, err)
	}
	defer conn.Close()
	answered := make(chan error, 1)
	go func() {
		_ = conn.SetReadDeadline(time.Now().Add(probeWait))
		buf := make([]byte, dns.MinMsgSize)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				answered <- err
				return
			}
			if n >= 2 && binary.BigEndian.Uint16(buf) == q.Id {
				answered <- nil
				return
			}
		}
	}()
	if _, err := conn.Write(wire); err != nil {
		return false, fmt.Errorf("probe %s: %w", fp.local, err)
	}
	timer := time.NewTimer(probeWait)
	defer timer.Stop()
	select {
	case <-fp.probeSeen:
		return true, nil
	case err := <-answered:
		if err != nil {
			return false, fmt.Errorf("probe %s: no answer: %w", fp.local, err)
		}
		return false, nil
	case <-timer.C:
		return false, fmt.Errorf("probe %s: no answer within %v", fp.local, probeWait)
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

// fastReader is one goroutine's buffers: the datagrams of a batch, their senders, and the replies.
type fastReader struct {
	fp *fastPath

	hdrs  [fastBatch]unix.Mmsghdr
	iovs  [fastBatch]unix.Iovec
	names [fastBatch]unix.RawSockaddrInet6
	in    [fastBatch][fastReadSize]byte

	out     [fastBatch]unix.Mmsghdr
	outIovs [fastBatch]unix.Iovec
	nOut    int
	arena   []byte

	wq  wireQuery
	key [keyLen]byte

	// The state of the current recvmmsg and sendmmsg calls, and the calls bound once, so that a batch
	// allocates nothing.
	recvNow, sendNow     bool
	recvN, sendN, sent   int
	recvErrno, sendErrno syscall.Errno
	recvFn, sendFn       func(fd uintptr) bool
	recvOnce, sendOnce   func(fd uintptr)
}

func newFastReader(fp *fastPath) *fastReader {
	r := &fastReader{fp: fp, arena: make([]byte, 0, fastArena)}
	r.recvFn, r.sendFn = r.recv, r.send
	r.recvOnce = func(fd uintptr) { r.recv(fd) }
	r.sendOnce = func(fd uintptr) { r.send(fd) }
	for i := range r.hdrs {
		r.iovs[i].Base = &r.in[i][0]
		r.iovs[i].SetLen(fastReadSize)
		r.hdrs[i].Hdr.Iov = &r.iovs[i]
		r.hdrs[i].Hdr.SetIovlen(1)
		r.hdrs[i].Hdr.Name = (*byte)(unsafe.Pointer(&r.names[i]))
	}
	return r
}

func (r *fastReader) run() {
	for {
		n, err := r.read(false)
		if err != nil {
			if !r.fp.stopping.Load() {
				// Closing the socket takes it out of the group, so no query waits where nobody reads.
				log.Errorf("fast path on %s: reading: %v; closing it, the plugin chain's socket answers instead", r.fp.srv.Addr, err)
				r.fp.conn.Close()
				return
			}
			// Stopping: whatever is queued is answered without waiting for more.
			for {
				n, err := r.read(true)
				if err != nil || n == 0 {
					return
				}
				r.handle(n)
			}
		}
		r.handle(n)
	}
}

// read fills the batch with what the socket holds, waiting for one datagram at least unless now is set.
func (r *fastReader) read(now bool) (int, error) {
	for i := range r.hdrs {
		r.hdrs[i].Hdr.Namelen = unix.SizeofSockaddrInet6
		r.hdrs[i].Hdr.Flags = 0
		r.hdrs[i].Len = 0
	}
	r.recvNow, r.recvN, r.recvErrno = now, 0, 0
	var err error
	if now {
		// A read deadline has passed; Control runs the call regardless.
		err = r.fp.raw.Control(r.recvOnce)
	} else {
		err = r.fp.raw.Read(r.recvFn)
	}
	switch {
	case err != nil:
		return 0, err
	case r.recvErrno == unix.EAGAIN, r.recvErrno == unix.EINTR:
		return 0, nil
	case r.recvErrno != 0:
		return 0, os.NewSyscallError("recvmmsg", r.recvErrno)
	}
	return r.recvN, nil
}

// recv is the recvmmsg call of read, as syscall.RawConn.Read takes it: false asks to wait for the socket.
//
// recv and send make their calls raw: they never block (MSG_DONTWAIT), and a call through unix.Syscall6
// tells the Go scheduler it entered the kernel, which wakes the runtime's monitor thread (sysmon) whenever
// the process was idle. A cache answering a few thousand queries a second is idle between most of them,
// and each such wake-up costs it two context switches and the monitor's 20 µs ticks while it works.
func (r *fastReader) recv(fd uintptr) bool {
	n, _, e := unix.RawSyscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&r.hdrs[0])), fastBatch, unix.MSG_DONTWAIT, 0, 0)
	if e == unix.EAGAIN && !r.recvNow {
		return false
	}
	r.recvN, r.recvErrno = int(n), e
	return true
}

// handle answers the hits of a batch of n datagrams, passes the rest on, and sends the replies.
func (r *fastReader) handle(n int) {
	fp := r.fp
	fp.queries.Add(float64(n))
	passed := 0
	now := time.Now()
	for i := range n {
		h := &r.hdrs[i]
		b := r.in[i][:h.Len]
		if p := fp.probe.Load(); p != nil && bytes.Equal(b, *p) {
			select {
			case fp.probeSeen <- struct{}{}:
			default:
			}
			continue
		}
		plain := false
		if h.Hdr.Flags&unix.MSG_TRUNC == 0 {
			var answered bool
			if answered, plain = r.answer(b, i, now); answered {
				continue
			}
		}
		passed++
		from := sockaddrUDP(&r.names[i], h.Hdr.Namelen)
		if from == nil {
			continue
		}
		q := passedQuery{b: bytes.Clone(b), from: from}
		if plain && fp.servers != nil {
			fp.servers.serve(q)
		} else {
			fp.chain.passQuery(q)
		}
	}
	if passed > 0 {
		fp.passed.Add(float64(passed))
	}
	r.flush()
}

// answer writes the reply to datagram i from its block's store, if it holds one, and reports whether it did,
// and whether parseWireQuery read it (a plain query).
func (r *fastReader) answer(b []byte, i int, now time.Time) (answered, plain bool) {
	n, ok := parseWireQuery(b, &r.wq, &r.key)
	if !ok {
		return false, false
	}
	block := r.fp.routes.route(unsafe.String(&r.key[0], n-5))
	if block == nil {
		return false, true
	}
	wc := block.wc
	e := wc.store.get(wc.store.hash(r.key[:n]), r.key[:n])
	if e == nil {
		return false, true
	}
	need := len(e.plain.wire) + optLen
	if cap(r.arena)-len(r.arena) < need {
		r.flush()
	}
	buf := r.arena[len(r.arena):cap(r.arena)]
	q := &r.wq.q
	out, ok := e.render(buf, q, client{v6: r.fp.v6}, now)
	if !ok {
		// Expired (the chain refreshes it, or serves it stale), or a reply that needs truncation.
		return false, true
	}
	m := block.metrics
	m.hits.Inc()
	if m.core != nil {
		m.core.count(&hit{
			zone: e.metricsZone, v6: r.fp.v6, do: q.do(), qtype: q.qtype, rcode: e.rcode,
			reqSize: len(b), respSize: e.chainLen, start: now,
		})
	}
	r.arena = r.arena[:len(r.arena)+len(out)]
	o := &r.out[r.nOut]
	r.outIovs[r.nOut].Base = &out[0]
	r.outIovs[r.nOut].SetLen(len(out))
	o.Hdr = unix.Msghdr{Name: r.hdrs[i].Hdr.Name, Namelen: r.hdrs[i].Hdr.Namelen, Iov: &r.outIovs[r.nOut]}
	o.Hdr.SetIovlen(1)
	r.nOut++
	return true, true
}

// flush sends the replies of the batch.
func (r *fastReader) flush() {
	stopping := r.fp.stopping.Load()
	for r.sent = 0; r.sent < r.nOut; {
		r.sendErrno, r.sendN, r.sendNow = 0, 0, stopping
		var err error
		if stopping {
			err = r.fp.raw.Control(r.sendOnce)
		} else {
			err = r.fp.raw.Write(r.sendFn)
		}
		if err == nil && r.sendErrno == unix.EINTR {
			continue
		}
		if err != nil || r.sendErrno != 0 {
			// The first reply left failed (a firewall, an unreachable client): it is dropped, as a
			// failed write of CoreDNS's listener drops it, and the rest go on.
			r.writeFailed(errors.Join(err, errnoErr(r.sendErrno)))
			r.sendN = 1
		}
		r.sent += r.sendN
	}
	r.nOut = 0
	r.arena = r.arena[:0]
}

// send is the sendmmsg call of flush, as syscall.RawConn.Write takes it: false asks to wait for the socket.
func (r *fastReader) send(fd uintptr) bool {
	n, _, e := unix.RawSyscall6(unix.SYS_SENDMMSG, fd, uintptr(unsafe.Pointer(&r.out[r.sent])), uintptr(r.nOut-r.sent), unix.MSG_DONTWAIT, 0, 0)
	if e == unix.EAGAIN && !r.sendNow {
		return false
	}
	r.sendN, r.sendErrno = int(n), e
	return true
}

func errnoErr(e syscall.Errno) error {
	if e == 0 {
		return nil
	}
	return os.NewSyscallError("sendmmsg", e)
}

func (r *fastReader) writeFailed(err error) {
	now := time.Now().UnixNano()
	last := r.fp.lastWriteError.Load()
	if now-last < int64(writeErrorEvery) || !r.fp.lastWriteError.CompareAndSwap(last, now) {
		return
	}
	log.Errorf("fast path on %s: a reply was not sent: %v", r.fp.srv.Addr, err)
}

// passedQuery is a datagram the fast path leaves to CoreDNS's server.
type passedQuery struct {
	b    []byte
	from *net.UDPAddr
}

// chainConn is the connection the fast path's miekg/dns server reads the queries it passes on from, and
// writes their replies to (through the fast path's socket).
type chainConn struct {
	fp        *fastPath
	queue     chan passedQuery
	closed    chan struct{}
	closeOnce sync.Once
	deadline  atomic.Int64 // read deadline, Unix nanoseconds; 0 for none
	// earlier wakes a ReadFrom waiting for a deadline that was moved earlier (miekg/dns's Shutdown moves
	// it into the past to stop its reader).
	earlier chan struct{}
}

// passQuery queues q for CoreDNS's server.
func (c *chainConn) passQuery(q passedQuery) {
	select {
	case c.queue <- q:
	case <-c.closed:
	}
}

// sockaddrUDP converts a sender's address as recvmmsg wrote it.
func sockaddrUDP(name *unix.RawSockaddrInet6, namelen uint32) *net.UDPAddr {
	switch {
	case name.Family == unix.AF_INET && namelen >= unix.SizeofSockaddrInet4:
		sa := (*unix.RawSockaddrInet4)(unsafe.Pointer(name))
		port := (*[2]byte)(unsafe.Pointer(&sa.Port))
		return net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), binary.BigEndian.Uint16(port[:])))
	case name.Family == unix.AF_INET6 && namelen >= unix.SizeofSockaddrInet6:
		port := (*[2]byte)(unsafe.Pointer(&name.Port))
		addr := netip.AddrFrom16(name.Addr)
		if name.Scope_id != 0 {
			addr = addr.WithZone(strconv.FormatUint(uint64(name.Scope_id), 10))
		}
		return net.UDPAddrFromAddrPort(netip.AddrPortFrom(addr, binary.BigEndian.Uint16(port[:])))
	}
	return nil
}

// ReadFrom implements net.PacketConn: the next query passed on, cut to p as a socket would cut it.
func (c *chainConn) ReadFrom(p []byte) (int, net.Addr, error) {
	for {
		select {
		case q := <-c.queue:
			return copy(p, q.b), q.from, nil
		default:
		}
		var expired <-chan time.Time
		var timer *time.Timer
		if d := c.deadline.Load(); d != 0 {
			wait := time.Until(time.Unix(0, d))
			if wait <= 0 {
				return 0, nil, os.ErrDeadlineExceeded
			}
			timer = time.NewTimer(wait)
			expired = timer.C
		}
		select {
		case q := <-c.queue:
			stopTimer(timer)
			return copy(p, q.b), q.from, nil
		case <-expired:
			return 0, nil, os.ErrDeadlineExceeded
		case <-c.closed:
			stopTimer(timer)
			return 0, nil, net.ErrClosed
		case <-c.earlier:
			stopTimer(timer)
		}
	}
}

func stopTimer(t *time.Timer) {
	if t != nil {
		t.Stop()
	}
}

// WriteTo implements net.PacketConn.
func (c *chainConn) WriteTo(p []byte, addr net.Addr) (int, error) { return c.fp.conn.WriteTo(p, addr) }

// Close implements net.PacketConn; the socket itself is the fast path's to close.
func (c *chainConn) Close() error {
	c.closeOnce.Do(func() { close(c.closed) })
	return nil
}

// LocalAddr implements net.PacketConn.
func (c *chainConn) LocalAddr() net.Addr { return c.fp.conn.LocalAddr() }

// SetDeadline implements net.PacketConn.
func (c *chainConn) SetDeadline(t time.Time) error { return c.SetReadDeadline(t) }

// SetReadDeadline implements net.PacketConn.
func (c *chainConn) SetReadDeadline(t time.Time) error {
	if t.IsZero() {
		c.deadline.Store(0)
		return nil
	}
	if old := c.deadline.Swap(t.UnixNano()); old == 0 || t.UnixNano() < old {
		select {
		case c.earlier <- struct{}{}:
		default:
		}
	}
	return nil
}

// SetWriteDeadline implements net.PacketConn. Writes go to the socket, which does not block on them.
func (c *chainConn) SetWriteDeadline(time.Time) error { return nil }
