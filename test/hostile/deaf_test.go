//go:build linux

package hostile

import (
	"context"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// deafConns connect to each address with a small receive buffer (deafBuffer), send deafQueries queries
// with large answers in one go, and never read: once the socket buffers are full, the cache's writes of the
// answers block. CoreDNS's server has a
// write timeout (5 s) that its TCP server never applies, so without node-cache's TCP write timeout
// (NODECACHE_TCP_WRITE_TIMEOUT, tcpwrite.go in cmd/node-cache) it holds each of them, a goroutine blocked
// in a write, for as long as the client keeps the connection open.
const (
	deafConns   = 50
	deafQueries = 2000
	deafBuffer  = 4096
	// deafBound bounds how long the cache may take to give up on them: node-cache's TCP write timeout (5 s)
	// takes effect at the kernel's first zero-window probe after it, and the probes back off exponentially
	// from the retransmission timeout (200 ms): about 25 s. A failure bound, not an expectation.
	deafBound = 90 * time.Second
)

// deaf opens count connections to each address that send deafQueries queries and never read. They stay
// open until the caller closes them.
func (r *rig) deaf(count int) ([]net.Conn, error) {
	d := net.Dialer{Timeout: askTimeout, Control: func(_, _ string, c syscall.RawConn) error {
		var err error
		if cerr := c.Control(func(fd uintptr) { err = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, deafBuffer) }); cerr != nil {
			return cerr
		}
		return err
	}}
	conns, err := r.hostile.dialMany(count, d)
	if err != nil {
		return nil, fmt.Errorf("deaf connections: %w", err)
	}
	var batch []byte
	for i := range deafQueries {
		q := msg(bigName, dns.TypeA, dns.ClassINET, edns(4096))(uint16(i))
		batch = append(batch, byte(len(q)>>8), byte(len(q)))
		batch = append(batch, q...)
	}
	for _, c := range conns {
		_ = c.SetWriteDeadline(time.Now().Add(deafBound))
		if _, err := c.Write(batch); err != nil {
			closeAll(conns)
			return nil, fmt.Errorf("sending the deaf connections' queries: %w", err)
		}
	}
	return conns, nil
}

func closeAll(conns []net.Conn) {
	for _, c := range conns {
		c.Close()
	}
}

// testDeaf holds connections that send queries and never read their answers: the cache's writes to them
// block (its sockets' send queues stay full), and the cache gives up on them while they are still open at
// the Pod's end, its goroutines back to where they were.
func (r *rig) testDeaf(t *testing.T) {
	before, err := r.settled()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	conns, err := r.deaf(deafConns)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(conns)
	ports := map[string]bool{}
	for _, c := range conns {
		ports[c.LocalAddr().String()] = true
	}
	pod := r.startPod(5 * time.Millisecond)
	defer pod.end()
	blocked := func() (stuck, open int) {
		out, err := r.n.In(context.Background(), r.n.NodeNS, "ss", "-tnH", "state", "established", "( sport = :53 )")
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.SplitSeq(out, "\n") {
			f := strings.Fields(line)
			if len(f) < 4 || !ports[f[3]] {
				continue
			}
			open++
			if f[1] != "0" {
				stuck++
			}
		}
		return stuck, open
	}
	var stuck, open int
	for stuck, open = blocked(); stuck < len(conns)*9/10; stuck, open = blocked() {
		if time.Since(start) > closeBound {
			t.Fatalf("%d of %d deaf connections have answers queued at the cache after %v (%d open): the test does not block the cache's writes", stuck, len(conns), closeBound, open)
		}
		time.Sleep(100 * time.Millisecond)
	}
	held, err := r.scrape(cacheMetrics)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d deaf connections with answers queued at the cache after %v: %v (before: %v)", stuck, time.Since(start).Round(time.Millisecond), held, before)
	for stuck, open = blocked(); open > 0; stuck, open = blocked() {
		if time.Since(start) > deafBound {
			t.Fatalf("%d deaf connections still open at the cache after %v, %d with answers queued", open, deafBound, stuck)
		}
		time.Sleep(250 * time.Millisecond)
	}
	gone := time.Since(start)
	after, back := r.scrapeUntil(t, start.Add(deafBound), 250*time.Millisecond, func(after process) bool {
		return after.goroutines <= before.goroutines+float64(len(conns))/4
	})
	if !back {
		t.Errorf("%v once the cache closed the deaf connections, against %v before", after, before)
	}
	lookups := pod.end()
	t.Logf("the cache closed the deaf connections after %v: %v", gone.Round(time.Millisecond), after)
	t.Logf("well-behaved Pod meanwhile: %v", lookups)
	if lookups.failed > 0 {
		t.Errorf("the well-behaved Pod's lookups failed: %v; first: %s", lookups, lookups.first)
	}
	r.alive(t)
}
