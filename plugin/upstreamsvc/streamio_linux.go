//go:build linux

package upstreamsvc

import (
	"io"
	"net"
	"syscall"
	"unsafe"

	"github.com/nodelocaldns/nodelocaldns/plugin/internal/rawread"

	"golang.org/x/sys/unix"
)

// rawStream reads and writes a pipelined connection with raw read and write calls, waiting in Go's
// network poller as net.Conn does. A call the Go scheduler is told of (net.Conn's) wakes the runtime's
// monitor thread whenever the process was idle, which a cache that is idle between most misses pays twice
// per miss; these calls never block, so they need not tell it. One goroutine reads while another writes.
type rawStream struct {
	rc syscall.RawConn
	// inq says that each read reports what the socket still holds (TCP_INQ, Linux 4.18).
	inq bool
	// The current write: its bytes and outcome, and the call bound once, so that a write allocates nothing.
	wp     []byte
	wn     int
	werrno syscall.Errno
	write  func(fd uintptr) bool
}

func newStreamIO(c net.Conn) (streamIO, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return connIO{c}, nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil, err
	}
	s := &rawStream{rc: rc}
	s.write = s.writeOnce
	if err := rc.Control(func(fd uintptr) {
		s.inq = unix.SetsockoptInt(int(fd), unix.SOL_TCP, unix.TCP_INQ, 1) == nil
	}); err != nil {
		return nil, err
	}
	return s, nil
}

// readMessages reads the answers with rawread.Serve. A read tells what the socket still holds (TCP_INQ):
// once it holds nothing, not even the upstream's end of the stream (which TCP_INQ counts as a byte), it
// waits without the read that would find the socket empty. Each miss wakes the cache for its answer, so a
// miss at a few thousand a second makes one system call less, of about eleven. Without TCP_INQ it reads
// until the socket is empty.
func (s *rawStream) readMessages(deliver func(msg []byte)) error {
	f := newFrameReader()
	var (
		iov     unix.Iovec
		control [8]uint64 // room for TCP_CM_INQ, aligned as a Cmsghdr
		msg     unix.Msghdr
		failed  error
	)
	msg.Iov = &iov
	msg.SetIovlen(1)
	err := rawread.Serve(s.rc, func(fd uintptr) (rawread.Result, syscall.Errno) {
		room := f.room()
		iov.Base = &room[0]
		iov.SetLen(len(room))
		msg.Control, msg.Controllen = nil, 0
		if s.inq {
			msg.Control = (*byte)(unsafe.Pointer(&control[0]))
			msg.SetControllen(len(control) * 8)
		}
		n, _, e := unix.RawSyscall(unix.SYS_RECVMSG, fd, uintptr(unsafe.Pointer(&msg)), unix.MSG_DONTWAIT)
		switch {
		case e != 0:
			return rawread.Done, e
		case n == 0:
			failed = io.EOF
			return rawread.Done, 0
		}
		f.add(int(n), deliver)
		if held, ok := stillHeld(&msg); ok && held == 0 {
			return rawread.Empty, 0
		}
		return rawread.More, 0
	})
	if err != nil {
		return err
	}
	return failed
}

// stillHeld returns what a read's TCP_CM_INQ control message says the socket still holds, and whether the
// read had one.
func stillHeld(msg *unix.Msghdr) (int, bool) {
	if msg.Control == nil || int(msg.Controllen) < unix.CmsgLen(4) {
		return 0, false
	}
	h := (*unix.Cmsghdr)(unsafe.Pointer(msg.Control))
	if h.Level != unix.SOL_TCP || h.Type != unix.TCP_CM_INQ || int(h.Len) < unix.CmsgLen(4) {
		return 0, false
	}
	return int(*(*int32)(unsafe.Add(unsafe.Pointer(msg.Control), unix.CmsgLen(0)))), true
}

func (s *rawStream) shutdown() {
	_ = s.rc.Control(func(fd uintptr) { _ = unix.Shutdown(int(fd), unix.SHUT_RDWR) })
}

// writeOnce makes the write without blocking; false asks the poller to wait for the socket.
func (s *rawStream) writeOnce(fd uintptr) bool {
	n, _, e := unix.RawSyscall(unix.SYS_WRITE, fd, uintptr(unsafe.Pointer(&s.wp[0])), uintptr(len(s.wp)))
	if e == unix.EAGAIN {
		return false
	}
	s.wn, s.werrno = int(n), e
	return true
}

func (s *rawStream) Write(b []byte) (int, error) {
	written := 0
	for written < len(b) {
		s.wp, s.wn, s.werrno = b[written:], 0, 0
		if err := s.rc.Write(s.write); err != nil {
			return written, err
		}
		switch {
		case s.werrno == unix.EINTR:
			continue
		case s.werrno != 0:
			return written, s.werrno
		}
		written += s.wn
	}
	return written, nil
}
