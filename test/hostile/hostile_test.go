//go:build linux

package hostile

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"
)

// pair is one address of the cache under test and the same address of the reference.
type pair struct{ name, cache, ref string }

var pairs = []pair{
	{"link-local", linkLocal, refLinkLocal},
	{"ClusterIP", kubeDNS, refKubeDNS},
}

// TestHostileClients runs the hostile-client suite on one simulated node: each subtest is one kind of abuse,
// and the node cache must come through all of them.
func TestHostileClients(t *testing.T) {
	r := newRig(t, serveNodeCache)
	t.Run("odd queries answered as CoreDNS answers them", r.testOddQueries)
	r.alive(t)
	t.Run("a failed question asked again", r.testFailedAgain)
	t.Run("one ID from many ports", r.testSameID)
	t.Run("connections that send nothing", r.testSilent)
	t.Run("attack", r.testAttack)
	t.Run("clients that never read", r.testDeaf)
	r.alive(t)
}

// testOddQueries compares the cache's answers to oddCases with the reference's.
func (r *rig) testOddQueries(t *testing.T) {
	before, err := r.scrape(cacheMetrics)
	if err != nil {
		t.Fatal(err)
	}
	r.compare(t, oddCases())
	for _, kind := range brokenKinds {
		if r.upstream.count(kind) == 0 {
			t.Errorf("the cluster DNS never gave a reply broken as %s", kind)
		}
	}
	// The comparison means something only if the cache's hits were wirecache's, on the fast path over UDP.
	after, err := r.scrape(cacheMetrics)
	if err != nil {
		t.Fatal(err)
	}
	hits := after.metrics["coredns_wirecache_hits_total"] - before.metrics["coredns_wirecache_hits_total"]
	fast := after.metrics["coredns_wirecache_fastpath_datagrams_total"] - after.metrics["coredns_wirecache_fastpath_passed_total"] -
		(before.metrics["coredns_wirecache_fastpath_datagrams_total"] - before.metrics["coredns_wirecache_fastpath_passed_total"])
	t.Logf("wirecache answered %.0f of the odd queries, its fast path %.0f", hits, fast)
	if hits == 0 || fast == 0 {
		t.Errorf("wirecache answered %.0f of the odd queries, its fast path %.0f: the comparison compared CoreDNS with itself", hits, fast)
	}
}

// compare asks every case of the cache under test and of the reference, the same bytes to both, over
// every transport and on both addresses, twice (so that the cache's second and later asks are hits), and
// requires the same answers. Cases run at once, each case's asks in order.
func (r *rig) compare(t *testing.T, cases []oddCase) {
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for _, c := range cases {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			first, problems := r.compareCase(c)
			t.Logf("%s: %s", c.name, first)
			for _, p := range problems {
				t.Errorf("%s: %s", c.name, p)
			}
		})
	}
	wg.Wait()
}

// step is one ask of a case: a query, over a transport, to one address.
type step struct {
	round int
	pair  pair
	tr    transport
	query int
}

func (s step) String() string {
	return fmt.Sprintf("round %d, query %d, %s over %s", s.round+1, s.query+1, s.pair.name, s.tr.name)
}

// compareCase returns the reference's first answer to c, in short, and the differences between the cache's
// and the reference's answers to c.
func (r *rig) compareCase(c oddCase) (first string, problems []string) {
	timeout := c.timeout
	if timeout == 0 {
		timeout = askTimeout
	}
	transports := c.transports
	if transports == nil {
		transports = []transport{udp, tcp, tcpSplit}
	}
	var steps []step
	for round := range 2 {
		for _, p := range pairs {
			for _, tr := range transports {
				for q := range c.queries {
					steps = append(steps, step{round: round, pair: p, tr: tr, query: q})
				}
			}
		}
	}
	var mu sync.Mutex
	run := func(s step) (silent bool) {
		id := uint16(rand.N(1 << 16))
		query := c.queries[s.query](id)
		ask := func(server string) answer { return r.askFromPod(s.tr, server, query, id, timeout) }
		var got, want answer
		var wg sync.WaitGroup
		wg.Go(func() { got = ask(s.pair.cache) })
		wg.Go(func() { want = ask(s.pair.ref) })
		wg.Wait()
		// A datagram the machine lost is not an answer: the side that got none over UDP while the other got
		// one asks once more, as a stub resolver would.
		if !s.tr.tcp && (got.text == noReply) != (want.text == noReply) {
			if got.text == noReply {
				got = ask(s.pair.cache)
			} else {
				want = ask(s.pair.ref)
			}
		}
		mu.Lock()
		if first == "" {
			first = brief(want.text)
		}
		if d := differs(got, want); d != "" {
			problems = append(problems, fmt.Sprintf("%s: %s", s, d))
		}
		mu.Unlock()
		return want.text == noReply || want.text == closedNoReply
	}
	// A query the reference does not answer leaves nothing in a cache, so the rest of its asks need no
	// order, and waiting out each one's timeout in turn would only make the test slow.
	if !run(steps[0]) || len(c.queries) > 1 {
		for _, s := range steps[1:] {
			run(s)
		}
		return first, problems
	}
	var wg sync.WaitGroup
	for _, s := range steps[1:] {
		wg.Go(func() { run(s) })
	}
	wg.Wait()
	return first, problems
}

// summary is the first line of an answer's text: its header, or why there is none.
func summary(text string) string {
	first, _, _ := strings.Cut(text, "\n")
	return first
}

// brief is an answer's header and the counts of its sections, for a log line.
func brief(text string) string {
	lines := strings.Split(text, "\n")
	if len(lines) < 2 {
		return text
	}
	return strings.TrimPrefix(lines[0], ";; ") + "; " + strings.TrimPrefix(lines[1], ";; ")
}

// askFromPod sends query, whose ID is id, to server over tr from the well-behaved Pod's namespace, and
// returns the reply as the comparison sees it (describe); failing to enter the namespace is its error.
func (r *rig) askFromPod(tr transport, server string, query []byte, id uint16, timeout time.Duration) answer {
	var reply []byte
	var closed bool
	var err error
	if doErr := r.n.Do(r.n.PodNS, func() error {
		reply, closed, err = exchange(tr, server, query, timeout)
		return nil
	}); doErr != nil {
		err = doErr
	}
	return describe(reply, closed, err, id)
}
