//go:build linux

package hostile

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"regexp"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nodelocaldns/nodelocaldns/plugin/wirecache"

	"github.com/miekg/dns"
)

// Sizes of the attack, per address of the cache (so twice these in all).
const (
	// idleConns connect and send nothing: CoreDNS's server closes them after its read timeout (3 s).
	idleConns = 1000
	// heldConns send a query every heldEvery, heldRounds times, each answered: CoreDNS keeps them open.
	heldConns  = 150
	heldEvery  = 2 * time.Second
	heldRounds = 3
	// lorisConns send a query a byte every lorisEvery, never finishing one within the read timeout.
	lorisConns = 100
	lorisEvery = 250 * time.Millisecond
	// floodQueries odd queries go out over UDP from floodSockets sockets at a time, at most floodRate a
	// second.
	floodQueries = 8000
	floodSockets = 64
	floodRate    = 1000
)

// closeBound bounds how long the cache may take to close a connection that has not sent a whole query:
// its read timeout (3 s) and a busy machine's slack. A failure bound, not an expectation.
const closeBound = 30 * time.Second

// hotLookups are the names a well-behaved Pod keeps asking, and an address each answer must hold.
var hotLookups = []struct {
	name  string
	qtype uint16
	want  string
}{
	{"kubernetes.default.svc.cluster.local.", dns.TypeA, "10.96.0.1"},
	{"web.default.svc.cluster.local.", dns.TypeA, "10.244.2.7"},
	{"web.default.svc.cluster.local.", dns.TypeAAAA, "fd00:10:244:2::7"},
}

// testAttack runs every connection-level attack at once, with a flood of the odd queries over UDP, while a
// well-behaved Pod asks its hot names: every one of its lookups is answered, the connections that send
// nothing whole are closed by the cache, those that send queries are answered, and once the attack is over
// the cache's goroutines and heap come back to where they were.
func (r *rig) testAttack(t *testing.T) {
	before, err := r.settled()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("before the attack: %v", before)
	samples := r.sample(200 * time.Millisecond)
	pod := r.startPod(5 * time.Millisecond)
	defer pod.end()

	var wg sync.WaitGroup
	var idle, loris []time.Duration
	var idleErr, lorisErr, heldErr, floodErr error
	var held, heldRefused, flooded int64
	wg.Go(func() { idle, idleErr = r.hostile.idle(idleConns) })
	wg.Go(func() { loris, lorisErr = r.hostile.loris(lorisConns) })
	wg.Go(func() { held, heldRefused, heldErr = r.hostile.held(heldConns) })
	wg.Go(func() { flooded, floodErr = r.hostile.flood(floodQueries) })
	wg.Wait()
	lookups := pod.end()
	peak, scrapeErrs := samples.end()
	r.alive(t)

	for _, err := range []error{idleErr, lorisErr, heldErr, floodErr} {
		if err != nil {
			t.Error(err)
		}
	}
	for _, err := range scrapeErrs {
		t.Errorf("the metrics endpoint during the attack: %v", err)
	}
	t.Logf("idle connections: %d closed by the cache, the last after %v", len(idle), last(idle))
	t.Logf("slow-loris connections: %d closed by the cache, the last after %v", len(loris), last(loris))
	t.Logf("held connections: %d queries answered, %d connections refused at the cache's bound; flood: %d odd queries sent", held, heldRefused, flooded)
	t.Logf("well-behaved Pod: %v", lookups)
	t.Logf("peak during the attack: %v", peak)
	if lookups.failed > 0 {
		t.Errorf("the well-behaved Pod's lookups failed during the attack: %v; first: %s", lookups, lookups.first)
	}
	if lookups.answered == 0 {
		t.Error("the well-behaved Pod asked nothing")
	}

	// The cache holds at most its bound of one client's connections (the well-behaved Pod's are another
	// client's, a few at a time), and every goroutine the attack cost belongs to one of them.
	perClient := float64(wirecache.DefaultTCPConnectionsPerClient)
	if peak.tcpConnections > perClient+16 {
		t.Errorf("%.0f TCP connections open at once at the peak: more than one client's bound, %.0f, and the well-behaved Pod's", peak.tcpConnections, perClient)
	}
	if bound := before.goroutines + perClient + 600; peak.goroutines > bound {
		t.Errorf("%.0f goroutines at the peak, with at most %.0f of the attack's connections open: more than %.0f", peak.goroutines, perClient, bound)
	}
	// Resident memory: each connection costs a goroutine's stack and a read buffer, a few KiB.
	if bound := before.rss + perClient*(64<<10) + (64 << 20); peak.rss > bound {
		t.Errorf("%.1f MiB resident at the peak, with at most %.0f of the attack's connections open: more than %.1f MiB", peak.rss/(1<<20), perClient, bound/(1<<20))
	}
	// Once the attack is over, they come back.
	after, back := r.scrapeUntil(t, time.Now().Add(closeBound), 200*time.Millisecond, func(after process) bool {
		return after.goroutines <= before.goroutines+128 && after.heap <= before.heap+(16<<20)
	})
	if !back {
		t.Errorf("%v after the attack, against %v before it", after, before)
	}
	t.Logf("after the attack: %v", after)
	// The attack opened more connections than the bound: those beyond it were refused.
	opened := 2 * (idleConns + heldConns + lorisConns)
	if refused := after.metrics[tcpRefusedMetric] - before.metrics[tcpRefusedMetric]; refused == 0 {
		t.Errorf("the cache refused none of the attack's %d connections: they were not bounded", opened)
	} else {
		t.Logf("the cache refused %.0f of the attack's %d connections at its bound", refused, opened)
	}
}

