//go:build linux

package wirecache

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"slices"
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
	// maxFastReaders bounds the goroutines reading one socket: one waits for datagrams, the others help it
	// only while batches come full (fastReader.help).
	maxFastReaders = 4
	// passQueue is how many queries wait for CoreDNS's server before the readers wait for it.
	passQueue = 256

	// steerCheck is how soon after a change the fast path reads again who is in its address's group,
	// besides the changes it hears of (nodelocal.ReuseportChanges); the wait doubles up to steerCheckMax
	// while the group stays as it was. probeWait bounds the wait for one probe.
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

	conn   *net.UDPConn
	raw    syscall.RawConn
	fd     int // conn's, to find it among the group's sockets
	family int // conn's: unix.AF_INET or AF_INET6
	chain  *chainConn
	inner  *dns.Server
	// servers answers the plain queries the fast path passes on; nil when the server has TSIG secrets, whose
	// replies miekg/dns's own writer signs.
	servers *chainServers

	readers  sync.WaitGroup
	stopping atomic.Bool
	// helpWanted wakes a reader that helps (fastReader.help), if one is idle; readersStop ends the idle ones.
	// turns wakes helpers through helpWanted too. helpBeside says that a helper may read beside the reader
	// that waits (GOMAXPROCS above 1), so that a full batch wakes one.
	helpWanted  chan struct{}
	readersStop chan struct{}
	turns       *hitTurns
	helpBeside  bool

	// probe is the query steer sends, recognized by the readers; probeSeen tells steer one arrived.
	probe     atomic.Pointer[[]byte]
	probeSeen chan struct{}
	// tcp is the fast path's TCP listener, nil where it could not start; socks are the sockets keepSteered
	// steers: the UDP socket, and tcp's listener.
	tcp       *tcpFront
	socks     []*groupSocket
	steerStop context.CancelFunc
	steerDone chan struct{}
	// quietCoreDNS takes the read deadline off CoreDNS's own UDP socket of the address (fastPaths.quietReads).
	quietCoreDNS func()

	queries prometheus.Counter
	passed  prometheus.Counter
	steered prometheus.Gauge

	lastWriteError atomic.Int64
	// sends keeps sendTo's state between calls (rawSend).
	sends sync.Pool
}

// startFastPath starts the fast path of srv on its address local, answering the hits of routes' blocks; limits
// bound its TCP connections, turns are the instance's (its hits get one in bursts of the instance's TCP
// work), and quiet takes the read deadline off CoreDNS's own UDP reads (fastPaths.quietReads), called whenever
// the UDP group is found steered to the fast path.
func startFastPath(srv *dnsserver.Server, local netip.AddrPort, routes fastRouting, limits *connLimits, turns *hitTurns, quiet func()) (*fastPath, error) {
	fp := &fastPath{
		srv: srv, local: local, v6: local.Addr().Is6(), routes: routes, quietCoreDNS: quiet,
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
	if err := fp.useSocket(conn); err != nil {
		conn.Close()
		return nil, err
	}
	if size := routes.recvBuffer(); size > 0 {
		if err := setGroupRecvBuffers(local, fp.fd, size); err != nil {
			log.Warningf("fast path on %s: %v; queries that arrive while the process waits for a CPU are dropped sooner", srv.Addr, err)
		}
	}
	fp.chain = &chainConn{fp: fp, queue: make(chan passedQuery, passQueue), closed: make(chan struct{}), passed: make(chan struct{}, 1)}

	fp.inner = chainServer(srv, fp.chain)
	if len(srv.TsigSecret) == 0 {
		fp.servers = newChainServers(fp)
	}
	if err := activate(fp.inner); err != nil {
		fp.conn.Close()
		return nil, fmt.Errorf("start the server for queries the fast path passes on: %w", err)
	}

	fp.helpWanted, fp.readersStop = make(chan struct{}), make(chan struct{})
	fp.readers.Go(newFastReader(fp).run)
	// One helper at least, even with one P: it takes the hits' turns (hitTurns).
	fp.helpBeside = runtime.GOMAXPROCS(0) > 1
	for range max(1, min(runtime.GOMAXPROCS(0), maxFastReaders)-1) {
		fp.readers.Go(newFastReader(fp).help)
	}
	fp.turns = turns
	turns.add(fp.helpWanted)
	fp.socks = []*groupSocket{fp.udpSocket()}
	if fp.tcp, err = startTCPFront(srv, local, limits, turns); err != nil {
		log.Warningf("fast path on %s: %v; CoreDNS's own TCP listener accepts every connection, with no bound", srv.Addr, err)
	} else {
		fp.socks = append(fp.socks, fp.tcp.groupSocket())
	}

	ctx, cancel := context.WithCancel(context.Background())
	fp.steerStop = cancel
	go fp.keepSteered(ctx)
	return fp, nil
}

// activate starts s serving, and returns once it serves, or with the error it stopped on at once.
func activate(s *dns.Server) error {
	started := make(chan struct{})
	s.NotifyStartedFunc = func() { close(started) }
	served := make(chan error, 1)
	go func() { served <- s.ActivateAndServe() }()
	select {
	case <-started:
		return nil
	case err := <-served:
		return err
	}
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
	for _, s := range fp.socks {
		fp.steerAway(s)
	}
	fp.stopping.Store(true)
	// Wakes the reader waiting for a packet, which then empties the socket without waiting, and returns; the
	// helpers return once idle.
	_ = fp.conn.SetReadDeadline(time.Now())
	fp.turns.remove(fp.helpWanted)
	close(fp.readersStop)
	fp.readers.Wait()

	ctx, cancel := context.WithTimeout(context.Background(), shutdownWait)
	defer cancel()
	if fp.servers != nil {
		fp.servers.close()
		if err := fp.servers.wait(ctx); err != nil {
			log.Warningf("fast path on %s: stopping: queries still being answered: %v", fp.srv.Addr, err)
		}
	}
	if fp.tcp != nil {
		fp.tcp.stop(ctx)
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

// steerAway points the group of s at another socket of this process, unless another process is in the
// group, a takeover holds it, or s has left it (an older process hands its TCP listeners over by taking
// them out of their groups).
func (fp *fastPath) steerAway(s *groupSocket) {
	group, err := s.group()
	switch {
	case err != nil:
		log.Warningf("fast path on %s: reading the %s sockets bound to %s: %v", fp.srv.Addr, s.network, fp.local, err)
	case nodelocal.OthersInGroup(group) > 0 || nodelocal.UDPGroupTakenOver(fp.local):
	case !slices.ContainsFunc(group, func(m nodelocal.ReuseportSocket) bool { return m.FD == s.fd }):
	default:
		if err := fp.steer(context.Background(), s, group, false); err != nil {
			log.Warningf("fast path on %s: %v", fp.srv.Addr, err)
		}
	}
}
