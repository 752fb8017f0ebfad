//go:build linux

package main

import (
	"net"
	"slices"
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

func TestParseTCPDeferAccept(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"", defaultTCPDeferAccept, true},
		{"0", 0, true},
		{"1s", time.Second, true},
		{"30s", 30 * time.Second, true},
		{"1500ms", 0, false},
		{"31s", 0, false},
		{"-1s", 0, false},
		{"3", 0, false},
	} {
		got, err := parseTCPDeferAccept(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("parseTCPDeferAccept(%q) = %v, %v; want %v (valid: %v)", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

func TestListenerOptions(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want []listenerOption
		ok   bool
	}{
		{nil, []listenerOption{{"TCP_USER_TIMEOUT", unix.TCP_USER_TIMEOUT, 5000}, {"TCP_DEFER_ACCEPT", unix.TCP_DEFER_ACCEPT, 3}}, true},
		{map[string]string{tcpDeferAcceptEnv: "0"}, []listenerOption{{"TCP_USER_TIMEOUT", unix.TCP_USER_TIMEOUT, 5000}}, true},
		{map[string]string{tcpWriteTimeoutEnv: "0", tcpDeferAcceptEnv: "7s"}, []listenerOption{{"TCP_DEFER_ACCEPT", unix.TCP_DEFER_ACCEPT, 7}}, true},
		{map[string]string{tcpWriteTimeoutEnv: "0", tcpDeferAcceptEnv: "0"}, nil, true},
		{map[string]string{tcpDeferAcceptEnv: "soon"}, nil, false},
		{map[string]string{tcpWriteTimeoutEnv: "soon"}, nil, false},
	} {
		got, err := listenerOptions(func(name string) string { return tc.env[name] })
		if (err == nil) != tc.ok || !slices.Equal(got, tc.want) {
			t.Errorf("listenerOptions(%v) = %v, %v; want %v (valid: %v)", tc.env, got, err, tc.want, tc.ok)
		}
	}
}

// tcpOption reads a TCP option of a socket.
func tcpOption(t *testing.T, c syscall.Conn, opt int) int {
	t.Helper()
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var v int
	var gerr error
	if err := raw.Control(func(fd uintptr) { v, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, opt) }); err != nil {
		t.Fatal(err)
	}
	if gerr != nil {
		t.Fatal(gerr)
	}
	return v
}

// userTimeout reads TCP_USER_TIMEOUT of a socket, in milliseconds.
func userTimeout(t *testing.T, c syscall.Conn) int {
	t.Helper()
	return tcpOption(t, c, unix.TCP_USER_TIMEOUT)
}

// TestSetListenerOptions: the process's TCP listeners, opened as CoreDNS opens its own, get the options,
// and the connections they accept inherit the write bound; a connection this process dialled and a UDP
// socket are left alone.
func TestSetListenerOptions(t *testing.T) {
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
	n, err := setListenerOptions(listenerOption{"TCP_USER_TIMEOUT", unix.TCP_USER_TIMEOUT, 1500},
		listenerOption{"TCP_DEFER_ACCEPT", unix.TCP_DEFER_ACCEPT, 3})
	if err != nil {
		t.Fatal(err)
	}
	if n < 1 {
		t.Fatalf("set on %d listeners, want the test's at least", n)
	}
	if got := userTimeout(t, l.(*net.TCPListener)); got != 1500 {
		t.Errorf("the listener's TCP_USER_TIMEOUT is %d ms, want 1500", got)
	}
	if got := tcpOption(t, l.(*net.TCPListener), unix.TCP_DEFER_ACCEPT); got != 3 {
		t.Errorf("the listener's TCP_DEFER_ACCEPT is %d s, want 3", got)
	}
	dialed, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer dialed.Close()
	if _, err := dialed.Write([]byte{0, 17}); err != nil { // the start of a query: the deferred accept returns
		t.Fatal(err)
	}
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

// TestDeferredAcceptWaitsForData: with the deferral, a listener hands over a connection that has sent its
// first bytes before one that connected earlier and sent nothing, and an accepted connection has its data
// to read at once.
func TestDeferredAcceptWaitsForData(t *testing.T) {
	l, err := reuseport.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	// Longer than any stall of a test machine: the silent connection is not handed over during the test.
	if _, err := setListenerOptions(listenerOption{"TCP_DEFER_ACCEPT", unix.TCP_DEFER_ACCEPT, int(maxTCPDeferAccept.Seconds())}); err != nil {
		t.Fatal(err)
	}
	silent, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	asking, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer asking.Close()
	if _, err := asking.Write([]byte{0, 17}); err != nil {
		t.Fatal(err)
	}
	c, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.RemoteAddr().String() != asking.LocalAddr().String() {
		t.Fatalf("accepted %v first, the connection that sent nothing (%v); want the one that sent (%v)", c.RemoteAddr(), silent.LocalAddr(), asking.LocalAddr())
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 2)); err != nil {
		t.Errorf("reading the accepted connection's first bytes: %v", err)
	}
}