// tcpRefusedMetric counts the connections the cache reset at its bounds.
const tcpRefusedMetric = "coredns_wirecache_tcp_refused_total"

// settled returns the cache's figures once its goroutines have settled: the fast path ends the goroutines it
// kept for a burst of misses once they were idle for a second, so two scrapes a second and a half apart
// that agree within a few goroutines are the process at rest (or the last of five tries is taken).
func (r *rig) settled() (process, error) {
	p, err := r.scrape(cacheMetrics)
	for range 5 {
		if err != nil {
			return p, err
		}
		time.Sleep(1500 * time.Millisecond)
		var next process
		next, err = r.scrape(cacheMetrics)
		if err == nil && next.goroutines <= p.goroutines+4 && next.goroutines >= p.goroutines-4 {
			return next, nil
		}
		p = next
	}
	return p, err
}

func last(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	return slices.Max(ds)
}

// hostilePod opens the attack's sockets in the hostile Pod's network namespace: through the simulated node
// in the test process (testAttack), directly in the attacker process of the benchmark, which runs inside it.
type hostilePod struct {
	// inPod runs fn where the sockets it creates belong to the hostile Pod's namespace.
	inPod func(fn func() error) error
	// floodCases, when set, picks the odd cases the flood sends by name (the benchmark's HOSTILE_FLOOD);
	// unset, it sends them all.
	floodCases *regexp.Regexp
	// floodAt, when set, is where the flood goes instead of the cache's two addresses: the benchmark's decoy
	// (decoyAddr), the same flood from the same process aimed at nothing.
	floodAt string
}

// decoyAddr is where the decoy flood goes: a port nothing listens on, in the hostile Pod's own namespace, so
// that the attacker spends on its flood what it spends on the real one but the cache sees none of it.
const decoyAddr = "127.0.0.1:9"

// The hostile Pod is a Pod of its own, as on a node: its own network namespace, address and veth. The cache
// tells it from the well-behaved Pod by its address (it bounds the TCP connections of each client address),
// and its sockets take ports of its own: thousands of connections opened and closed leave their TIME_WAIT
// entries in its namespace, where in one shared with the well-behaved Pod they took the ports that Pod's
// lookups over TCP connect from (23,000 of its 28,000 in the benchmark's third round, each connect then
// searching for a free port: its lookups over TCP took 2.7 ms instead of 0.5, with the attack and without).
const (
	hostilePodIP     = "10.244.2.2"
	hostilePodNodeIP = "10.244.2.1"
)

