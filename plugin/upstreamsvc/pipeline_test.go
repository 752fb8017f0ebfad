package upstreamsvc

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coredns/coredns/plugin/pkg/dnstest"
	"github.com/coredns/coredns/plugin/test"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// frameServer is a TCP DNS server on loopback under the test's control: each connection's frames go to
// the test on frames, each with the bytes of the read it came in, and the test answers through reply.
type frameServer struct {
	ln     net.Listener
	frames chan frame
	mu     sync.Mutex
	conns  []net.Conn
}

type frame struct {
	conn net.Conn
	msg  *dns.Msg
	read int // bytes the read that completed this frame returned
}

func newFrameServer(t *testing.T) *frameServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &frameServer{ln: ln, frames: make(chan frame, 64)}
	t.Cleanup(func() {
		ln.Close()
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, c := range s.conns {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
			go s.serve(c)
		}
	}()
	return s
}

func (s *frameServer) serve(c net.Conn) {
	var buf []byte
	chunk := make([]byte, 64<<10)
	for {
		n, err := c.Read(chunk)
		if err != nil {
			return
		}
		buf = append(buf, chunk[:n]...)
		for len(buf) >= 2 && len(buf) >= 2+int(binary.BigEndian.Uint16(buf)) {
			l := int(binary.BigEndian.Uint16(buf))
			m := new(dns.Msg)
			if err := m.Unpack(buf[2 : 2+l]); err == nil {
				s.frames <- frame{conn: c, msg: m, read: n}
			}
			buf = buf[2+l:]
		}
	}
}

func (s *frameServer) addr() string { return s.ln.Addr().String() }

// next returns the next query the server read. The deadline only bounds a failure.
func (s *frameServer) next(t *testing.T) frame {
	t.Helper()
	select {
	case f := <-s.frames:
		return f
	case <-time.After(waitLimit):
		t.Fatal("no query reached the server")
		return frame{}
	}
}

// reply answers f's query with an A record for its name, 192.0.2.9.
func reply(t *testing.T, f frame) {
	t.Helper()
	replyWith(t, f, net.IPv4(192, 0, 2, 9))
}

// replyWith answers f's query with an A record for its name, a.
func replyWith(t *testing.T, f frame, a net.IP) {
	t.Helper()
	m := new(dns.Msg)
	m.SetReply(f.msg)
	m.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: f.msg.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 5}, A: a}}
	writeFrame(t, f.conn, m)
}

// writeFrame writes m on conn as a TCP frame.
func writeFrame(t *testing.T, conn net.Conn, m *dns.Msg) {
	t.Helper()
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write(binary.BigEndian.AppendUint16(nil, uint16(len(b)))); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write(b); err != nil {
		t.Fatal(err)
	}
}

func aQuery(name string, id uint16) *dns.Msg {
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	m.Id = id
	return m
}

type exchangeResult struct {
	m   *dns.Msg
	err error
}

// exchange sends r on p for a client over TCP, with the default budget.
func exchange(ctx context.Context, p *pipeline, r *dns.Msg) (*dns.Msg, error) {
	return p.exchange(ctx, &test.ResponseWriter{TCP: true}, r, testAttempts(defaultMaxAttempts))
}

// testAttempts is a query's budget of n copies, counted under server "test".
func testAttempts(n int) *attempts {
	return newAttempts(n, attemptsSent.WithLabelValues("test", "test"))
}

func goExchange(p *pipeline, r *dns.Msg) <-chan exchangeResult {
	return goExchangeCtx(context.Background(), p, r)
}

func goExchangeCtx(ctx context.Context, p *pipeline, r *dns.Msg) <-chan exchangeResult {
	out := make(chan exchangeResult, 1)
	go func() {
		m, err := exchange(ctx, p, r)
		out <- exchangeResult{m, err}
	}()
	return out
}

// openPipeline returns a pipeline to s with its connection up, whose stalled queries only wait.
func openPipeline(t *testing.T, s *frameServer) *pipeline {
	t.Helper()
	return openPipelineTo(t, newPipeline(s.addr(), time.Hour, nil, "test"))
}

// openPipelineTo brings p's first connection up and closes p at the end of the test.
func openPipelineTo(t *testing.T, p *pipeline) *pipeline {
	t.Helper()
	t.Cleanup(p.close)
	if _, _, err := p.conn(); err != nil {
		t.Fatal(err)
	}
	return p
}

