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
	socks, err := Sockets()
	if err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(sock, &st); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(socks, Socket{FD: sock, Inode: st.Ino}) {
		t.Errorf("Sockets() = %v, without the listener's descriptor %d and inode %d", socks, sock, st.Ino)
	}
	if slices.ContainsFunc(socks, func(s Socket) bool { return s.FD == int(f.Fd()) }) {
		t.Errorf("Sockets() = %v, with %s's descriptor %d", socks, os.DevNull, f.Fd())
	}
}