// dialMany opens count TCP connections to each of the cache's addresses from the Pod, with dialer if
// given.
func (h hostilePod) dialMany(count int, dialer ...net.Dialer) ([]net.Conn, error) {
	d := net.Dialer{Timeout: askTimeout}
	if len(dialer) > 0 {
		d = dialer[0]
	}
	var conns []net.Conn
	err := h.inPod(func() error {
		for _, p := range pairs {
			for range count {
				c, err := d.Dial("tcp", p.cache)
				if err != nil {
					return fmt.Errorf("connection %d to %s: %w", len(conns)+1, p.cache, err)
				}
				conns = append(conns, c)
			}
		}
		return nil
	})
	if err != nil {
		for _, c := range conns {
			c.Close()
		}
	}
	return conns, err
}

// waitClosed waits until the cache closes each connection (within closeBound), and returns how long each
// took from start, sorted.
func waitClosed(conns []net.Conn, start time.Time, what string) ([]time.Duration, error) {
	closed := make([]time.Duration, len(conns))
	var open atomic.Int64
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Go(func() {
			defer c.Close()
			_ = c.SetReadDeadline(start.Add(closeBound))
			_, err := c.Read(make([]byte, 512))
			if errors.Is(err, os.ErrDeadlineExceeded) {
				open.Add(1)
				return
			}
			closed[i] = time.Since(start)
		})
	}
	wg.Wait()
	if n := open.Load(); n > 0 {
		return closed, fmt.Errorf("%s: %d of %d connections still open after %v", what, n, len(conns), closeBound)
	}
	slices.Sort(closed)
	return closed, nil
}

// idle opens count connections to each address that send nothing, and waits for the cache to close them.
func (h hostilePod) idle(count int) ([]time.Duration, error) {
	start := time.Now()
	conns, err := h.dialMany(count)
	if err != nil {
		return nil, fmt.Errorf("idle connections: %w", err)
	}
	return waitClosed(conns, start, "idle connections")
}

// loris opens count connections to each address that send a query a byte every lorisEvery, and waits for
// the cache to close them before the query is whole.
func (h hostilePod) loris(count int) ([]time.Duration, error) {
	start := time.Now()
	conns, err := h.dialMany(count)
	if err != nil {
		return nil, fmt.Errorf("slow-loris connections: %w", err)
	}
	query := msg(w("loris"), dns.TypeA, dns.ClassINET, padTo(200))(1)
	wire := append([]byte{byte(len(query) >> 8), byte(len(query))}, query...)
	stop := make(chan struct{})
	var trickle sync.WaitGroup
	for _, c := range conns {
		trickle.Go(func() {
			for i := range wire {
				if _, err := c.Write(wire[i : i+1]); err != nil {
					return // closed by the cache
				}
				select {
				case <-stop:
					return
				case <-time.After(lorisEvery):
				}
			}
		})
	}
	closed, err := waitClosed(conns, start, "slow-loris connections")
	close(stop)
	trickle.Wait()
	return closed, err
}

// held opens count connections to each address and sends a hot query on each every heldEvery, heldRounds
// times. The cache refuses those beyond its bound on one client's connections (it resets them, after a
// hold) before it answers them; every query on the others must be answered on its connection.
func (h hostilePod) held(count int) (answered, refused int64, err error) {
	conns, err := h.dialMany(count)
	if err != nil {
		return 0, 0, fmt.Errorf("held connections: %w", err)
	}
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	var answeredN, refusedN atomic.Int64
	errs := make([]error, len(conns))
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Go(func() {
			for round := range heldRounds {
				if round > 0 {
					time.Sleep(heldEvery)
				}
				id := uint16(i*heldRounds + round)
				query := msg("kubernetes.default.svc.cluster.local.", dns.TypeA, dns.ClassINET)(id)
				_ = c.SetDeadline(time.Now().Add(closeBound))
				err := writeFramed(c, query)
				var reply []byte
				if err == nil {
					reply, err = readFramed(c)
				}
				if err != nil && round == 0 && resetByPeer(err) {
					refusedN.Add(1)
					return
				}
				if err != nil {
					errs[i] = fmt.Errorf("held connection %d, round %d: %w", i, round+1, err)
					return
				}
				if problem := hotProblem(hotLookups[0].name, hotLookups[0].qtype, hotLookups[0].want, reply, id); problem != "" {
					errs[i] = fmt.Errorf("held connection %d, round %d: %s", i, round+1, problem)
					return
				}
				answeredN.Add(1)
			}
		})
	}
	wg.Wait()
	return answeredN.Load(), refusedN.Load(), errors.Join(errs...)
}