// takingConn returns p's connection that takes new queries, opening one if there is none.
func takingConn(t *testing.T, p *pipeline) *pipeConn {
	t.Helper()
	c, _, err := p.conn()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// sendOn queues a query for name on c and returns what waiting for its answer takes. Tests that need
// several queries on one connection queue them all before any waits: a query alone on a connection for
// stallAfter retires it.
func sendOn(t *testing.T, c *pipeConn, name string) func() exchangeResult {
	t.Helper()
	wait := sendMsgOn(t, c, aQuery(name, 0))
	return func() exchangeResult { return wait(context.Background()) }
}

// sendMsgOn queues r on c and returns what waiting for its answer, until ctx ends, takes.
func sendMsgOn(t *testing.T, c *pipeConn, r *dns.Msg) func(ctx context.Context) exchangeResult {
	t.Helper()
	return sendQueryOn(t, c, r, &pipeQuery{done: make(chan *dns.Msg, 1)})
}

// sendQueryOn is sendMsgOn with the pipeQuery q.
func sendQueryOn(t *testing.T, c *pipeConn, r *dns.Msg, q *pipeQuery) func(ctx context.Context) exchangeResult {
	t.Helper()
	packed, err := r.Pack()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	id, err := c.enqueue(context.Background(), q, packed)
	if err != nil {
		t.Fatalf("%s: %v", r.Question[0].Name, err)
	}
	return func(ctx context.Context) exchangeResult {
		m, err := c.wait(ctx, q, id, start, &test.ResponseWriter{TCP: true}, r, testAttempts(defaultMaxAttempts))
		return exchangeResult{m, err}
	}
}

// TestPipelineMatchesAnswersByID answers two queries on one connection in the reverse order: each gets
// its own answer.
func TestPipelineMatchesAnswersByID(t *testing.T) {
	s := newFrameServer(t)
	p := openPipeline(t, s)
	c := takingConn(t, p)
	waits := map[string]func() exchangeResult{
		"first.example.":  sendOn(t, c, "first.example."),
		"second.example.": sendOn(t, c, "second.example."),
	}
	f1, f2 := s.next(t), s.next(t)
	if f1.msg.Id == f2.msg.Id {
		t.Fatalf("both queries went out with ID %d", f1.msg.Id)
	}
	reply(t, f2)
	reply(t, f1)
	// Both answers read before anyone waits, so that neither query can give up for lack of progress.
	waitFor(t, waitLimit, "both answers read", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.answers == 2
	})
	for name, wait := range waits {
		r := wait()
		if r.err != nil {
			t.Fatalf("%s: %v", name, r.err)
		}
		if r.m.Question[0].Name != name {
			t.Errorf("%s: got the answer for %s", name, r.m.Question[0].Name)
		}
	}
}

// TestPipelineCountsInTheProxySeries checks that the pipelined queries are counted in CoreDNS's proxy
// series, under the labels forward gives its own: each answer's duration by its rcode (an extended one by
// its number), each query sent on an open connection and each connection opened.
func TestPipelineCountsInTheProxySeries(t *testing.T) {
	s := newFrameServer(t)
	p := openPipeline(t, s) // one connection opened
	rcodes := []int{dns.RcodeSuccess, dns.RcodeNameError, dns.RcodeSuccess, dns.RcodeRefused, 24, 24}
	for i, rcode := range rcodes {
		out := goExchange(p, aQuery("counted.example.", uint16(i)))
		f := s.next(t)
		m := new(dns.Msg)
		m.SetRcode(f.msg, rcode)
		if rcode > 0xf {
			m.SetEdns0(dns.DefaultMsgSize, false) // the upper bits of the rcode
		}
		writeFrame(t, f.conn, m)
		select {
		case r := <-out:
			if r.err != nil {
				t.Fatalf("query %d: %v", i, r.err)
			}
			if r.m.Rcode != rcode {
				t.Fatalf("query %d: rcode %d, want %d", i, r.m.Rcode, rcode)
			}
		case <-time.After(waitLimit):
			t.Fatalf("query %d: no answer", i)
		}
	}
	want := map[string]uint64{"NOERROR": 2, "NXDOMAIN": 1, "REFUSED": 1, "24": 2}
	for rc, n := range want {
		var m dto.Metric
		if err := proxyRequestDuration.WithLabelValues(proxyName, s.addr(), rc).(prometheus.Histogram).Write(&m); err != nil {
			t.Fatal(err)
		}
		if got := m.GetHistogram().GetSampleCount(); got != n {
			t.Errorf("request_duration_seconds{rcode=%q}: %d answers, want %d", rc, got, n)
		}
	}
	// Whether a query went on an open connection or opened one depends on the machine's pace (a query that
	// waits stallAfter retires its connection), so each is counted here once, directly.
	counts := func() (opened, reused float64) {
		var o, r dto.Metric
		if err := proxyConnCacheMisses.WithLabelValues(proxyName, s.addr(), "tcp").Write(&o); err != nil {
			t.Fatal(err)
		}
		if err := proxyConnCacheHits.WithLabelValues(proxyName, s.addr(), "tcp").Write(&r); err != nil {
			t.Fatal(err)
		}
		return o.GetCounter().GetValue(), r.GetCounter().GetValue()
	}
	for _, reused := range []bool{true, false} {
		o0, r0 := counts()
		p.countConn(reused)
		o1, r1 := counts()
		if want := map[bool][2]float64{true: {0, 1}, false: {1, 0}}[reused]; o1-o0 != want[0] || r1-r0 != want[1] {
			t.Errorf("countConn(%v) added %v to conn_cache_misses_total and %v to conn_cache_hits_total, want %v", reused, o1-o0, r1-r0, want)
		}
	}
}

