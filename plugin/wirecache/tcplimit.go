package wirecache

import (
	"net"
	"net/netip"
	"sync"

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

// limitedListener accepts the connections its limits admit. One they refuse is reset at once, so that the
// client learns of it without waiting (a resolver then tries its next server), and Accept goes on to the
// next.
type limitedListener struct {
	net.Listener
	limits  *connLimits
	open    prometheus.Gauge
	refused *prometheus.CounterVec // by reason
}

// Accept implements net.Listener.
func (l *limitedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		client := remoteAddr(c)
		if why := l.limits.admit(client); why != "" {
			l.refused.WithLabelValues(why).Inc()
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0) // closing sends a reset
			}
			c.Close()
			continue
		}
		l.open.Inc()
		return &limitedConn{Conn: c, release: func() {
			l.limits.release(client)
			l.open.Dec()
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
