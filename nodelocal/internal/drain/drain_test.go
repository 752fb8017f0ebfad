//go:build linux

package drain

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func reuseport(network, address string) (net.Listener, net.PacketConn, error) {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1) })
		if err != nil {
			return err
		}
		return serr
	}}
	// Plain TCP, as node-cache listens (an MPTCP listener takes no program, and hides its descriptor).
	lc.SetMultipathTCP(false)
	if network == "udp" {
		pc, err := lc.ListenPacket(context.Background(), network, address)
		return nil, pc, err
	}
	l, err := lc.Listen(context.Background(), network, address)
	return l, nil, err
}

// sendFromManyPorts sends n datagrams to dst, each from a socket of its own (a source port of its own).
func sendFromManyPorts(t *testing.T, dst string, n int) {
	t.Helper()
	for range n {
		c, err := net.Dial("udp", dst)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write([]byte("q")); err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
}

// received counts the datagrams queued on pc.
func received(t *testing.T, pc net.PacketConn) int {
	t.Helper()
	buf := make([]byte, 16)
	n := 0
	for {
		pc.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		if _, _, err := pc.ReadFrom(buf); err != nil {
			return n
		}
		n++
	}
}

func TestSteerUDPToTheNewestSocket(t *testing.T) {
	_, old, err := reuseport("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	addr := old.LocalAddr().String()
	_, next, err := reuseport("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	local := netip.MustParseAddrPort(addr)

	group, err := Group(UDP, local)
	if err != nil || len(group) != 2 {
		t.Fatalf("Group: %v %v, want both sockets", group, err)
	}
	for _, s := range group {
		if s.FD < 0 {
			t.Errorf("socket %d of this process has no FD", s.Inode)
		}
	}

	// Without a program the kernel spreads the datagrams over both.
	sendFromManyPorts(t, addr, 64)
	if o, n := received(t, old), received(t, next); o == 0 || n == 0 || o+n != 64 {
		t.Fatalf("by hash: old got %d, new got %d of 64", o, n)
	}

	// Index 1: the socket that joined last.
	if err := SteerTo(UDP, local, 1); err != nil {
		t.Fatalf("SteerTo: %v", err)
	}
	sendFromManyPorts(t, addr, 64)
	if idle, err := Idle(UDP, []netip.AddrPort{local}); err != nil || idle {
		t.Fatalf("Idle with datagrams queued: %v %v", idle, err)
	}
	if o, n := received(t, old), received(t, next); o != 0 || n != 64 {
		t.Fatalf("steered: old got %d, new got %d of 64", o, n)
	}
	if idle, err := Idle(UDP, []netip.AddrPort{local}); err != nil || !idle {
		t.Fatalf("Idle with nothing queued: %v %v", idle, err)
	}

	// The old socket closes: the program's index is out of range, and the new socket gets everything.
	old.Close()
	sendFromManyPorts(t, addr, 16)
	if n := received(t, next); n != 16 {
		t.Fatalf("after the old socket closed: new got %d of 16", n)
	}
	if err := Unsteer(UDP, local); err != nil {
		t.Fatal(err)
	}
	sendFromManyPorts(t, addr, 16)
	if n := received(t, next); n != 16 {
		t.Fatalf("unsteered: new got %d of 16", n)
	}
}

func TestSteerTCPToTheNewestListener(t *testing.T) {
	for _, host := range []string{"127.0.0.1", "::1"} {
		t.Run(host, func(t *testing.T) { testSteerTCP(t, host) })
	}
}

// testSteerTCP steers the TCP group of two listeners on host: the kernel spreads connections over both by
// hash, a program sends them all to the newest, and Unsteer gives them back to the hash.
func testSteerTCP(t *testing.T, host string) {
	old, _, err := reuseport("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	addr := old.Addr().String()
	next, _, err := reuseport("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	local := netip.MustParseAddrPort(addr)
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	// queued dials n connections and returns how many wait in each listener's accept queue.
	queued := func(n int) (o, x uint64) {
		t.Helper()
		for range n {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			conns = append(conns, c)
		}
		group, err := Group(TCP, local)
		if err != nil || len(group) != 2 {
			t.Fatalf("Group: %v %v, want both listeners", group, err)
		}
		for _, s := range group {
			switch {
			case s.FD < 0:
				t.Fatalf("listener %d of this process has no FD", s.Inode)
			case sameSocket(t, s.FD, old):
				o = s.Queued
			default:
				x = s.Queued
			}
		}
		return o, x
	}

	// Without a program the kernel spreads the connections over both.
	o, n := queued(32)
	if o == 0 || n == 0 || o+n != 32 {
		t.Fatalf("by hash: old got %d, new got %d of 32", o, n)
	}
	// Index 1: the listener that joined last.
	if err := SteerTo(TCP, local, 1); err != nil {
		t.Fatalf("SteerTo: %v", err)
	}
	o2, n2 := queued(32)
	if o2 != o || n2 != n+32 {
		t.Fatalf("steered: old got %d, new got %d of 32", o2-o, n2-n)
	}
	if err := Unsteer(TCP, local); err != nil {
		t.Fatal(err)
	}
	if o3, n3 := queued(32); o3 == o2 || n3 == n2 {
		t.Fatalf("unsteered: old got %d, new got %d of 32", o3-o2, n3-n2)
	}
}

// sameSocket reports whether fd is l's descriptor.
func sameSocket(t *testing.T, fd int, l net.Listener) bool {
	t.Helper()
	raw, err := l.(*net.TCPListener).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var same bool
	if err := raw.Control(func(lfd uintptr) { same = int(lfd) == fd }); err != nil {
		t.Fatal(err)
	}
	return same
}

func TestIdleTCP(t *testing.T) {
	l, _, err := reuseport("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	local := netip.MustParseAddrPort(l.Addr().String())
	if idle, err := Idle(TCP, []netip.AddrPort{local}); err != nil || !idle {
		t.Fatalf("Idle with nothing to accept: %v %v", idle, err)
	}
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if idle, err := Idle(TCP, []netip.AddrPort{local}); err != nil || idle {
		t.Fatalf("Idle with a connection to accept: %v %v", idle, err)
	}
	a, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	a.Close()
	if idle, err := Idle(TCP, []netip.AddrPort{local}); err != nil || !idle {
		t.Fatalf("Idle once accepted: %v %v", idle, err)
	}
}

func TestParseHexAddrPort(t *testing.T) {
	if binary.NativeEndian.Uint16([]byte{1, 0}) != 1 {
		t.Skip("the samples are those of a little-endian kernel")
	}
	// 169.254.20.10:53 and [fd00::a]:53 as a little-endian kernel writes them.
	for in, want := range map[string]string{
		"0A14FEA9:0035":                         "169.254.20.10:53",
		"0100007F:1F90":                         "127.0.0.1:8080",
		"000000FD00000000000000000A000000:0035": "[fd00::a]:53",
	} {
		got, err := parseHexAddrPort(in)
		if err != nil || got.String() != want {
			t.Errorf("parseHexAddrPort(%q) = %v, %v; want %s", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "0A14FEA9", "XYZ:0035", "0A14FE:0035", "0A14FEA9:10000"} {
		if _, err := parseHexAddrPort(bad); err == nil {
			t.Errorf("parseHexAddrPort(%q) succeeded", bad)
		}
	}
}

// TestSteeringSurvivesOlderSocketsLeaving: a group of two older sockets and two newer ones, steered to a
// newer one. A socket leaving hands its index to the group's last socket; steered to the last socket, the
// first older socket to close puts the index out of range and the kernel hashes over the group again, the
// other older socket included (whose queue is lost when it closes in turn); steered to the first newer
// socket, as TakeOver steers, every packet keeps going to it until the older sockets are gone.
func TestSteeringSurvivesOlderSocketsLeaving(t *testing.T) {
	for _, tc := range []struct {
		name      string
		index     uint32
		olderGets bool
	}{
		{name: "to the last socket", index: 3, olderGets: true},
		{name: "to the first newer socket", index: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var socks []net.PacketConn
			addr := "127.0.0.1:0"
			for range 4 {
				_, pc, err := reuseport("udp", addr)
				if err != nil {
					t.Fatal(err)
				}
				defer pc.Close()
				addr = pc.LocalAddr().String()
				socks = append(socks, pc)
			}
			local := netip.MustParseAddrPort(addr)
			if err := SteerTo(UDP, local, tc.index); err != nil {
				t.Fatal(err)
			}
			sendFromManyPorts(t, addr, 32)
			if n := received(t, socks[tc.index]); n != 32 {
				t.Fatalf("steered to socket %d: it got %d of 32", tc.index, n)
			}
			socks[0].Close() // the first older socket leaves
			sendFromManyPorts(t, addr, 64)
			older := received(t, socks[1])
			newer := received(t, socks[2]) + received(t, socks[3])
			if older+newer != 64 || (older > 0) != tc.olderGets {
				t.Errorf("after an older socket left: the other older one got %d, the newer ones %d of 64; want the older one to get some: %v",
					older, newer, tc.olderGets)
			}
		})
	}
}

// A fast path's Prefer and Yield change nothing while a takeover holds the group: the takeover's program
// stays, so new packets keep going to this process's sockets while the older ones drain.
func TestPreferAndYieldLeaveATakeoverAlone(t *testing.T) {
	_, first, err := reuseport("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	addr := first.LocalAddr().String()
	_, second, err := reuseport("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	local := netip.MustParseAddrPort(addr)

	// The takeover steers to the first socket (as if the older process had none left in the group yet).
	if err := SteerTo(UDP, local, 0); err != nil {
		t.Fatal(err)
	}
	takeovers.mu.Lock()
	takeovers.addrs[local] = true
	takeovers.mu.Unlock()
	if err := Prefer(local, 1); !errors.Is(err, ErrTakenOver) {
		t.Errorf("Prefer during a takeover: %v, want ErrTakenOver", err)
	}
	if err := Yield(local); !errors.Is(err, ErrTakenOver) {
		t.Errorf("Yield during a takeover: %v, want ErrTakenOver", err)
	}
	sendFromManyPorts(t, addr, 16)
	if got := received(t, first); got != 16 {
		t.Errorf("the takeover's socket got %d of 16 packets: its program was changed", got)
	}
	if err := EndTakeOver(local); err != nil {
		t.Fatal(err)
	}
	if err := Prefer(local, 1); err != nil {
		t.Fatalf("Prefer after the takeover: %v", err)
	}
	sendFromManyPorts(t, addr, 16)
	if got := received(t, second); got != 16 {
		t.Errorf("the preferred socket got %d of 16 packets", got)
	}
}

// A subscriber to Changes hears a successor queueing and leaving, and nothing when nothing changed.
func TestChangesAnnounceTheSuccessor(t *testing.T) {
	c, stop := Changes()
	defer stop()
	heard := func() bool {
		select {
		case <-c:
			return true
		default:
			return false
		}
	}
	SetSuccessorQueued(true)
	if !heard() || !SuccessorQueued() {
		t.Error("a successor queued: not announced")
	}
	SetSuccessorQueued(true)
	if heard() {
		t.Error("announced again with nothing changed")
	}
	SetSuccessorQueued(false)
	if !heard() || SuccessorQueued() {
		t.Error("the successor left: not announced")
	}
	stop()
	SetSuccessorQueued(true)
	defer SetSuccessorQueued(false)
	if heard() {
		t.Error("announced after the subscription ended")
	}
}

// ownInodes maps each socket's inode, as /proc/net and the fd's link name it, to its descriptor, and
// leaves out what is not a socket.
func TestOwnInodesNamesSockets(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	raw, err := pc.(*net.UDPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	fd := -1
	if err := raw.Control(func(f uintptr) { fd = int(f) }); err != nil {
		t.Fatal(err)
	}
	link, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
	if err != nil {
		t.Fatal(err)
	}
	var ino uint64
	if _, err := fmt.Sscanf(link, "socket:[%d]", &ino); err != nil {
		t.Fatalf("fd %d links to %q: %v", fd, link, err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	var pipe unix.Stat_t
	if err := unix.Fstat(int(r.Fd()), &pipe); err != nil {
		t.Fatal(err)
	}

	own, err := ownInodes()
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := own[ino]; !ok || got != fd {
		t.Errorf("the socket of inode %d: fd %d (found %v), want %d", ino, got, ok, fd)
	}
	if got, ok := own[pipe.Ino]; ok {
		t.Errorf("a pipe's inode %d mapped to fd %d", pipe.Ino, got)
	}
}

// BenchmarkOwnInodes reads this process's sockets with 40 of them open, as a look at a group does.
func BenchmarkOwnInodes(b *testing.B) {
	for range 40 {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		defer pc.Close()
	}
	for b.Loop() {
		if _, err := ownInodes(); err != nil {
			b.Fatal(err)
		}
	}
}