// resetByPeer reports whether err says the cache reset or closed the connection.
func resetByPeer(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// flood sends total odd queries over UDP to both addresses (or to floodAt), from floodSockets sockets at a
// time (each used for 50 queries, then replaced), at most floodRate a second, and reads nothing: what the
// cache answers was compared already, this is about what it costs.
func (h hostilePod) flood(total int) (int64, error) {
	queries := floodSent(h.floodCases)
	if len(queries) == 0 {
		return 0, fmt.Errorf("no odd case's name matches %v", h.floodCases)
	}
	var sent int64
	err := h.inPod(func() error {
		var sockets []net.Conn
		defer func() {
			for _, c := range sockets {
				c.Close()
			}
		}()
		tick := time.NewTicker(time.Second / floodRate)
		defer tick.Stop()
		for i := range total {
			slot := i % floodSockets
			if i%(floodSockets*50) < floodSockets {
				if slot < len(sockets) {
					sockets[slot].Close()
				}
				to := pairs[slot%len(pairs)].cache
				if h.floodAt != "" {
					to = h.floodAt
				}
				c, err := net.Dial("udp", to)
				if err != nil {
					return err
				}
				if slot < len(sockets) {
					sockets[slot] = c
				} else {
					sockets = append(sockets, c)
				}
			}
			<-tick.C
			if _, err := sockets[slot].Write(queries[i%len(queries)]); err == nil {
				sent++
			}
		}
		return nil
	})
	return sent, err
}

// floodSent returns the queries the flood sends: those of every odd case, or of the cases whose names
// cases matches when it is set, but the broken upstream's, whose replies take seconds (a flood of them is a
// slow upstream's test).
func floodSent(cases *regexp.Regexp) [][]byte {
	var queries [][]byte
	for _, c := range oddCases() {
		if c.timeout != 0 || cases != nil && !cases.MatchString(c.name) {
			continue
		}
		for _, q := range c.queries {
			queries = append(queries, q(0x0f0f))
		}
	}
	return queries
}

// podLookups counts a well-behaved Pod's lookups.
type podLookups struct {
	// retried counts the lookups whose first query went unanswered (answered or failed after all).
	answered, failed, retried int
	first                     string // the first failure
	latencies                 []time.Duration
	// overTCP are the latencies of the lookups made over TCP, which latencies holds too.
	overTCP    []time.Duration
	slowest    time.Duration
	slowestWas string // the slowest lookup answered, and when
	elapsed    time.Duration
}

func (l podLookups) String() string {
	s := fmt.Sprintf("%d lookups answered, %d failed, %d retried, in %v", l.answered, l.failed, l.retried, l.elapsed.Round(time.Millisecond))
	if len(l.latencies) > 0 {
		lat := slices.Sorted(slices.Values(l.latencies))
		s += fmt.Sprintf(" (%.0f/s; median %v, p99 %v, max %v)", float64(l.answered)/l.elapsed.Seconds(),
			lat[len(lat)/2].Round(time.Microsecond), lat[len(lat)*99/100].Round(time.Microsecond), lat[len(lat)-1].Round(time.Microsecond))
	}
	if len(l.overTCP) > 0 {
		lat := slices.Sorted(slices.Values(l.overTCP))
		s += fmt.Sprintf(" (over TCP: %d, median %v, p90 %v)", len(lat), lat[len(lat)/2].Round(time.Microsecond), lat[len(lat)*9/10].Round(time.Microsecond))
	}
	if l.slowestWas != "" {
		s += "; the slowest: " + l.slowestWas
	}
	return s
}

// pod is a well-behaved Pod asking its hot names until end.
type pod struct {
	stop    chan struct{}
	stopped sync.Once
	done    chan struct{}
	res     podLookups
}

// startPod starts a well-behaved Pod: it asks the hot names in turn, on both addresses, over UDP (every
// tenth over TCP), one at a time with a pause of every between them, each lookup as glibc makes it.
func (r *rig) startPod(every time.Duration) *pod {
	p := &pod{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		start := time.Now()
		err := r.n.Do(r.n.PodNS, func() error {
			for i := 0; ; i++ {
				select {
				case <-p.stop:
					return nil
				case <-time.After(every):
				}
				problem, took, retried := lookupHot(i, tcpEvery)
				if retried {
					p.res.retried++
				}
				if problem != "" {
					p.res.failed++
					if p.res.first == "" {
						p.res.first = problem
					}
				} else {
					p.res.answered++
					p.res.latencies = append(p.res.latencies, took)
					if took > p.res.slowest {
						name, qtype, _, server, tr := hotLookup(i, tcpEvery)
						p.res.slowest = took
						p.res.slowestWas = fmt.Sprintf("%s %s to %s over %s, answered %v into the run", name, dns.TypeToString[qtype], server, tr.name, time.Since(start).Round(time.Millisecond))
					}
				}
			}
		})
		if err != nil {
			p.res.failed++
			p.res.first = err.Error()
		}
		p.res.elapsed = time.Since(start)
	}()
	return p
}

// Glibc's resolver waits 5 s for an answer and tries twice (attempts:2) before a lookup fails.
const (
	glibcTimeout  = 5 * time.Second
	glibcAttempts = 2
)

// tcpEvery is how often a well-behaved Pod's lookups go over TCP: every tenth.
const tcpEvery = 10

// hotLookup is what the well-behaved Pod's lookup number i asks, of which server, over which transport:
// TCP for every overTCP-th lookup (none when overTCP is 0), UDP for the others.
func hotLookup(i, overTCP int) (name string, qtype uint16, want, server string, tr transport) {
	h := hotLookups[i%len(hotLookups)]
	tr = udp
	if overTCP > 0 && i%overTCP == overTCP-1 {
		tr = tcp
	}
	return h.name, h.qtype, h.want, pairs[i/len(hotLookups)%len(pairs)].cache, tr
}

// lookupHot is the well-behaved Pod's lookup number i (hotLookup), as glibc makes it: "" and how long it
// took, or what went wrong; retried says whether its first query went unanswered.
func lookupHot(i, overTCP int) (problem string, took time.Duration, retried bool) {
	name, qtype, want, server, tr := hotLookup(i, overTCP)
	id := uint16(i)
	start := time.Now()
	var reply []byte
	var closed bool
	var err error
	for attempt := range glibcAttempts {
		reply, closed, err = exchange(tr, server, msg(name, qtype, dns.ClassINET)(id), glibcTimeout)
		if reply != nil || err != nil || attempt == glibcAttempts-1 {
			break
		}
		retried = true
	}
	problem, took = lookupProblem(name, qtype, want, server, tr, reply, closed, err, id), time.Since(start)
	return problem, took, retried
}

// lookupProblem says what is wrong with the outcome of a hot lookup; "" when nothing is.
func lookupProblem(name string, qtype uint16, want, server string, tr transport, reply []byte, closed bool, err error, id uint16) string {
	if reply == nil || err != nil {
		return fmt.Sprintf("%s %s to %s over %s: %s", name, dns.TypeToString[qtype], server, tr.name, describe(reply, closed, err, id).text)
	}
	if problem := hotProblem(name, qtype, want, reply, id); problem != "" {
		return fmt.Sprintf("to %s over %s: %s", server, tr.name, problem)
	}
	return ""
}

// hotProblem says what is wrong with reply as the answer to the query with ID id for name and qtype,
// whose answer holds the address want: "" when nothing is.
func hotProblem(name string, qtype uint16, want string, reply []byte, id uint16) string {
	m := new(dns.Msg)
	if m.Unpack(reply) == nil && m.Id == id && m.Rcode == dns.RcodeSuccess {
		for _, rr := range m.Answer {
			switch rr := rr.(type) {
			case *dns.A:
				if rr.A.String() == want {
					return ""
				}
			case *dns.AAAA:
				if rr.AAAA.String() == want {
					return ""
				}
			}
		}
	}
	return fmt.Sprintf("%s %s: %s", name, dns.TypeToString[qtype], summary(describe(reply, false, nil, id).text))
}

// end stops the Pod and returns its count; it may be called again.
func (p *pod) end() podLookups {
	p.stopped.Do(func() { close(p.stop) })
	<-p.done
	return p.res
}
