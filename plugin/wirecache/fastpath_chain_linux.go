//go:build linux

package wirecache

import (
	"encoding/binary"
	"net"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The connection through which the fast path hands CoreDNS's server the queries it does not answer.

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
	// passed wakes a ReadFrom when the deadline is set to a time that has passed (miekg/dns's Shutdown
	// moves it into the past to stop its reader).
	passed chan struct{}
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

// ReadFrom implements net.PacketConn: the next query passed on, cut to p as a socket would cut it. It fails
// with os.ErrDeadlineExceeded once the read deadline has passed, but sets no timer for one ahead: miekg/dns's
// server sets a deadline 2 s ahead before every read only to look again whether it was shut down, which its
// Shutdown tells by moving the deadline into the past, and a timer for each would wake an idle cache every
// 2 s to learn nothing.
func (c *chainConn) ReadFrom(p []byte) (int, net.Addr, error) {
	for {
		select {
		case q := <-c.queue:
			return copy(p, q.b), q.from, nil
		default:
		}
		if d := c.deadline.Load(); d != 0 && time.Now().UnixNano() >= d {
			return 0, nil, os.ErrDeadlineExceeded
		}
		select {
		case q := <-c.queue:
			return copy(p, q.b), q.from, nil
		case <-c.closed:
			return 0, nil, net.ErrClosed
		case <-c.passed:
		}
	}
}

// WriteTo implements net.PacketConn.
func (c *chainConn) WriteTo(p []byte, addr net.Addr) (int, error) { return c.fp.sendTo(p, addr) }

// Close implements net.PacketConn; the socket itself is the fast path's to close.
func (c *chainConn) Close() error {
	c.closeOnce.Do(func() { close(c.closed) })
	return nil
}

// LocalAddr implements net.PacketConn.
func (c *chainConn) LocalAddr() net.Addr { return c.fp.conn.LocalAddr() }

// SetDeadline implements net.PacketConn.
func (c *chainConn) SetDeadline(t time.Time) error { return c.SetReadDeadline(t) }

// SetReadDeadline implements net.PacketConn; a deadline that has passed wakes a waiting ReadFrom.
func (c *chainConn) SetReadDeadline(t time.Time) error {
	if t.IsZero() {
		c.deadline.Store(0)
		return nil
	}
	c.deadline.Store(t.UnixNano())
	if !t.After(time.Now()) {
		select {
		case c.passed <- struct{}{}:
		default:
		}
	}
	return nil
}

// SetWriteDeadline implements net.PacketConn. Writes go to the socket, which does not block on them.
func (c *chainConn) SetWriteDeadline(time.Time) error { return nil }
