package rawread

import (
	"errors"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

// listenUDP returns a UDP socket on loopback and its raw descriptor.
func listenUDP(t *testing.T) (*net.UDPConn, syscall.RawConn) {
	t.Helper()
	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	rc, err := conn.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	return conn, rc
}

// TestServeWaitsOnEmptyAndEndsOnDone drives Serve over a UDP socket with a read that reports Empty without
// reading, More once, and Done: Serve calls read again at once after More, waits for a datagram after Empty
// (one sent later ends the wait), and returns nil after Done.
func TestServeWaitsOnEmptyAndEndsOnDone(t *testing.T) {
	conn, rc := listenUDP(t)
	results := []Result{Empty, More, Done}
	calls := make(chan int, len(results))
	done := make(chan error, 1)
	go func() {
		i := 0
		done <- Serve(rc, func(uintptr) (Result, syscall.Errno) {
			r := results[i]
			i++
			calls <- i
			return r, 0
		})
	}()
	if got := <-calls; got != 1 {
		t.Fatalf("call %d first", got)
	}
	select {
	case <-calls:
		t.Fatal("Serve read again after Empty without a datagram")
	case <-time.After(50 * time.Millisecond): // a failure shows within this; a pass waits it out
	}
	client, err := net.DialUDP("udp", nil, conn.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	if _, err := client.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	for want := 2; want <= 3; want++ {
		if got := <-calls; got != want {
			t.Fatalf("call %d, want %d", got, want)
		}
	}
	if err := <-done; err != nil {
		t.Fatalf("Serve returned %v after Done", err)
	}
}

// TestServeReturnsWhyWaitingFailed checks that Serve waits after Empty, and after EAGAIN whatever the Result
// with it, calling read no more, until a read deadline ends the wait with its error. (A machine too busy to
// start Serve before the deadline has it return that error before any call.)
func TestServeReturnsWhyWaitingFailed(t *testing.T) {
	conn, rc := listenUDP(t)
	for _, tc := range []struct {
		res Result
		e   syscall.Errno
	}{{Empty, 0}, {More, syscall.EAGAIN}} {
		if err := conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		calls := 0
		err := Serve(rc, func(uintptr) (Result, syscall.Errno) {
			calls++
			return tc.res, tc.e
		})
		if calls > 1 || !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("after %v, %v: Serve returned %v after %d calls, want %v after one at most", tc.res, tc.e, err, calls, os.ErrDeadlineExceeded)
		}
	}
}

// TestServeReturnsTheReadsErrno checks that EINTR has read called again at once, and that any other errno
// ends Serve with it, whatever the Result with it.
func TestServeReturnsTheReadsErrno(t *testing.T) {
	_, rc := listenUDP(t)
	errnos := []syscall.Errno{syscall.EINTR, syscall.ECONNRESET}
	calls := 0
	err := Serve(rc, func(uintptr) (Result, syscall.Errno) {
		e := errnos[calls]
		calls++
		return More, e
	})
	if calls != 2 || !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("Serve returned %v after %d calls, want %v after 2", err, calls, syscall.ECONNRESET)
	}
}
