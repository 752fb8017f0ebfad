//go:build linux

package wirecache

import (
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// newTestReaderPath returns a fast path on a loopback socket that holds no answer, so that every query it
// reads is passed on (to its chain conn's queue, which holds passQueue), and a client connected to it.
// helpWanted holds one wake-up, so that a test sees whether a reader asked for help without a helper
// waiting.
func newTestReaderPath(t *testing.T) (*fastPath, *net.UDPConn) {
	t.Helper()
	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	fp := &fastPath{
		// Registered nowhere.
		queries:    promauto.With(nil).NewCounter(prometheus.CounterOpts{Name: "queries"}),
		passed:     promauto.With(nil).NewCounter(prometheus.CounterOpts{Name: "passed"}),
		helpWanted: make(chan struct{}, 1), readersStop: make(chan struct{}), helpBeside: true,
	}
	if err := fp.useSocket(conn); err != nil {
		t.Fatal(err)
	}
	fp.chain = &chainConn{fp: fp, queue: make(chan passedQuery, passQueue), closed: make(chan struct{}), passed: make(chan struct{}, 1)}
	client, err := net.DialUDP("udp", nil, conn.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	return fp, client
}

// sendQueries sends n queries from client; on loopback each is in the fast path's socket when the send returns.
func sendQueries(t *testing.T, client *net.UDPConn, n int) {
	t.Helper()
	for id := range uint16(n) {
		if _, err := client.Write(packedQuery(t, id)); err != nil {
			t.Fatal(err)
		}
	}
}

// TestReaderAsksForHelpOnlyWhenBatchesComeFull checks that a short batch wakes no helper and a full one does,
// and that a helper reads what is queued, batch after batch, until a batch comes short, without waiting.
func TestReaderAsksForHelpOnlyWhenBatchesComeFull(t *testing.T) {
	fp, client := newTestReaderPath(t)
	r := newFastReader(fp)

	sendQueries(t, client, fastBatch-1)
	r.readQueued()
	if got := len(fp.chain.queue); got != fastBatch-1 {
		t.Fatalf("%d queries read of %d", got, fastBatch-1)
	}
	if len(fp.helpWanted) != 0 {
		t.Fatal("a short batch asked for help")
	}

	sendQueries(t, client, 2*fastBatch+3)
	r.readQueued()
	if got := len(fp.chain.queue) - (fastBatch - 1); got != 2*fastBatch+3 {
		t.Fatalf("the helper read %d of %d queued queries", got, 2*fastBatch+3)
	}
	if len(fp.helpWanted) != 1 {
		t.Fatal("a full batch did not ask for help")
	}
	// With nothing queued, a read returns at once.
	r.readQueued()
}

// TestReaderReadsEveryBurst checks that the waiting reader reads every datagram of a burst with no later one
// to wake it. Once a batch comes short the reader waits without the read that would find the socket empty,
// which loses no datagram only while its wait keeps the readiness the runtime's poller took as a batch was
// answered; bursts of every size up to three batches, sent while the reader answers their first datagrams,
// give the poller that chance (with more than one P an idle one polls the network meanwhile).
func TestReaderReadsEveryBurst(t *testing.T) {
	fp, client := newTestReaderPath(t)
	fp.helpBeside = false // run alone reads
	done := make(chan struct{})
	go func() {
		newFastReader(fp).run()
		close(done)
	}()
	for burst := range 2000 {
		n := 1 + burst%(3*fastBatch)
		sendQueries(t, client, n)
		for i := range n {
			select {
			case <-fp.chain.queue:
			case <-time.After(10 * time.Second): // bounds a failure only
				t.Fatalf("burst %d: %d of its %d datagrams were not read", burst, n-i, n)
			}
		}
	}
	fp.stopping.Store(true)
	if err := fp.conn.SetReadDeadline(time.Now()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second): // bounds a failure only
		t.Fatal("the reader did not return once stopped")
	}
}

// TestHelperEndsWhenStopped checks that an idle helper returns once the readers are stopped.
func TestHelperEndsWhenStopped(t *testing.T) {
	fp, _ := newTestReaderPath(t)
	done := startTestHelper(fp)
	close(fp.readersStop)
	select {
	case <-done:
	case <-time.After(10 * time.Second): // bounds a failure only
		t.Fatal("the helper did not return once stopped")
	}
}

// startTestHelper starts a helper reader of fp, woken through a helpWanted that holds no wake-up (as
// startFastPath makes it), and returns what is closed once the helper returns.
func startTestHelper(fp *fastPath) <-chan struct{} {
	fp.helpWanted = make(chan struct{})
	done := make(chan struct{})
	go func() {
		newFastReader(fp).help()
		close(done)
	}()
	return done
}
