//go:build linux

package wirecache

import (
	"errors"
	"net"
	"os"
	"testing"
	"time"
)

func newTestChainConn() *chainConn {
	return &chainConn{queue: make(chan passedQuery, passQueue), closed: make(chan struct{}), passed: make(chan struct{}, 1)}
}

type readResult struct {
	n   int
	err error
}

func readChain(c *chainConn) <-chan readResult {
	done := make(chan readResult, 1)
	go func() {
		n, _, err := c.ReadFrom(make([]byte, 512))
		done <- readResult{n, err}
	}()
	return done
}

// A deadline ahead is not waited for, as a socket would: miekg/dns sets one before every read only to look
// whether it was shut down. A query, a deadline in the past (its Shutdown) or Close end the read.
func TestChainConnReadDeadlines(t *testing.T) {
	c := newTestChainConn()
	if err := c.SetReadDeadline(time.Now().Add(10 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	done := readChain(c)
	select {
	case r := <-done:
		t.Fatalf("ReadFrom returned %d, %v at a deadline ahead", r.n, r.err)
	case <-time.After(300 * time.Millisecond):
	}
	c.passQuery(passedQuery{b: []byte("query"), from: &net.UDPAddr{IP: net.IPv4(10, 244, 0, 2), Port: 40000}})
	if r := <-done; r.err != nil || r.n != len("query") {
		t.Fatalf("ReadFrom = %d, %v, want the query", r.n, r.err)
	}

	if err := c.SetReadDeadline(time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	done = readChain(c)
	if err := c.SetReadDeadline(time.Unix(1, 0)); err != nil { // miekg/dns's Shutdown
		t.Fatal(err)
	}
	if r := <-done; !errors.Is(r.err, os.ErrDeadlineExceeded) {
		t.Fatalf("ReadFrom after a deadline in the past = %d, %v, want os.ErrDeadlineExceeded", r.n, r.err)
	}

	if err := c.SetReadDeadline(time.Time{}); err != nil {
		t.Fatal(err)
	}
	done = readChain(c)
	c.Close()
	if r := <-done; !errors.Is(r.err, net.ErrClosed) {
		t.Fatalf("ReadFrom after Close = %d, %v, want net.ErrClosed", r.n, r.err)
	}
}
