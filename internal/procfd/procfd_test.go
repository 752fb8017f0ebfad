package procfd

import (
	"net"
	"os"
	"slices"
	"syscall"
	"testing"
)

// TestSockets finds a socket this process opens among its sockets, and not a file it opens.
func TestSockets(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	raw, err := ln.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var sock int
	if err := raw.Control(func(fd uintptr) { sock = int(fd) }); err != nil {
		t.Fatal(err)
	}
	fds, err := Sockets()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(fds, sock) {
		t.Errorf("Sockets() = %v, without the listener's descriptor %d", fds, sock)
	}
	if slices.Contains(fds, int(f.Fd())) {
		t.Errorf("Sockets() = %v, with %s's descriptor %d", fds, os.DevNull, f.Fd())
	}
}
