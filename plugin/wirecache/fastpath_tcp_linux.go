//go:build linux

package wirecache

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/coredns/coredns/core/dnsserver"
	"github.com/nodelocaldns/nodelocaldns/nodelocal"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// tcpFront is the fast path's TCP listener: a listener of its own in the TCP reuseport group of the address,
// which keepSteered points the group at as it points the UDP group at the fast path's socket. It accepts no
// more connections than the instance's limits admit (limitedListener), and serves each through a miekg/dns
// server set up as CoreDNS sets up its own TCP server (tcpServer), with CoreDNS's handler: every query
// goes through the server's checks and the plugin chain, wirecache's TCP hits included, exactly as on
// CoreDNS's own listener. While the group is not steered to it (at the start, during a hand-over, where
// steering failed) CoreDNS's listener accepts connections as before, without the bound.
type tcpFront struct {
	srv   *dnsserver.Server
	local netip.AddrPort
	ln    *net.TCPListener
	fd    int
	inner *dns.Server

	// probe is the query a probe sends, recognized by the handler; probeSeen tells the probe it arrived.
	probe     atomic.Pointer[dns.Msg]
	probeSeen chan struct{}
}

// tcpListenerOptions are the TCP options a listener's connections inherit, which the front copies from a
// listener of CoreDNS's in the group: node-cache sets TCP_USER_TIMEOUT and TCP_DEFER_ACCEPT on every TCP
// listener when an instance starts, before the front exists.
var tcpListenerOptions = []struct {
	name string
	opt  int
}{{"TCP_USER_TIMEOUT", unix.TCP_USER_TIMEOUT}, {"TCP_DEFER_ACCEPT", unix.TCP_DEFER_ACCEPT}}

// startTCPFront opens the front's listener in the group of local and starts serving it.
func startTCPFront(srv *dnsserver.Server, local netip.AddrPort, limits *connLimits, turns *hitTurns) (*tcpFront, error) {
	l, err := listenTCP(srv, local)
	if err != nil {
		return nil, fmt.Errorf("join the TCP reuseport group of %s: %w", local, err)
	}
	ln, ok := l.(*net.TCPListener)
	if !ok {
		l.Close()
		return nil, fmt.Errorf("CoreDNS's server accepts TCP through %T, which the fast path cannot accept as", l)
	}
	f := &tcpFront{srv: srv, local: local, ln: ln, probeSeen: make(chan struct{}, 1)}
	if err := f.control(func(fd int) error {
		f.fd = fd
		if proto, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PROTOCOL); err != nil || proto != unix.IPPROTO_TCP {
			return errors.New("CoreDNS's TCP listeners are MPTCP, whose reuseport group takes no program (GODEBUG multipathtcp=0 makes them plain TCP, as node-cache does)")
		}
		return f.copyListenerOptions()
	}); err != nil {
		ln.Close()
		return nil, err
	}
	limited := &limitedListener{Listener: ln, limits: limits, refusals: newRefusals(RefusedHold, MaxHeldRefusals, turns), turns: turns,
		open: tcpConnections.WithLabelValues(srv.Addr), refused: tcpRefused.MustCurryWith(map[string]string{"server": srv.Addr})}
	f.inner = tcpServer(srv, limited, dns.HandlerFunc(f.serveDNS))
	if err := activate(f.inner); err != nil {
		ln.Close()
		return nil, fmt.Errorf("start the TCP server: %w", err)
	}
	return f, nil
}

// goKeepAliveIdle is how long a connection a Go listener accepts may stay idle before its first TCP
// keep-alive probe: Go turns keep-alive on for every connection it accepts, unless the listener asks for none.
const goKeepAliveIdle = 15 * time.Second

// listenTCP opens the front's listener in the TCP reuseport group of local: as CoreDNS's server opens its own
// (Server.Listen: SO_REUSEPORT, the same network and address), so that it joins that listener's group. When
// srv's timeouts close every connection that waits on its client before a first keep-alive probe could go
// out (CoreDNS's defaults: 3 s for the first query, 10 s between queries), the connections it accepts get
// no keep-alive, which would only cost four system calls each, made through Go's scheduler (on an idle
// cache the first of them wakes Go's monitor thread): a client that vanishes is the read timeout's.
func listenTCP(srv *dnsserver.Server, local netip.AddrPort) (net.Listener, error) {
	if max(srv.ReadTimeout, srv.IdleTimeout) >= goKeepAliveIdle {
		return srv.Listen()
	}
	lc := net.ListenConfig{KeepAlive: -1, Control: func(_, _ string, c syscall.RawConn) error {
		var err error
		if cerr := c.Control(func(fd uintptr) {
			err = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
		}); cerr != nil {
			return cerr
		}
		if err != nil {
			return fmt.Errorf("setting SO_REUSEPORT: %w", err)
		}
		return nil
	}}
	return lc.Listen(context.Background(), "tcp", local.String())
}

// control runs fn with the listener's descriptor.
func (f *tcpFront) control(fn func(fd int) error) error {
	raw, err := f.ln.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := raw.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return err
	}
	return ferr
}

