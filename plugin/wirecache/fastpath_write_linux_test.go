//go:build linux

package wirecache

import (
	"bytes"
	"errors"
	"io"
	"net"
	"runtime/trace"
	"strings"
	"testing"
	"time"

	"github.com/coredns/coredns/plugin"
	exptrace "golang.org/x/exp/trace"
)

// TestChainRepliesAreRaw checks, in an execution trace, that the replies to the queries the fast path passes
// on are written as its own are, with no system call the scheduler is told of (each would wake its monitor
// thread on an idle cache): a plain query's through chainServers, any other's through chainConn.
func TestChainRepliesAreRaw(t *testing.T) {
	s, client := newTestChainServers(t, plugin.HandlerFunc(answerA))
	from := client.LocalAddr().(*net.UDPAddr)

	var buf bytes.Buffer
	if err := trace.Start(&buf); err != nil {
		t.Fatalf("start an execution trace: %v", err)
	}
	s.serve(passedQuery{b: packedQuery(t, 1), from: from})
	ids, err := readReplies(client, 1)
	if err == nil {
		_, err = s.fp.chain.WriteTo(packedQuery(t, 2), from)
	}
	trace.Stop()
	if err != nil || !ids[1] {
		t.Fatalf("the chain's reply: %v %v", ids, err)
	}
	var got [2]byte
	if _, _, err := client.ReadFrom(got[:]); err != nil || got != [2]byte{0, 2} {
		t.Fatalf("chainConn's write: %v, ID %v", err, got)
	}

	syscalls, err := syscallsIn(buf.Bytes(), "wirecache.(*fastPath).sendTo", "wirecache.(*chainWriter).Write", "wirecache.(*chainConn).WriteTo")
	if err != nil {
		t.Fatal(err)
	}
	for _, stack := range syscalls {
		t.Errorf("a reply written through the scheduler:\n%s", stack)
	}
}

// syscallsIn returns the stacks of the system calls the trace shows made under any of the functions named.
func syscallsIn(traced []byte, funcs ...string) ([]string, error) {
	r, err := exptrace.NewReader(bytes.NewReader(traced))
	if err != nil {
		return nil, err
	}
	var stacks []string
	for {
		ev, err := r.ReadEvent()
		if errors.Is(err, io.EOF) {
			return stacks, nil
		}
		if err != nil {
			return nil, err
		}
		if ev.Kind() != exptrace.EventStateTransition {
			continue
		}
		st := ev.StateTransition()
		if st.Resource.Kind != exptrace.ResourceGoroutine {
			continue
		}
		if _, to := st.Goroutine(); to != exptrace.GoSyscall {
			continue
		}
		stack := ev.Stack().String()
		for _, f := range funcs {
			if strings.Contains(stack, f) {
				stacks = append(stacks, stack)
				break
			}
		}
	}
}

// TestSendToEveryFamily writes through sendTo from sockets of each family to a client of each family they
// can reach: an IPv4 socket to an IPv4 client, an IPv6 socket (dual-stack) to an IPv6 one and to an IPv4
// one (IPv4-mapped, as the kernel reports its sender), and refuses an IPv6 client from an IPv4 socket.
func TestSendToEveryFamily(t *testing.T) {
	for _, tc := range []struct {
		name, server, client string
		refused              bool
	}{
		{name: "IPv4", server: "127.0.0.1:0", client: "127.0.0.1:0"},
		{name: "IPv6", server: "[::1]:0", client: "[::1]:0"},
		{name: "IPv4 from a dual-stack socket", server: "[::]:0", client: "127.0.0.1:0"},
		{name: "IPv6 from an IPv4 socket", server: "127.0.0.1:0", client: "[::1]:0", refused: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fp, conn, client := newSendPair(t, tc.server, tc.client)
			n, err := fp.sendTo([]byte("reply"), client.LocalAddr())
			if tc.refused {
				if err == nil {
					t.Fatalf("sent %d bytes to %v from %v", n, client.LocalAddr(), conn.LocalAddr())
				}
				return
			}
			if err != nil || n != len("reply") {
				t.Fatalf("sent %d bytes: %v", n, err)
			}
			buf := make([]byte, 16)
			_ = client.SetReadDeadline(time.Now().Add(10 * time.Second)) // bounds a failure only
			n, _, err = client.ReadFrom(buf)
			if err != nil || string(buf[:n]) != "reply" {
				t.Fatalf("read %q: %v", buf[:n], err)
			}
		})
	}
}

// TestSendToAllocatesNothing: a reply to a query the fast path passed on is written without an allocation.
func TestSendToAllocatesNothing(t *testing.T) {
	fp, _, client := newSendPair(t, "127.0.0.1:0", "127.0.0.1:0")
	reply, to := []byte("reply"), client.LocalAddr()
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := fp.sendTo(reply, to); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocations per reply, want 0", allocs)
	}
}

// newSendPair returns a fast path on a UDP socket of its own at server, that socket, and a client's socket
// at client.
func newSendPair(t *testing.T, server, client string) (*fastPath, net.PacketConn, net.PacketConn) {
	t.Helper()
	conn, err := net.ListenPacket("udp", server)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	cl, err := net.ListenPacket("udp", client)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	fp := &fastPath{}
	if err := fp.useSocket(conn.(*net.UDPConn)); err != nil {
		t.Fatal(err)
	}
	return fp, conn, cl
}
