//go:build linux

package wirecache

import (
	"net"
	"os"
	"strconv"
	"syscall"
	"unsafe"

	"github.com/nodelocaldns/nodelocaldns/plugin/internal/packbuf"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// The replies to the queries the fast path passes on, written to the fast path's socket as its own replies
// are: raw.

// useSocket makes conn the fast path's socket: the one its readers read and every reply is written to.
func (fp *fastPath) useSocket(conn *net.UDPConn) error {
	raw, err := conn.SyscallConn()
	if err != nil {
		return err
	}
	var family int
	var famErr error
	if err := raw.Control(func(fd uintptr) {
		fp.fd = int(fd)
		family, famErr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_DOMAIN)
	}); err != nil {
		return err
	}
	if famErr != nil {
		return os.NewSyscallError("getsockopt SO_DOMAIN", famErr)
	}
	fp.conn, fp.raw, fp.family = conn, raw, family
	return nil
}

// sendTo writes the datagram b to to through the fast path's socket, as net.UDPConn.WriteTo does, but with
// the call made raw, as the readers make theirs (fastReader.recv says why): a write through the scheduler
// wakes the runtime's monitor thread whenever the process was idle, and every reply of CoreDNS's server
// (each miss) would. It waits, as WriteTo does, while the socket's send buffer is full.
func (fp *fastPath) sendTo(b []byte, to net.Addr) (int, error) {
	s := fp.takeSend()
	n, err := fp.sendWith(s, b, to)
	fp.sends.Put(s)
	return n, err
}

// sendMsg packs m and writes it to to as sendTo writes bytes. It packs into a buffer kept with sendTo's state
// between calls: the send copies the reply into the kernel, so the buffer is free again once it returns.
func (fp *fastPath) sendMsg(m *dns.Msg, to net.Addr) error {
	s := fp.takeSend()
	b, err := s.pack.Pack(m)
	if err == nil {
		_, err = fp.sendWith(s, b, to)
	}
	fp.sends.Put(s)
	return err
}

// takeSend returns a rawSend of fp.sends, or a new one.
func (fp *fastPath) takeSend() *rawSend {
	if s, _ := fp.sends.Get().(*rawSend); s != nil {
		return s
	}
	return newRawSend()
}

// sendWith is sendTo with the state s.
func (fp *fastPath) sendWith(s *rawSend, b []byte, to net.Addr) (int, error) {
	opError := func(err error) error {
		return &net.OpError{Op: "write", Net: "udp", Source: fp.conn.LocalAddr(), Addr: to, Err: err}
	}
	ua, ok := to.(*net.UDPAddr)
	if !ok || ua == nil {
		return 0, opError(syscall.EINVAL)
	}
	salen, err := rawSockaddr(fp.family, ua, &s.sa)
	if err == nil {
		s.b, s.salen = b, salen
		err = fp.raw.Write(s.call)
	}
	n, errno := s.n, s.errno
	*s = rawSend{call: s.call, pack: s.pack} // a new one's state: no reply held, no address left over for the next
	if err == nil && errno != 0 {
		err = os.NewSyscallError("sendto", errno)
	}
	if err != nil {
		return 0, opError(err)
	}
	return n, nil
}

// rawSend is the state of one sendTo call, with the call bound to it once, kept in fastPath.sends between
// calls, so that a reply allocates nothing: a closure over the call's variables took them to the heap with
// it, three objects for each reply (6 % of the objects a miss allocated).
type rawSend struct {
	// pack is where sendMsg packs a reply; it stays with the rawSend.
	pack  packbuf.Buffer
	b     []byte
	sa    unix.RawSockaddrInet6
	salen uint32
	n     int
	errno syscall.Errno
	call  func(fd uintptr) bool // send
}

func newRawSend() *rawSend {
	s := &rawSend{}
	s.call = s.send
	return s
}

// send is the sendto call of sendTo, as syscall.RawConn.Write takes it: false asks to wait for room.
func (s *rawSend) send(fd uintptr) bool {
	for {
		r, _, e := unix.RawSyscall6(unix.SYS_SENDTO, fd, uintptr(unsafe.Pointer(unsafe.SliceData(s.b))), uintptr(len(s.b)),
			unix.MSG_DONTWAIT, uintptr(unsafe.Pointer(&s.sa)), uintptr(s.salen))
		switch e {
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false
		}
		s.n, s.errno = int(r), e
		return true
	}
}

// rawSockaddr writes to into sa as a socket of family takes a destination, and returns its length: IPv4
// addresses as IPv4-mapped ones on an IPv6 socket, as the kernel reports their senders there.
func rawSockaddr(family int, to *net.UDPAddr, sa *unix.RawSockaddrInet6) (uint32, error) {
	if to.Port < 0 || to.Port > 0xffff {
		return 0, syscall.EINVAL
	}
	switch family {
	case unix.AF_INET:
		ip := to.IP.To4()
		if ip == nil {
			return 0, syscall.EAFNOSUPPORT
		}
		sa4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		sa4.Family = unix.AF_INET
		putPort(&sa4.Port, to.Port)
		copy(sa4.Addr[:], ip)
		return unix.SizeofSockaddrInet4, nil
	case unix.AF_INET6:
		ip := to.IP.To16()
		if ip == nil {
			return 0, syscall.EINVAL
		}
		sa.Family = unix.AF_INET6
		putPort(&sa.Port, to.Port)
		copy(sa.Addr[:], ip)
		sa.Scope_id = zoneIndex(to.Zone)
		return unix.SizeofSockaddrInet6, nil
	}
	return 0, syscall.EAFNOSUPPORT
}

// putPort stores port in a sockaddr's port field, in network byte order.
func putPort(field *uint16, port int) {
	b := (*[2]byte)(unsafe.Pointer(field))
	b[0], b[1] = byte(port>>8), byte(port)
}

// zoneIndex is the interface index an IPv6 zone names: a number, as sockaddrUDP writes it, or an interface's
// name; 0 for none or a name no interface has, as package net takes it.
func zoneIndex(zone string) uint32 {
	if zone == "" {
		return 0
	}
	if i, err := strconv.ParseUint(zone, 10, 32); err == nil {
		return uint32(i)
	}
	if ifi, err := net.InterfaceByName(zone); err == nil {
		return uint32(ifi.Index)
	}
	return 0
}