// copyListenerOptions gives the front's listener the tcpListenerOptions of another listener of this process
// in its group.
func (f *tcpFront) copyListenerOptions() error {
	group, err := nodelocal.TCPGroup(f.local)
	if err != nil {
		return fmt.Errorf("reading the TCP listeners bound to %s: %w", f.local, err)
	}
	for _, s := range group {
		if s.FD < 0 || s.FD == f.fd {
			continue
		}
		for _, o := range tcpListenerOptions {
			v, err := unix.GetsockoptInt(s.FD, unix.IPPROTO_TCP, o.opt)
			if err != nil || v == 0 {
				continue // CoreDNS's listener has none, or is gone
			}
			if err := unix.SetsockoptInt(f.fd, unix.IPPROTO_TCP, o.opt, v); err != nil {
				return fmt.Errorf("setting %s %d on the TCP listener: %w", o.name, v, err)
			}
		}
		return nil
	}
	return nil
}

// tcpServer returns CoreDNS's own TCP server for srv (dnsserver.Server.Serve) on l, with handler h: the same
// settings. The option that would set another (opcodes, through MsgAcceptFunc) keeps the address in the
// chain (serverOptionReasons); TestTCPServerIsCoreDNSs compares the two.
func tcpServer(srv *dnsserver.Server, l net.Listener, h dns.Handler) *dns.Server {
	return &dns.Server{Listener: l, Net: "tcp", TsigSecret: srv.TsigSecret,
		MaxTCPQueries: srv.MaxTCPQueries, ReadTimeout: srv.ReadTimeout, WriteTimeout: srv.WriteTimeout,
		IdleTimeout: func() time.Duration { return srv.IdleTimeout },
		Handler:     h,
	}
}

// serveDNS hands a query to CoreDNS's server, as CoreDNS's TCP server does; a probe is only noted.
func (f *tcpFront) serveDNS(w dns.ResponseWriter, r *dns.Msg) {
	if p := f.probe.Load(); p != nil && r.Id == p.Id && len(r.Question) == 1 && r.Question[0].Name == p.Question[0].Name {
		select {
		case f.probeSeen <- struct{}{}:
		default:
		}
		_ = w.Close()
		return
	}
	ctx := context.WithValue(context.Background(), dnsserver.Key{}, f.srv)
	ctx = context.WithValue(ctx, dnsserver.LoopKey{}, 0)
	f.srv.ServeDNS(ctx, w, r)
}

// groupSocket returns the front as keepSteered steers it.
func (f *tcpFront) groupSocket() *groupSocket {
	return &groupSocket{
		network: "TCP", what: "TCP connections", fd: f.fd,
		group:   func() ([]nodelocal.ReuseportSocket, error) { return nodelocal.TCPGroup(f.local) },
		steerTo: func(index uint32) error { return nodelocal.SteerTCPGroup(f.local, index) },
		unsteer: func() error { return nodelocal.UnsteerTCPGroup(f.local) },
		probe:   f.probeOnce,
		gauge:   tcpSteered.WithLabelValues(f.srv.Addr),
	}
}

// probeOnce connects to the address, sends a probe query and reports whether the connection landed on the
// front's listener. A connection another listener accepts gets the server's BADVERS answer (probeQuery).
func (f *tcpFront) probeOnce(ctx context.Context) (landed bool, err error) {
	q, _, err := probeQuery()
	if err != nil {
		return false, err
	}
	select {
	case <-f.probeSeen:
	default:
	}
	f.probe.Store(q)
	defer f.probe.Store(nil)

	d := net.Dialer{Timeout: probeWait}
	c, err := d.DialContext(ctx, "tcp", f.local.String())
	if err != nil {
		return false, fmt.Errorf("probe %s over TCP: %w", f.local, err)
	}
	defer c.Close()
	conn := &dns.Conn{Conn: c}
	_ = conn.SetDeadline(time.Now().Add(probeWait))
	if err := conn.WriteMsg(q); err != nil {
		return false, fmt.Errorf("probe %s over TCP: %w", f.local, err)
	}
	return awaitProbe(ctx, f.probeSeen, probeAnswer(conn, q.Id), "probe "+f.local.String()+" over TCP")
}

// queued returns how many connections wait in the front's accept queue.
func (f *tcpFront) queued() (uint64, error) {
	group, err := nodelocal.TCPGroup(f.local)
	if err != nil {
		return 0, err
	}
	for _, s := range group {
		if s.FD == f.fd {
			return s.Queued, nil
		}
	}
	return 0, nil
}

// stop stops serving: the group is already steered away from the front (fastPath.stop). It accepts what
// waits in its queue, then lets the server close the listener (limitedListener.Close, which resets the
// refusals held too) and wait for the connections it serves.
func (f *tcpFront) stop(ctx context.Context) {
	for deadline := time.Now().Add(passDrainWait); time.Now().Before(deadline); {
		if n, err := f.queued(); err != nil || n == 0 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if err := f.inner.ShutdownContext(ctx); err != nil {
		log.Warningf("fast path on %s: stopping the TCP server: %v", f.srv.Addr, err)
	}
}
