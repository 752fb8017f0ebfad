//go:build linux

package wirecache

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/procfd"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// loopbackPair returns the two ends of a TCP connection on loopback, the accepted one read through
// readsWhole.
func loopbackPair(t *testing.T) (client net.Conn, server *wholeReadConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	accepted, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { accepted.Close() })
	server, ok := readsWhole(accepted).(*wholeReadConn)
	if !ok {
		t.Fatalf("readsWhole(%T) did not read through a wholeReadConn", accepted)
	}
	return client, server
}

// socketLowWater reads the receive low-water mark of the socket with descriptor fd.
func socketLowWater(t *testing.T, fd int) int {
	t.Helper()
	v, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVLOWAT)
	if errors.Is(err, unix.EBADF) {
		t.Fatal("the server closed the connection (its read timeout) before a read waited with the low-water mark set")
	}
	if err != nil {
		t.Fatalf("reading SO_RCVLOWAT: %v", err)
	}
	return v
}

// waitLowWater waits until the socket with descriptor fd has the receive low-water mark want: a reader sets
// it once it waits. The deadline only bounds a failure.
func waitLowWater(t *testing.T, fd, want int, what string) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); socketLowWater(t, fd) != want; {
		if time.Now().After(deadline) {
			t.Fatalf("%s: the socket's receive low-water mark is %d, not %d, a minute on", what, socketLowWater(t, fd), want)
		}
		time.Sleep(time.Millisecond)
	}
}

// rawFD returns the descriptor of c's socket.
func rawFD(t *testing.T, c *wholeReadConn) int {
	t.Helper()
	fd := -1
	if err := c.raw.Control(func(f uintptr) { fd = int(f) }); err != nil {
		t.Fatal(err)
	}
	return fd
}

// TestWholeReadConn reads framed messages as miekg/dns's TCP server does, sent in pieces: a read waits with
// the low-water mark at the bytes it still needs, the last byte alone still completes the message, a wait
// for the next length prefix has the kernel's default mark again, and a close, a deadline and an empty read
// come back as from a net.Conn.
func TestWholeReadConn(t *testing.T) {
	client, server := loopbackPair(t)
	fd := rawFD(t, server)
	msg := []byte("0123456789abcdefghij") // 20 bytes
	framed := binary.BigEndian.AppendUint16(nil, uint16(len(msg)))
	framed = append(framed, msg...)

	type read struct {
		got []byte
		err error
	}
	readFramed := func() <-chan read {
		done := make(chan read, 1)
		go func() {
			var length uint16
			if err := binary.Read(server, binary.BigEndian, &length); err != nil {
				done <- read{err: err}
				return
			}
			m := make([]byte, length)
			_, err := io.ReadFull(server, m)
			done <- read{m, err}
		}()
		return done
	}

	for round := range 2 {
		done := readFramed()
		// The prefix and three bytes: the reader waits for the other 17 with the mark at 17.
		if _, err := client.Write(framed[:5]); err != nil {
			t.Fatal(err)
		}
		waitLowWater(t, fd, len(framed)-5, fmt.Sprintf("round %d, after 5 of %d bytes", round+1, len(framed)))
		// All but the last byte, then the last byte alone.
		if _, err := client.Write(framed[5 : len(framed)-1]); err != nil {
			t.Fatal(err)
		}
		if _, err := client.Write(framed[len(framed)-1:]); err != nil {
			t.Fatal(err)
		}
		if r := <-done; r.err != nil || string(r.got) != string(msg) {
			t.Fatalf("round %d: read %q, %v; want %q", round+1, r.got, r.err, msg)
		}
		// Waiting for the next length prefix, the mark is the kernel's default again.
		done = readFramed()
		waitLowWater(t, fd, 1, fmt.Sprintf("round %d, waiting for the next message", round+1))
		if round == 0 {
			if _, err := client.Write(framed); err != nil {
				t.Fatal(err)
			}
			if r := <-done; r.err != nil || string(r.got) != string(msg) {
				t.Fatalf("the message in one piece: read %q, %v; want %q", r.got, r.err, msg)
			}
			continue
		}
		// A deadline passes: a timeout, as net.Conn's.
		if err := server.SetReadDeadline(time.Now()); err != nil {
			t.Fatal(err)
		}
		var ne net.Error
		if r := <-done; !errors.As(r.err, &ne) || !ne.Timeout() || !errors.Is(r.err, os.ErrDeadlineExceeded) {
			t.Fatalf("a read past its deadline: %v, want a timeout", r.err)
		}
	}
	if n, err := server.Read(nil); n != 0 || err != nil {
		t.Errorf("an empty read: %d, %v", n, err)
	}
	if err := server.SetReadDeadline(time.Time{}); err != nil {
		t.Fatal(err)
	}
	// The client closes while the reader waits for a whole message: end of file.
	done := readFramed()
	if _, err := client.Write(framed[:4]); err != nil {
		t.Fatal(err)
	}
	waitLowWater(t, fd, len(framed)-4, "a message the client leaves unfinished")
	client.Close()
	if r := <-done; !errors.Is(r.err, io.ErrUnexpectedEOF) {
		t.Errorf("a read the client closed the connection under: %v, want an unexpected end of file", r.err)
	}
	if _, err := server.Read(make([]byte, 2)); err != io.EOF {
		t.Errorf("a read after the client closed: %v, want io.EOF", err)
	}
}

