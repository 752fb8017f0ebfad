//go:build linux

package wirecache

import (
	"errors"
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/nodelocaldns/nodelocaldns/nodelocal"
)

// recvBuffer is the receive buffer the fast path asks for: the largest RecvBuffer of the blocks it answers
// for, 0 when none asks for one.
func (r *fastRouting) recvBuffer() int64 {
	var size int64
	for _, b := range r.byZone {
		if b != nil {
			size = max(size, b.wc.RecvBuffer)
		}
	}
	return size
}

// setGroupRecvBuffers gives the fast path's socket fd, and this process's other sockets in the reuseport
// group of local (CoreDNS's, which get the address's queries while the group is not steered to the fast
// path: at the start, and while another process's sockets are in the group during a hand-over), a receive
// buffer of size bytes (setRecvBuffer).
func setGroupRecvBuffers(local netip.AddrPort, fd int, size int64) error {
	fds := []int{fd}
	group, err := nodelocal.UDPGroup(local)
	if err != nil {
		return fmt.Errorf("reading the sockets bound to %s: %w", local, err)
	}
	for _, s := range group {
		if s.FD >= 0 && s.FD != fd {
			fds = append(fds, s.FD)
		}
	}
	var errs []error
	for _, fd := range fds {
		if err := setRecvBuffer(fd, size); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// setRecvBuffer gives the socket fd a receive buffer of size bytes: SO_RCVBUFFORCE, which a process with
// CAP_NET_ADMIN (a node cache has it) may set beyond net.core.rmem_max, else SO_RCVBUF, which the kernel
// caps at rmem_max. It reads the buffer back (the kernel reports twice what it was asked for, its own
// bookkeeping included) and returns an error that says why it is smaller than asked, if it is.
func setRecvBuffer(fd int, size int64) error {
	forceErr := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, int(size))
	if forceErr != nil {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, int(size)); err != nil {
			return fmt.Errorf("set SO_RCVBUF to %d: %w", size, err)
		}
	}
	got, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF)
	if err != nil {
		return fmt.Errorf("read SO_RCVBUF: %w", err)
	}
	if int64(got) < 2*size {
		return fmt.Errorf("the kernel gave %d bytes of receive buffer for %d asked (SO_RCVBUFFORCE: %v; "+
			"SO_RCVBUF is capped at net.core.rmem_max)", got/2, size, forceErr)
	}
	return nil
}
