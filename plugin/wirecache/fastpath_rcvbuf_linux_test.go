//go:build linux

package wirecache

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nodelocaldns/nodelocaldns/internal/privtest"
	"github.com/nodelocaldns/nodelocaldns/nodelocal"
)

// TestFastPathRecvBuffer: the fast path's socket and CoreDNS's on the address get the largest rcvbuf of the
// blocks the fast path answers for, past net.core.rmem_max (SO_RCVBUFFORCE, as root).
func TestFastPathRecvBuffer(t *testing.T) {
	privtest.RequirePrivileged(t)
	const size = 6 << 20 // beyond the usual rmem_max, so that only SO_RCVBUFFORCE gives it
	port := freePort(t)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	corefile := strings.Replace(fmt.Sprintf(fastPathCorefile, port), "    bufsize 1232\n    wirecache\n",
		fmt.Sprintf("    bufsize 1232\n    wirecache {\n        rcvbuf %d\n    }\n", 2*size), 1) // a block the fast path does not answer for
	corefile = strings.Replace(corefile, "    bind 127.0.0.1\n    wirecache\n", fmt.Sprintf("    bind 127.0.0.1\n    wirecache {\n        rcvbuf %d\n    }\n", size), 1)
	startCoreDNS(t, corefile)
	waitFastPathSteered(t, "dns://"+addr, addr)

	group, err := nodelocal.UDPGroup(netip.MustParseAddrPort(addr))
	if err != nil {
		t.Fatal(err)
	}
	var bufs []int
	for _, s := range group {
		if s.FD < 0 {
			continue
		}
		n, err := unix.GetsockoptInt(s.FD, unix.SOL_SOCKET, unix.SO_RCVBUF)
		if err != nil {
			t.Fatal(err)
		}
		bufs = append(bufs, n)
	}
	slices.Sort(bufs)
	bufs = slices.Compact(bufs)
	def, err := unix.GetsockoptInt(mustUDPSocket(t), unix.SOL_SOCKET, unix.SO_RCVBUF)
	if err != nil {
		t.Fatal(err)
	}
	// The kernel reports twice what was set: its own bookkeeping is counted in.
	if !slices.Equal(bufs, []int{2 * size}) || def == 2*size {
		t.Errorf("receive buffers of the address's sockets %v (the default is %d), want CoreDNS's and the fast path's at %d", bufs, def, 2*size)
	}
}

// mustUDPSocket returns a new UDP socket, closed at the end of the test.
func mustUDPSocket(t *testing.T) int {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}