// TestPipelineWritesQueuedQueriesAtOnce queues three queries while a write is under way: the writer sends
// them in one write.
func TestPipelineWritesQueuedQueriesAtOnce(t *testing.T) {
	s := newFrameServer(t)
	p := openPipeline(t, s)
	c := takingConn(t, p)
	c.mu.Lock()
	c.writing = true // as while a writer is at it
	c.mu.Unlock()
	var sizes []int
	for i := range 3 {
		packed, err := aQuery("q.example.", uint16(i)).Pack()
		if err != nil {
			t.Fatal(err)
		}
		sizes = append(sizes, 2+len(packed))
		if _, err := c.enqueue(context.Background(), &pipeQuery{done: make(chan *dns.Msg, 1)}, packed); err != nil {
			t.Fatal(err)
		}
	}
	c.flush()
	want := sizes[0] + sizes[1] + sizes[2]
	for range 3 {
		if f := s.next(t); f.read != want {
			t.Errorf("a query came in a read of %d bytes, want the three queries' %d", f.read, want)
		}
	}
}

// TestPipelineLeavesAHeldUpConnection holds the answer to a query: the connection takes no new queries
// once a query behind the held one has waited without an answer, a new connection takes the next query,
// and the held query and the one behind it (which only waits, with no proxy to send it once more) get
// their answers once they come.
func TestPipelineLeavesAHeldUpConnection(t *testing.T) {
	s := newFrameServer(t)
	p := openPipeline(t, s)
	c := takingConn(t, p)
	// Both queued before either waits, so that both are on the held-up connection.
	waitHeld := sendOn(t, c, "slow.example.")
	waitBehind := sendOn(t, c, "fast.example.")
	slow := s.next(t)
	behind := s.next(t) // the server reads the second query, and answers nothing before slow's answer
	held := make(chan exchangeResult, 1)
	go func() { held <- waitHeld() }()
	stalled := make(chan exchangeResult, 1)
	go func() { stalled <- waitBehind() }()
	waitFor(t, waitLimit, "the held-up connection to take no new queries", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.retired
	})
	// A new connection takes the next queries.
	if n, _, err := p.conn(); err != nil || n == c {
		t.Fatalf("after the held-up connection: %v, the same connection %v", err, n == c)
	}
	next := goExchange(p, aQuery("next.example.", 3))
	f := s.next(t)
	if f.conn == slow.conn {
		t.Fatal("a new query went on the held-up connection")
	}
	reply(t, f)
	if r := <-next; r.err != nil {
		t.Fatalf("the query on the new connection: %v", r.err)
	}
	reply(t, slow)
	reply(t, behind)
	if r := <-held; r.err != nil || r.m.Question[0].Name != "slow.example." {
		t.Fatalf("the held query: %v, %v", r.m, r.err)
	}
	if r := <-stalled; r.err != nil || r.m.Question[0].Name != "fast.example." {
		t.Fatalf("the query behind the held one: %v, %v", r.m, r.err)
	}
}

