package wirecache

import (
	"net"
	"sync"
	"testing"
	"time"

	"github.com/coredns/coredns/core/dnsserver"

	"github.com/miekg/dns"
)

// deadlineConn is a PacketConn that notes the read deadlines set on it and the reads begun.
type deadlineConn struct {
	net.PacketConn
	reading chan struct{} // holds a value once a read began since the last awaitRead

	mu        sync.Mutex
	deadlines []time.Time
	reads     int
}

func (c *deadlineConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	c.deadlines = append(c.deadlines, t)
	c.mu.Unlock()
	return c.PacketConn.SetReadDeadline(t)
}

func (c *deadlineConn) ReadFrom(b []byte) (int, net.Addr, error) {
	c.mu.Lock()
	c.reads++
	c.mu.Unlock()
	select {
	case c.reading <- struct{}{}:
	default: // one not taken yet says as much
	}
	return c.PacketConn.ReadFrom(b)
}

// state returns the reads begun and the last read deadline set.
func (c *deadlineConn) state() (reads int, last time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reads, c.deadlines[len(c.deadlines)-1]
}

// awaitRead waits until the server begins a read; the wait only bounds a failure.
func (c *deadlineConn) awaitRead(t *testing.T) {
	t.Helper()
	select {
	case <-c.reading:
	case <-time.After(30 * time.Second):
		t.Fatal("CoreDNS's UDP server began no read")
	}
}

// TestServerPacketConnsReadsCoreDNS finds the socket CoreDNS's UDP server reads, in the CoreDNS version this
// module builds with.
func TestServerPacketConnsReadsCoreDNS(t *testing.T) {
	srv, conn := serveCoreDNSUDP(t)
	conns, err := serverPacketConns(srv)
	if err != nil {
		t.Fatal(err)
	}
	if len(conns) != 1 || conns[0] != conn {
		t.Fatalf("found %v, want the one CoreDNS's server reads, %p", conns, conn)
	}
}

// TestQuietReads takes the deadline off the read CoreDNS's UDP server waits in, so that it no longer wakes
// every 2 s; the read still returns what reaches the socket, and the server's stop still ends it. From a
// reload on, nothing is taken off.
func TestQuietReads(t *testing.T) {
	srv, conn := serveCoreDNSUDP(t)
	f := &fastPaths{}
	f.quietReads(srv)
	if _, last := conn.state(); !last.IsZero() {
		t.Fatalf("the read's deadline is still %v", last)
	}
	// miekg/dns's server set a deadline 2 s ahead before that read: past it, the read must still wait.
	time.Sleep(3 * time.Second)
	if reads, _ := conn.state(); reads != 1 {
		t.Fatalf("the server's read returned with nothing to read (%d reads begun)", reads)
	}

	client, err := net.Dial("udp", conn.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	wire, err := newQuery("quiet.example.org.", dns.TypeA, 0, false).Pack()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Write(wire); err != nil {
		t.Fatal(err)
	}
	conn.awaitRead(t)
	if _, last := conn.state(); last.IsZero() {
		t.Fatal("the read after a datagram has no deadline: the server's own was not set")
	}

	f.quietReads(srv)
	if err := f.reload(); err != nil {
		t.Fatal(err)
	}
	// As miekg/dns sets its deadline before each read.
	if err := conn.SetReadDeadline(time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	f.quietReads(srv)
	if _, last := conn.state(); last.IsZero() {
		t.Fatal("the deadline was taken off during a reload")
	}
	if err := f.reloadFailed(); err != nil {
		t.Fatal(err)
	}
	f.quietReads(srv)
	if _, last := conn.state(); !last.IsZero() {
		t.Fatalf("after a failed reload the deadline is still %v", last)
	}

	// The stop ends the read within its grace period (Stop's error says it ran out).
	if err := srv.Stop(); err != nil {
		t.Fatalf("stopping the server: %v", err)
	}
}

// serveCoreDNSUDP starts CoreDNS's UDP server on a socket of 127.0.0.1 read through a deadlineConn, returns
// once the server waits in its first read, and stops it at the test's end.
func serveCoreDNSUDP(t *testing.T) (*dnsserver.Server, *deadlineConn) {
	t.Helper()
	cfg := &dnsserver.Config{Zone: ".", ListenHosts: []string{"127.0.0.1"}, Port: "53"}
	srv, err := dnsserver.NewServer("dns://127.0.0.1:53", []*dnsserver.Config{cfg})
	if err != nil {
		t.Fatal(err)
	}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	conn := &deadlineConn{PacketConn: pc, reading: make(chan struct{}, 1)}
	served := make(chan error, 1)
	go func() { served <- srv.ServePacket(conn) }()
	t.Cleanup(func() {
		_ = srv.Stop()
		<-served
		pc.Close()
	})
	conn.awaitRead(t)
	return srv, conn
}
