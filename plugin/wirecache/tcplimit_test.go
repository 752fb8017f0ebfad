package wirecache

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"
)

// TestConnLimits counts connections in and out of the bounds.
func TestConnLimits(t *testing.T) {
	a, b, c := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.3")
	l := newConnLimits(3, 2)
	for _, step := range []struct {
		admit   netip.Addr
		release bool
		want    string
	}{
		{admit: a}, {admit: a}, {admit: a, want: refusedClient},
		{admit: b}, {admit: c, want: refusedTotal}, {admit: b, want: refusedTotal},
		{admit: a, release: true}, {admit: c}, {admit: c, want: refusedTotal},
		{admit: c, release: true}, {admit: b}, {admit: b, want: refusedTotal},
		{admit: a, release: true}, {admit: b, want: refusedClient},
	} {
		if step.release {
			l.release(step.admit)
			continue
		}
		if got := l.admit(step.admit); got != step.want {
			t.Fatalf("admit %s with %d open (%v): %q, want %q", step.admit, l.open, l.clients, got, step.want)
		}
	}
	for _, addr := range []netip.Addr{b, b} {
		l.release(addr)
	}
	if l.open != 0 || len(l.clients) != 0 {
		t.Errorf("after every release: %d open, %v", l.open, l.clients)
	}
}

// TestRefusalsHoldThenReset: a refused connection is held until its hold ends or the listener closes, then
// reset; one beyond the most held is reset at once.
func TestRefusalsHoldThenReset(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	connect := func() (client, server net.Conn) { return connectTo(t, ln) }
	// readErr returns the error a read on c ends with within wait.
	readErr := func(c net.Conn, wait time.Duration) error {
		_ = c.SetReadDeadline(time.Now().Add(wait))
		_, err := c.Read(make([]byte, 1))
		return err
	}

	r := newRefusals(time.Hour, 1, nil)
	heldClient, held := connect()
	r.refuse(held)
	resetClient, over := connect()
	r.refuse(over)
	if err := readErr(resetClient, time.Minute); !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("a refusal beyond the most held: %v, want a reset at once", err)
	}
	if err := readErr(heldClient, 100*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("a held refusal: %v, want it held", err)
	}
	if n := r.heldNow(); n != 1 {
		t.Errorf("%d held, want 1", n)
	}
	r.close()
	if err := readErr(heldClient, time.Minute); !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("a held refusal once the listener closed: %v, want a reset", err)
	}

	short := newRefusals(10*time.Millisecond, 1, nil)
	client, server := connect()
	short.refuse(server)
	if err := readErr(client, time.Minute); !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("a held refusal after its hold: %v, want a reset", err)
	}
	if n := short.heldNow(); n != 0 {
		t.Errorf("%d held after the hold, want 0", n)
	}
}

// heldNow returns how many connections r holds.
func (r *refusals) heldNow() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.held)
}

// connectTo returns the client's side and the server's of a new connection to ln.
func connectTo(t *testing.T, ln net.Listener) (client, server net.Conn) {
	t.Helper()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	if server, err = ln.Accept(); err != nil {
		t.Fatal(err)
	}
	return client, server
}

// TestRefusalsResetPaced: connections whose holds end together are reset resetBatch at a time, in the order
// they were refused, and the next batch waits for the pace.
func TestRefusalsResetPaced(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	r := newRefusals(time.Hour, 3*resetBatch, nil)
	r.pace = time.Hour // the test runs each batch itself
	defer r.close()
	var refused []net.Conn
	for range 2*resetBatch + 3 {
		_, server := connectTo(t, ln)
		r.refuse(server)
		refused = append(refused, server)
	}
	r.mu.Lock()
	for i := range r.held {
		r.held[i].due = time.Now() // every hold ends now
	}
	r.mu.Unlock()
	for _, left := range []int{resetBatch + 3, 3, 0} {
		r.resetDue()
		r.mu.Lock()
		held := len(r.held)
		oldest := net.Conn(nil)
		if held > 0 {
			oldest = r.held[0].c
		}
		r.mu.Unlock()
		if held != left {
			t.Fatalf("%d held after a batch of resets, want %d", held, left)
		}
		if left > 0 && oldest != refused[len(refused)-left] {
			t.Fatalf("the oldest held is not the first refused after those reset")
		}
	}
}
