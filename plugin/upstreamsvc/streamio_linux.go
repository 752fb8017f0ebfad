//go:build linux

package upstreamsvc

import (
	"io"
	"net"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// rawStream reads and writes a pipelined connection with raw read and write calls, waiting in Go's
// network poller as net.Conn does. A call the Go scheduler is told of (net.Conn's) wakes the runtime's
// monitor thread whenever the process was idle, which a cache that is idle between most misses pays twice
// per miss; these calls never block, so they need not tell it. One goroutine reads while another writes,
// so each direction has its own call state.
type rawStream struct {
	rc            syscall.RawConn
	reads, writes rawCall
}

// rawCall is one direction's current call: its buffer and outcome, and the call bound once, so that a
// call allocates nothing.
type rawCall struct {
	trap  uintptr
	p     []byte
	n     int
	errno syscall.Errno
	fn    func(fd uintptr) bool
}

func newStreamIO(c net.Conn) (streamIO, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return c, nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil, err
	}
	s := &rawStream{rc: rc, reads: rawCall{trap: unix.SYS_READ}, writes: rawCall{trap: unix.SYS_WRITE}}
	s.reads.fn = s.reads.call
	s.writes.fn = s.writes.call
	return s, nil
}

// call makes the read or write without blocking; false asks the poller to wait for the socket.
func (c *rawCall) call(fd uintptr) bool {
	n, _, e := unix.RawSyscall(c.trap, fd, uintptr(unsafe.Pointer(&c.p[0])), uintptr(len(c.p)))
	if e == unix.EAGAIN {
		return false
	}
	c.n, c.errno = int(n), e
	return true
}

func (s *rawStream) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	c := &s.reads
	for {
		c.p, c.n, c.errno = p, 0, 0
		if err := s.rc.Read(c.fn); err != nil {
			return 0, err
		}
		switch {
		case c.errno == unix.EINTR:
			continue
		case c.errno != 0:
			return 0, c.errno
		case c.n == 0:
			return 0, io.EOF
		}
		return c.n, nil
	}
}

func (s *rawStream) Write(b []byte) (int, error) {
	c := &s.writes
	written := 0
	for written < len(b) {
		c.p, c.n, c.errno = b[written:], 0, 0
		if err := s.rc.Write(c.fn); err != nil {
			return written, err
		}
		switch {
		case c.errno == unix.EINTR:
			continue
		case c.errno != 0:
			return written, c.errno
		}
		written += c.n
	}
	return written, nil
}