// TestTCPFrontWaitsForWholeQueries sends a query to the fast path's TCP listener a few bytes at a time: the
// server's socket waits for the rest of the query with the low-water mark at the bytes still to come (so
// the kernel does not wake it for each), the query's last byte alone completes it, and the answer comes.
func TestTCPFrontWaitsForWholeQueries(t *testing.T) {
	port, addr, _ := startSteeredTCPFront(t)

	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Minute))
	query, err := newQuery("trickled.example.net.", dns.TypeA, 0, false).Pack()
	if err != nil {
		t.Fatal(err)
	}
	framed := binary.BigEndian.AppendUint16(nil, uint16(len(query)))
	framed = append(framed, query...)
	if _, err := c.Write(framed[:6]); err != nil {
		t.Fatal(err)
	}
	fd := acceptedSocket(t, c.LocalAddr().(*net.TCPAddr), port)
	waitLowWater(t, fd, len(framed)-6, "the server's end of a query sent in pieces")
	if _, err := c.Write(framed[6 : len(framed)-1]); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(framed[len(framed)-1:]); err != nil {
		t.Fatal(err)
	}
	r, err := (&dns.Conn{Conn: c}).ReadMsg()
	if err != nil || len(r.Answer) != 1 {
		t.Fatalf("the answer to a query sent in pieces: %v, %v", r, err)
	}
}

// acceptedSocket returns the descriptor, in this process, of the server's end of the connection from client
// to the local port port, once the server has accepted it. The deadline only bounds a failure.
func acceptedSocket(t *testing.T, client *net.TCPAddr, port int) int {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Millisecond) {
		if fd := findAccepted(t, client, port); fd >= 0 {
			return fd
		}
		if time.Now().After(deadline) {
			t.Fatalf("no socket of this process was the server's end of the connection from %v a minute on", client)
		}
	}
}

// findAccepted returns the descriptor of the server's end of the connection from client to port, -1 when
// this process has none.
func findAccepted(t *testing.T, client *net.TCPAddr, port int) int {
	t.Helper()
	socks, err := procfd.Sockets()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range socks {
		fd := s.FD
		local, err := unix.Getsockname(fd)
		if err != nil {
			continue
		}
		peer, err := unix.Getpeername(fd)
		if err != nil {
			continue
		}
		l, lok := local.(*unix.SockaddrInet4)
		p, pok := peer.(*unix.SockaddrInet4)
		if lok && pok && l.Port == port && p.Port == client.Port && net.IP(p.Addr[:]).Equal(client.IP) {
			return fd
		}
	}
	return -1
}