// TestPipelineConnectionClosed closes the connection under a waiting query: the query gives up, and the
// next query goes on a new connection.
func TestPipelineConnectionClosed(t *testing.T) {
	s := newFrameServer(t)
	p := openPipeline(t, s)
	first := goExchange(p, aQuery("first.example.", 1))
	f := s.next(t)
	f.conn.Close()
	if r := <-first; !errors.Is(r.err, errPipeClosed) {
		t.Fatalf("got %v, %v; want %v", r.m, r.err, errPipeClosed)
	}
	// The closed connection is forgotten once its reader saw the close. The deadline only bounds a failure.
	waitFor(t, waitLimit, "a new connection", func() bool {
		_, reused, err := p.conn()
		return err == nil && !reused
	})
	second := goExchange(p, aQuery("second.example.", 2))
	reply(t, s.next(t))
	if r := <-second; r.err != nil {
		t.Fatal(r.err)
	}
}

// TestPipelineClose ends the queries waiting when the upstream is stopped.
func TestPipelineClose(t *testing.T) {
	s := newFrameServer(t)
	p := openPipeline(t, s)
	waiting := goExchange(p, aQuery("q.example.", 1))
	s.next(t)
	p.close()
	if r := <-waiting; !errors.Is(r.err, errPipeClosed) {
		t.Fatalf("got %v, %v; want %v", r.m, r.err, errPipeClosed)
	}
	if _, err := exchange(context.Background(), p, aQuery("q.example.", 2)); !errors.Is(err, errPipeUnavailable) {
		t.Fatalf("after close: %v, want %v", err, errPipeUnavailable)
	}
}

// TestSlowAnswerHoldsNoQueryUp holds the answer to one name at the upstream: a query for another name,
// sent after it over the same pipelined connection, is answered while that answer is held (sent once more
// through forward's proxy once it stalls there), and the held query gets its answer once it comes.
func TestSlowAnswerHoldsNoQueryUp(t *testing.T) {
	up, err := listenUpstream("127.0.0.1", 0, net.IPv4(192, 0, 2, 1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(up.Close)
	arrived := make(chan struct{}, 1)
	release := make(chan struct{})
	var holding atomic.Bool // only the first counted query is held
	up.setHold(func() {
		if holding.CompareAndSwap(false, true) {
			arrived <- struct{}{}
			<-release
		}
	})

	u := New(Config{Service: defaultService, Namespace: defaultNamespace, Expire: defaultExpire, HealthCheck: defaultHealthCheck})
	u.initial = upstreamSet{addrs: []string{up.tcp.Listener.Addr().String()}, source: sourceFallback}
	if err := u.OnStartup(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { u.OnShutdown() })
	if _, _, err := u.current.Load().pipes[0].conn(); err != nil {
		t.Fatal(err)
	}
	before := pipelinedQueries(t)

	held := make(chan *dnstest.Recorder, 1)
	go func() {
		rec := dnstest.NewRecorder(&test.ResponseWriter{})
		u.ServeDNS(context.Background(), rec, new(dns.Msg).SetQuestion("slow.example.org.", dns.TypeA))
		held <- rec
	}()
	<-arrived
	rec := dnstest.NewRecorder(&test.ResponseWriter{})
	if rcode, err := u.ServeDNS(context.Background(), rec, new(dns.Msg).SetQuestion("fast.example.org.", dns.TypeA)); err != nil || rcode != dns.RcodeSuccess || rec.Msg == nil || len(rec.Msg.Answer) != 1 {
		t.Fatalf("a query while another's answer is held: rcode %d, %v, %v", rcode, err, rec.Msg)
	}
	close(release)
	if rec := <-held; rec.Msg == nil || len(rec.Msg.Answer) != 1 || rec.Msg.Question[0].Name != "slow.example.org." {
		t.Fatalf("the held query: %v", rec.Msg)
	}
	// The held query went over the pipelined connection (the other went there too and was sent once more
	// through forward's proxy, or found the connection retired by then and went to forward directly).
	if n := pipelinedQueries(t) - before; n < 1 {
		t.Errorf("%v queries sent on the pipelined connection, want at least the held one", n)
	}
}

// pipelinedQueries sums coredns_proxy_conn_cache_hits_total for upstreamsvc: forward's queries on a
// connection it had, and every query sent on a pipelined connection.
func pipelinedQueries(t *testing.T) float64 {
	t.Helper()
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() != "coredns_proxy_conn_cache_hits_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "proxy_name" && l.GetValue() == proxyName {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return n
}
