//go:build linux

// The fast path's TCP listener steers its group with a program, which an MPTCP listener refuses; node-cache
// listens with plain TCP (cmd/node-cache/tcpwrite.go), and so do these tests.
//
//go:debug multipathtcp=0

package wirecache

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"reflect"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/nodelocaldns/nodelocaldns/nodelocal"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

const tcpFrontCorefile = `.:%d {
    bind 127.0.0.1
    wirecache {
        tcp_connections 8 3
    }
    template IN A {
        answer "{{ .Name }} 60 IN A 192.0.2.3"
    }
}
`

// waitTCPSteered waits until the new TCP connections of server come to its fast path's listener. The
// deadline only bounds a failure.
func waitTCPSteered(t *testing.T, server string) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); gaugeValue(t, tcpSteered, server) != 1; {
		if time.Now().After(deadline) {
			t.Fatalf("the TCP connections of %s were not steered to the fast path within a minute", server)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitTCPConnections waits until the fast path of server holds n connections.
func waitTCPConnections(t *testing.T, server string, n float64) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); gaugeValue(t, tcpConnections, server) != n; {
		if time.Now().After(deadline) {
			t.Fatalf("%s holds %v TCP connections, not %v, after a minute", server, gaugeValue(t, tcpConnections, server), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// startSteeredTCPFront starts CoreDNS with tcpFrontCorefile on a free port of 127.0.0.1 and returns the
// port, the address and the server's name once its UDP and TCP groups are steered to the fast path.
func startSteeredTCPFront(t *testing.T) (port int, addr, server string) {
	t.Helper()
	port = freePort(t)
	addr = fmt.Sprintf("127.0.0.1:%d", port)
	server = "dns://" + addr
	startCoreDNS(t, fmt.Sprintf(tcpFrontCorefile, port))
	waitFastPathSteered(t, server, addr)
	waitTCPSteered(t, server)
	return port, addr, server
}

// tcpClient is a connection to the cache from one client address.
type tcpClient struct {
	conn *dns.Conn
}

// dialFrom connects to addr from the loopback address from.
func dialFrom(t *testing.T, from, addr string) *tcpClient {
	t.Helper()
	c, err := tryDialFrom(t, from, addr)
	if err != nil {
		t.Fatalf("connect from %s: %v", from, err)
	}
	return c
}

// tryDialFrom connects to addr from the loopback address from, or says why it could not.
func tryDialFrom(t *testing.T, from, addr string) (*tcpClient, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { c.Close() })
	return &tcpClient{conn: &dns.Conn{Conn: c}}, nil
}

// ask sends an A query for name and returns the answer, or the error reading it.
func (c *tcpClient) ask(name string) (*dns.Msg, error) {
	_ = c.conn.SetDeadline(time.Now().Add(10 * time.Second))
	q := newQuery(name, dns.TypeA, 0, false)
	if err := c.conn.WriteMsg(q); err != nil {
		return nil, err
	}
	return c.conn.ReadMsg()
}

// TestTCPFrontBoundsConnections fills the per-client and the total bound of the fast path's TCP listener:
// a connection beyond either is reset at once, the connections it holds keep being answered, other clients
// are answered while one is at its bound, and a connection that closes makes room.
func TestTCPFrontBoundsConnections(t *testing.T) {
	_, addr, server := startSteeredTCPFront(t)
	refusedClients, refusedAll := counterValue2(t, server, refusedClient), counterValue2(t, server, refusedTotal)

	held := map[string][]*tcpClient{}
	open := func(from string) *tcpClient {
		t.Helper()
		c := dialFrom(t, from, addr)
		if r, err := c.ask("held.example.net."); err != nil || len(r.Answer) != 1 {
			t.Fatalf("a connection from %s within the bounds: %v %v", from, r, err)
		}
		held[from] = append(held[from], c)
		return c
	}
	refused := func(from, reason string, before float64) {
		t.Helper()
		// The reset may come before the dial returns.
		if c, err := tryDialFrom(t, from, addr); err == nil {
			if r, err := c.ask("refused.example.net."); err == nil {
				t.Fatalf("a connection from %s beyond the bound was answered: %v", from, r)
			}
		} else if !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("connect from %s: %v", from, err)
		}
		if got := counterValue2(t, server, reason); got != before+1 {
			t.Errorf("tcp_refused_total{reason=%q} went from %v to %v, want one more", reason, before, got)
		}
	}

	for range 3 {
		open("127.0.0.1")
	}
	waitTCPConnections(t, server, 3)
	refused("127.0.0.1", refusedClient, refusedClients)
	open("127.0.0.2")
	for _, c := range held["127.0.0.1"] {
		if r, err := c.ask("again.example.net."); err != nil || len(r.Answer) != 1 {
			t.Fatalf("a held connection asked again: %v %v", r, err)
		}
	}

	// A connection that closes gives its room back, once the server has seen it close.
	held["127.0.0.1"][0].conn.Close()
	waitTCPConnections(t, server, 3)
	open("127.0.0.1")

	for range 3 {
		open("127.0.0.3")
	}
	open("127.0.0.4")
	waitTCPConnections(t, server, 8)
	refused("127.0.0.5", refusedTotal, refusedAll)
	if got := counterValue2(t, server, refusedClient); got != refusedClients+1 {
		t.Errorf("tcp_refused_total{reason=client} %v, want %v", got, refusedClients+1)
	}
}

// counterValue2 returns coredns_wirecache_tcp_refused_total for server and reason.
func counterValue2(t *testing.T, server, reason string) float64 {
	t.Helper()
	m, err := tcpRefused.GetMetricWithLabelValues(server, reason)
	if err != nil {
		t.Fatal(err)
	}
	return value(m)
}

// TestTCPFrontStopLeavesTheGroup stops an instance: the fast path's listener leaves the TCP group, leaving
// CoreDNS's, which answers.
func TestTCPFrontStopLeavesTheGroup(t *testing.T) {
	port := freePort(t)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	server := "dns://" + addr
	useDirectives(t)
	inst, err := caddy.Start(caddy.CaddyfileInput{Contents: fmt.Appendf(nil, tcpFrontCorefile, port), ServerTypeName: "dns"})
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Stop()
	waitFastPathSteered(t, server, addr)
	waitTCPSteered(t, server)
	local := netip.MustParseAddrPort(addr)
	if n := ownListeners(t, local); n != 2 {
		t.Fatalf("%d TCP listeners on %s, want CoreDNS's and the fast path's", n, addr)
	}
	inst.ShutdownCallbacks()
	if n := ownListeners(t, local); n != 1 {
		t.Fatalf("%d TCP listeners on %s after the fast path stopped, want CoreDNS's alone", n, addr)
	}
	if got := gaugeValue(t, tcpSteered, server); got != 0 {
		t.Errorf("tcp_steered %v after the stop", got)
	}
	for range 8 {
		if r, err := dialFrom(t, "127.0.0.1", addr).ask("after.example.net."); err != nil || len(r.Answer) != 1 {
			t.Fatalf("after the stop: %v %v", r, err)
		}
	}
}

// ownListeners returns how many TCP listeners this process has on local.
func ownListeners(t *testing.T, local netip.AddrPort) int {
	t.Helper()
	group, err := nodelocal.TCPGroup(local)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, s := range group {
		if s.FD >= 0 {
			n++
		}
	}
	return n
}

// TestTCPServerIsCoreDNSs requires the miekg/dns server of the fast path's TCP listener to have every
// setting of the one CoreDNS serves its TCP listener with.
func TestTCPServerIsCoreDNSs(t *testing.T) {
	maxQueries := 17
	cfg := &dnsserver.Config{Zone: ".", ListenHosts: []string{"127.0.0.1"}, Port: "0", Transport: "dns",
		TsigSecret:  map[string]string{optionTSIGKey: optionTSIGSecret},
		ReadTimeout: 7 * time.Second, WriteTimeout: 11 * time.Second, IdleTimeout: 13 * time.Second, MaxTCPQueries: &maxQueries}
	srv, err := dnsserver.NewServer("dns://127.0.0.1:0", []*dnsserver.Config{cfg})
	if err != nil {
		t.Fatal(err)
	}
	if srv.ReadTimeout != cfg.ReadTimeout || srv.IdleTimeout != cfg.IdleTimeout || srv.MaxTCPQueries != maxQueries {
		t.Fatalf("the server does not take the block's timeouts: %v %v %v", srv.ReadTimeout, srv.IdleTimeout, srv.MaxTCPQueries)
	}
	theirsL, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(theirsL) }()
	defer srv.Stop()
	// A block without plugins: the server answers REFUSED, so a reply says its miekg/dns server is serving.
	if _, err := dialFrom(t, "127.0.0.1", theirsL.Addr().String()).ask("example.org."); err != nil {
		t.Fatalf("CoreDNS's server did not answer: %v", err)
	}
	theirs := coreDNSServer(t, srv, 0)

	oursL, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ours := tcpServer(srv, oursL, dns.HandlerFunc(func(dns.ResponseWriter, *dns.Msg) {}))
	if err := activate(ours); err != nil {
		t.Fatal(err)
	}
	defer ours.Shutdown()
	sameServerSettings(t, ours, theirs, "Listener")
}

// coreDNSServer returns the miekg/dns server CoreDNS's srv serves TCP (index 0) or UDP (1) with, read
// holding the server's lock, under which ServePacket and Serve set it.
func coreDNSServer(t *testing.T, srv *dnsserver.Server, index int) *dns.Server {
	t.Helper()
	servers := reflect.ValueOf(srv).Elem().FieldByName("server")
	if !servers.IsValid() || servers.Kind() != reflect.Array || servers.Len() != 2 {
		t.Fatalf("this CoreDNS version's server does not keep its miekg/dns servers where the test reads them")
	}
	lock := reflect.ValueOf(srv).Elem().FieldByName("m")
	if !lock.IsValid() || lock.Type() != reflect.TypeFor[sync.Mutex]() {
		t.Fatalf("this CoreDNS version's server does not guard its miekg/dns servers with the lock the test takes")
	}
	mu := (*sync.Mutex)(lock.Addr().UnsafePointer())
	mu.Lock()
	defer mu.Unlock()
	return (*dns.Server)(servers.Index(index).UnsafePointer())
}

// sameServerSettings requires ours to have every exported setting of theirs, but the connection field
// (PacketConn or Listener), the handler and NotifyStartedFunc. A function is the same when it is the same
// function, or, for IdleTimeout, returns the same. It holds theirs's lock, under which ActivateAndServe
// filled in its defaults (ours are ordered by NotifyStartedFunc, which runs after).
func sameServerSettings(t *testing.T, ours, theirs *dns.Server, conn string) {
	t.Helper()
	theirsLock := reflect.ValueOf(theirs).Elem().FieldByName("lock")
	if !theirsLock.IsValid() || theirsLock.Type() != reflect.TypeFor[sync.RWMutex]() {
		t.Fatalf("this miekg/dns version's server does not guard its settings with the lock the test takes")
	}
	rw := (*sync.RWMutex)(theirsLock.Addr().UnsafePointer())
	rw.RLock()
	defer rw.RUnlock()

	ignored := map[string]bool{conn: true, "Handler": true, "NotifyStartedFunc": true}
	o, c := reflect.ValueOf(ours).Elem(), reflect.ValueOf(theirs).Elem()
	for i := range o.NumField() {
		f := o.Type().Field(i)
		if !f.IsExported() || ignored[f.Name] {
			continue
		}
		a, b := o.Field(i), c.Field(i)
		var same bool
		switch {
		case f.Type == reflect.TypeFor[func() time.Duration]() && !a.IsNil() && !b.IsNil():
			same = a.Interface().(func() time.Duration)() == b.Interface().(func() time.Duration)()
		case f.Type.Kind() == reflect.Func:
			same = a.Pointer() == b.Pointer()
		default:
			same = reflect.DeepEqual(a.Interface(), b.Interface())
		}
		if !same {
			t.Errorf("dns.Server.%s: %v for the fast path's, %v for CoreDNS's", f.Name, a, b)
		}
	}
}

// TestTCPFrontKeepAliveOnlyWhereAProbeCouldGoOut: with CoreDNS's default timeouts the front's connections get
// no TCP keep-alive (every wait on the client ends before a first probe); with an idle timeout as long as
// Go's keep-alive idle time they get it, as CoreDNS's own listener gives it.
func TestTCPFrontKeepAliveOnlyWhereAProbeCouldGoOut(t *testing.T) {
	for _, tc := range []struct {
		name string
		idle time.Duration // 0: CoreDNS's default
		want int
	}{
		{"CoreDNS's timeouts", 0, 0},
		{"idle as long as keep-alive's", goKeepAliveIdle, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := &dnsserver.Config{Zone: ".", ListenHosts: []string{"127.0.0.1"}, Port: "0", Transport: "dns", IdleTimeout: tc.idle}
			srv, err := dnsserver.NewServer("dns://127.0.0.1:0", []*dnsserver.Config{cfg})
			if err != nil {
				t.Fatal(err)
			}
			l, err := listenTCP(srv, netip.MustParseAddrPort("127.0.0.1:0"))
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			c, err := net.Dial("tcp", l.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			accepted, err := l.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer accepted.Close()
			raw, err := accepted.(syscall.Conn).SyscallConn()
			if err != nil {
				t.Fatal(err)
			}
			var keepAlive, reusePort int
			var kerr, rerr error
			if err := raw.Control(func(fd uintptr) {
				keepAlive, kerr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_KEEPALIVE)
				reusePort, rerr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT)
			}); err != nil || kerr != nil || rerr != nil {
				t.Fatal(err, kerr, rerr)
			}
			if keepAlive != tc.want {
				t.Errorf("SO_KEEPALIVE %d on an accepted connection, want %d (idle timeout %v)", keepAlive, tc.want, srv.IdleTimeout)
			}
			if reusePort != 1 {
				t.Errorf("SO_REUSEPORT %d on an accepted connection: the listener did not join a reuseport group", reusePort)
			}
		})
	}
}
