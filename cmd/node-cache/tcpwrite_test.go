//go:build linux

package main

import (
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/coredns/coredns/plugin/pkg/reuseport"
	"golang.org/x/sys/unix"
)

func TestParseTCPWriteTimeout(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"", defaultTCPWriteTimeout, true},
		{"0", 0, true},
		{"10s", 10 * time.Second, true},
		{"1ms", time.Millisecond, true},
		{"-1s", 0, false},
		{"10us", 0, false},
		{"1000h", 0, false},
		{"ten", 0, false},
	} {
		got, err := parseTCPWriteTimeout(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("parseTCPWriteTimeout(%q) = %v, %v; want %v (valid: %v)", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

// userTimeout reads TCP_USER_TIMEOUT of a socket, in milliseconds.
func userTimeout(t *testing.T, c syscall.Conn) int {
	t.Helper()
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var v int
	var gerr error
	if err := raw.Control(func(fd uintptr) { v, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT) }); err != nil {
		t.Fatal(err)
	}
	if gerr != nil {
		t.Fatal(gerr)
	}
	return v
}

// TestSetListenersUserTimeout: the process's TCP listeners, opened as CoreDNS opens its own, get the bound,
// and the connections they accept inherit it; a connection this process dialled and a UDP socket are left
// alone.
func TestSetListenersUserTimeout(t *testing.T) {
	l, err := reuseport.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	n, err := setListenersUserTimeout(1500 * time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if n < 1 {
		t.Fatalf("set on %d listeners, want the test's at least", n)
	}
	if got := userTimeout(t, l.(*net.TCPListener)); got != 1500 {
		t.Errorf("the listener's TCP_USER_TIMEOUT is %d ms, want 1500", got)
	}
	dialed, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer dialed.Close()
	accepted, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer accepted.Close()
	if got := userTimeout(t, accepted.(*net.TCPConn)); got != 1500 {
		t.Errorf("an accepted connection's TCP_USER_TIMEOUT is %d ms, want the listener's 1500", got)
	}
	if got := userTimeout(t, dialed.(*net.TCPConn)); got != 0 {
		t.Errorf("a dialled connection's TCP_USER_TIMEOUT is %d ms, want it left alone", got)
	}
}
