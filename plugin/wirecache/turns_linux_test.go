//go:build linux

package wirecache

import (
	"net"
	"runtime"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// TestAcceptBurstGivesHitsTurns: with one P, as node-cache runs, queries queued on a fast path's socket are
// read in the middle of a burst of connections to accept, by its helper, and not once the burst is over: the
// network poller, which wakes the reader that waits on the socket, runs only when nothing else is ready.
func TestAcceptBurstGivesHitsTurns(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	fp, client := newTestReaderPath(t)
	helped := startTestHelper(fp)
	defer func() { close(fp.readersStop); <-helped }()
	var turns hitTurns
	turns.add(fp.helpWanted)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	limited := &limitedListener{Listener: ln, limits: newConnLimits(1<<20, 1<<20),
		refusals: newRefusals(RefusedHold, MaxHeldRefusals, &turns), turns: &turns,
		// Registered nowhere.
		open:    promauto.With(nil).NewGauge(prometheus.GaugeOpts{Name: "open"}),
		refused: promauto.With(nil).NewCounterVec(prometheus.CounterOpts{Name: "refused"}, []string{"reason"})}
	defer limited.Close()
	const burst = 4 * turnEvery
	for range burst {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	const queries = 5
	sendQueries(t, client, queries)

	// Each connection is queued: no Accept waits, so nothing but a turn lets the helper run meanwhile.
	readBy := -1
	for i := range burst {
		c, err := limited.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if readBy < 0 && len(fp.chain.queue) == queries {
			readBy = i
		}
	}
	if readBy < 0 || readBy >= burst-1 {
		t.Fatalf("the queued queries were read after accept %d of the burst of %d, want within it", readBy, burst)
	}
	t.Logf("the queued queries were read by accept %d of %d", readBy, burst)
}
