//go:build linux

package wirecache

import (
	"fmt"
	"io"
	"net"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// A client that sends its query a byte at a time (slow loris) wakes a server that reads as bytes come once
// for every byte: the goroutine reading the connection is readied, reads one byte and waits again, hundreds
// of times a second for a few hundred such connections, and every other client's answers share the CPUs
// with those wake-ups (issue 27). The fast path's TCP server reads its connections through wholeReadConn
// instead: before it waits for more of a message, it sets the socket's receive low-water mark (SO_RCVLOWAT)
// to the bytes it still needs, so the kernel wakes it once they are all there (or the client closes, or the
// read deadline passes), however many segments they come in. A client that sends its query in one segment,
// as resolvers do, is read without waiting and costs nothing more; waiting for a connection's next length
// prefix leaves the mark at the kernel's default of one byte.

// wholeReadConn is a TCP connection whose reads wait in the kernel until the bytes asked for have come. It
// relies on its reader asking for exactly the bytes a message still needs, as miekg/dns's TCP server does
// (the length prefix through binary.Read, the message through io.ReadFull): a reader asking for more than
// the client sends would wait for its read deadline.
type wholeReadConn struct {
	net.Conn
	raw   syscall.RawConn
	lowat int // the socket's receive low-water mark as last set; 1, the kernel's default, at the start
}

// readsWhole returns c read through a wholeReadConn when it is a TCP connection, c itself otherwise.
func readsWhole(c net.Conn) net.Conn {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return c
	}
	return &wholeReadConn{Conn: c, raw: raw, lowat: 1}
}

// lowWaterFor is the receive low-water mark a read of want bytes waits with: all of them, but for a length
// prefix (two bytes at most), which waits for the first byte as the kernel's default mark does, so that a
// connection waiting for its next query makes no system call to set it.
func lowWaterFor(want int) int {
	if want <= 2 {
		return 1
	}
	return want
}

// Read implements net.Conn: it returns what the socket holds, or waits until len(p) bytes have come (the
// client closed, or the read deadline passed).
func (c *wholeReadConn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	var n int
	var rerr error
	err := c.raw.Read(func(fd uintptr) bool {
		for {
			n, rerr = unix.Read(int(fd), p)
			if rerr != unix.EINTR {
				break
			}
		}
		if rerr != unix.EAGAIN {
			return true
		}
		if mark := lowWaterFor(len(p)); mark != c.lowat {
			if err := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVLOWAT, mark); err != nil {
				// Waiting with the mark above what is needed could wait past the last byte: fail the read.
				rerr = fmt.Errorf("setting the receive low-water mark to %d: %w", mark, err)
				return true
			}
			c.lowat = mark
		}
		return false
	})
	switch {
	case err != nil: // the deadline passed, or the connection was closed
		return 0, c.opError(err)
	case rerr != nil:
		if errno, ok := rerr.(unix.Errno); ok {
			rerr = os.NewSyscallError("read", errno)
		}
		return 0, c.opError(rerr)
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// opError wraps err as the net package wraps a read's errors.
func (c *wholeReadConn) opError(err error) error {
	return &net.OpError{Op: "read", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
}
