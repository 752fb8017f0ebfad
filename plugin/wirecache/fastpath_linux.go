//go:build linux

package wirecache

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/coredns/coredns/core/dnsserver"
	"github.com/nodelocaldns/nodelocaldns/nodelocal"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
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

	// steerCheck is how soon after a change the fast path reads again who is in its address's group,
	// besides the changes it hears of (nodelocal.ReuseportChanges), and checks with a probe that the group
	// still sends packets to it; the wait doubles up to steerCheckMax while the group stays as it was.
	// probeWait bounds the wait for one probe.
	steerCheck    = 10 * time.Second
	steerCheckMax = 5 * time.Minute
	probeWait     = time.Second
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
	// Opened by CoreDNS's server, as it opens its own, so it joins that socket's group. What the server reads
	// through must be the bare socket the fast path reads: a wrapper (proxyproto's) reads the datagrams
	// otherwise.
	pc, err := srv.ListenPacket()
	if err != nil {
		return nil, fmt.Errorf("join the reuseport group of %s: %w", local, err)
	}
	conn, ok := pc.(*net.UDPConn)
	if !ok {
		pc.Close()
		return nil, fmt.Errorf("CoreDNS's server reads its UDP socket through %T, which the fast path cannot read as", pc)
	}
	fp.conn = conn
	if fp.raw, err = fp.conn.SyscallConn(); err != nil {
		fp.conn.Close()
		return nil, err
	}
	if err := fp.raw.Control(func(fd uintptr) { fp.fd = int(fd) }); err != nil {
		fp.conn.Close()
		return nil, err
	}
	if size := routes.recvBuffer(); size > 0 {
		if err := setGroupRecvBuffers(local, fp.fd, size); err != nil {
			log.Warningf("fast path on %s: %v; queries that arrive while the process waits for a CPU are dropped sooner", srv.Addr, err)
		}
	}
	fp.chain = &chainConn{fp: fp, queue: make(chan passedQuery, passQueue), closed: make(chan struct{}), passed: make(chan struct{}, 1)}

	started := make(chan struct{})
	fp.inner = chainServer(srv, fp.chain)
	fp.inner.NotifyStartedFunc = func() { close(started) }
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

// chainServer returns CoreDNS's own UDP server for srv (dnsserver.Server.ServePacket) on pc: the same
// handler, the same settings. The options that would set others (a writer decorator, opcodes) keep the
// address in the chain (serverOptionReasons); TestChainServerIsCoreDNSs compares the two.
func chainServer(srv *dnsserver.Server, pc net.PacketConn) *dns.Server {
	return &dns.Server{PacketConn: pc, Net: "udp", TsigSecret: srv.TsigSecret,
		Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
			ctx := context.WithValue(context.Background(), dnsserver.Key{}, srv)
			ctx = context.WithValue(ctx, dnsserver.LoopKey{}, 0)
			srv.ServeDNS(ctx, w, r)
		}),
	}
}

// stop hands the address back to CoreDNS's socket, answers what the fast path's socket holds and closes it.
func (fp *fastPath) stop() {
	fp.steerStop()
	<-fp.steerDone
	if group, err := nodelocal.UDPGroup(fp.local); err != nil {
		log.Warningf("fast path on %s: reading the sockets bound to %s: %v", fp.srv.Addr, fp.local, err)
	} else if nodelocal.OthersInGroup(group) == 0 && !nodelocal.UDPGroupTakenOver(fp.local) {
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
