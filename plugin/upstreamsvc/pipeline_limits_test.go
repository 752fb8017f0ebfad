package upstreamsvc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/coredns/coredns/plugin/pkg/dnstest"
	"github.com/coredns/coredns/plugin/pkg/proxy"
	"github.com/coredns/coredns/plugin/pkg/transport"
	"github.com/coredns/coredns/plugin/test"

	"github.com/miekg/dns"
)

// TestPipelineLateAnswerAfterWrap gives up on a query through its context, brings the ID counter round to
// that query's ID (as 65536 queries later), and sends a query for the same name with other flags. The
// upstream then answers the query given up on, late, before the new one: the late answer must not be
// served to the new query.
func TestPipelineLateAnswerAfterWrap(t *testing.T) {
	s := newFrameServer(t)
	p := openPipeline(t, s)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var (
		c    *pipeConn
		late frame
	)
	// On a busy machine the query can wait stallAfter before it sees its context ended, and retire its
	// connection: then it is tried again on a new one.
	for attempt := 0; c == nil || c.isRetired(); attempt++ {
		if attempt == 10 {
			t.Fatal("every connection was retired")
		}
		var err error
		if c, _, err = p.conn(); err != nil {
			t.Fatal(err)
		}
		waitGiven := sendMsgOn(t, c, aQuery("name.example.", 1))
		late = s.next(t)
		if r := waitGiven(ctx); !errors.Is(r.err, context.Canceled) {
			t.Fatalf("the query given up on: %v, %v; want %v", r.m, r.err, context.Canceled)
		}
	}
	c.mu.Lock()
	c.nextID = late.msg.Id // the counter wrapped
	c.mu.Unlock()
	q := aQuery("name.example.", 2)
	q.CheckingDisabled = true
	waitNext := sendMsgOn(t, c, q)
	f := s.next(t)
	replyWith(t, late, net.IPv4(192, 0, 2, 66))
	reply(t, f)
	r := waitNext(context.Background())
	if r.err != nil {
		t.Fatal(r.err)
	}
	if a, ok := r.m.Answer[0].(*dns.A); !ok || !a.A.Equal(net.IPv4(192, 0, 2, 9)) || !r.m.CheckingDisabled {
		t.Fatalf("the new query (wire ID %d) was served the late answer to the query given up on (wire ID %d): %v",
			f.msg.Id, late.msg.Id, r.m)
	}
}

// TestPipelineKeepsOnlyAnsweredQueries: a query's pipeQuery, with its channel, is kept for a later query
// once its answer was received, and only then. The answer to a query given up on may still be delivered to
// its channel (when the connection's reader took the query from the pending ones just before), and a query
// whose connection closed has its channel closed: reused, either would hand a later query the wrong answer,
// or none.
func TestPipelineKeepsOnlyAnsweredQueries(t *testing.T) {
	s := newFrameServer(t)
	p := openPipeline(t, s)
	c := takingConn(t, p)
	givenUp := &pipeQuery{done: make(chan *dns.Msg, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	waitGiven := sendQueryOn(t, c, aQuery("given-up.example.", 1), givenUp)
	late := s.next(t)
	if r := waitGiven(ctx); !errors.Is(r.err, context.Canceled) {
		t.Fatalf("the query given up on: %v, %v; want %v", r.m, r.err, context.Canceled)
	}
	reply(t, late)

	closed := &pipeQuery{done: make(chan *dns.Msg, 1)}
	waitClosed := sendQueryOn(t, c, aQuery("closed.example.", 2), closed)
	s.next(t).conn.Close()
	if r := waitClosed(context.Background()); !errors.Is(r.err, errPipeClosed) {
		t.Fatalf("the query on the connection closed: %v, %v; want %v", r.m, r.err, errPipeClosed)
	}

	for range 64 {
		switch got, _ := p.queries.Get().(*pipeQuery); got {
		case nil:
			return
		case givenUp:
			t.Fatal("the query given up on was kept for reuse, with the late answer in its channel")
		case closed:
			t.Fatal("the query whose connection closed was kept for reuse, with its channel closed")
		}
	}
}

// TestPipelineLateIDsBounded gives up on maxLateIDs queries whose answers never come: the connection
// keeps their IDs taken until then, and takes no new queries once it holds that many.
func TestPipelineLateIDsBounded(t *testing.T) {
	s := newFrameServer(t)
	drainFrames(t, s)
	p := openPipeline(t, s)
	c := takingConn(t, p)
	packed, err := aQuery("late.example.", 0).Pack()
	if err != nil {
		t.Fatal(err)
	}
	for i := range maxLateIDs {
		q := &pipeQuery{done: make(chan *dns.Msg, 1)}
		id, err := c.enqueue(context.Background(), q, packed)
		if err != nil {
			t.Fatalf("query %d: %v", i, err)
		}
		c.forget(id, q, false) // as a query whose context ended
		c.mu.Lock()
		late, retired := len(c.late), c.retired
		c.mu.Unlock()
		// Once retired with nothing pending, the connection closes and forgets the IDs.
		if retired != (i+1 == maxLateIDs) || !retired && late != i+1 {
			t.Fatalf("after %d queries given up on: %d IDs kept, retired %v", i+1, late, retired)
		}
	}
	if n, _, err := p.conn(); err != nil || n == c {
		t.Fatalf("after %d IDs kept: %v, the same connection %v", maxLateIDs, err, n == c)
	}
}

// isRetired reports whether c takes no new queries.
func (c *pipeConn) isRetired() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.retired
}

// drainFrames reads the server's queries for the rest of the test and answers none.
func drainFrames(t *testing.T, s *frameServer) {
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	go func() {
		for {
			select {
			case <-s.frames:
			case <-stop:
				return
			}
		}
	}()
}

// gateIO holds every write on a connection until open is closed.
type gateIO struct {
	streamIO
	writing chan struct{} // receives when a write waits at the gate
	open    chan struct{}
}

func (g *gateIO) Write(b []byte) (int, error) {
	select {
	case g.writing <- struct{}{}:
	default:
	}
	<-g.open
	return g.streamIO.Write(b)
}

// bigQuery is an A query padded to about 4 KiB.
func bigQuery(name string) *dns.Msg {
	m := aQuery(name, 0)
	m.SetEdns0(4096, false)
	opt := m.IsEdns0()
	opt.Option = append(opt.Option, &dns.EDNS0_PADDING{Padding: make([]byte, 4000)})
	return m
}

// TestPipelineWriteBufferBounded holds a write on the connection: the queries that come meanwhile queue
// no more than pipeWriteBuffer bytes, those that find no room wait (giving up through their context), and
// a query that waited goes out once the write goes through. The queries are queued without waiting for
// their answers, so that none retires the connection.
func TestPipelineWriteBufferBounded(t *testing.T) {
	s := newFrameServer(t)
	gate := &gateIO{writing: make(chan struct{}, 1), open: make(chan struct{})}
	p := newPipeline(s.addr(), time.Hour, nil, "test")
	p.newIO = func(nc net.Conn) (streamIO, error) {
		sio, err := newStreamIO(nc)
		gate.streamIO = sio
		return gate, err
	}
	openPipelineTo(t, p)
	c := takingConn(t, p)
	enqueue := func(ctx context.Context, m *dns.Msg) error {
		packed, err := m.Pack()
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.enqueue(ctx, &pipeQuery{done: make(chan *dns.Msg, 1)}, packed)
		return err
	}
	first := make(chan error, 1)
	go func() { first <- enqueue(context.Background(), aQuery("first.example.", 1)) }()
	<-gate.writing
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	refused := 0
	for range 4 * pipeWriteBuffer / 4000 {
		err := enqueue(ctx, bigQuery("big.example."))
		c.mu.Lock()
		queued := len(c.wbuf)
		c.mu.Unlock()
		if queued > pipeWriteBuffer {
			t.Fatalf("%d bytes queued behind a held write, want at most %d", queued, pipeWriteBuffer)
		}
		switch {
		case errors.Is(err, context.Canceled):
			refused++
		case err != nil:
			t.Fatalf("a query while the write is held: %v", err)
		}
	}
	if refused == 0 {
		t.Fatal("no query waited for room in the write buffer")
	}
	waiting := make(chan error, 1)
	go func() { waiting <- enqueue(context.Background(), bigQuery("waiting.example.")) }()
	close(gate.open)
	for _, ch := range []chan error{first, waiting} {
		if err := <-ch; err != nil {
			t.Fatal(err)
		}
	}
	for {
		if f := s.next(t); f.msg.Question[0].Name == "waiting.example." {
			break
		}
	}
}

// resenderTo returns forward's proxy to addr over TCP, as upstreamsvc builds it.
func resenderTo(t *testing.T, addr string) *lazyProxy {
	t.Helper()
	px := proxy.NewProxy(proxyName, addr, transport.DNS)
	px.GetHealthchecker().SetTCPTransport()
	t.Cleanup(px.Stop)
	return newLazyProxy(px, defaultHealthCheck)
}

// TestStalledResendsBounded holds every answer while many queries wait behind a slow one on a connection:
// each stalls, maxStallResends of them are sent once more (the upstream reads them on connections of
// their own), and no other is while those are under way. When the connection then closes, the queries
// sent once more wait for those copies' answers, the others fail for good (their caller sends them no
// more), and the slow query, which did not stall, fails to be sent with forward.
func TestStalledResendsBounded(t *testing.T) {
	s := newFrameServer(t)
	p := openPipelineTo(t, newPipeline(s.addr(), time.Hour, resenderTo(t, s.addr()), "test"))
	c := takingConn(t, p)
	const behind = maxStallResends + 8
	stallsBefore, resendsBefore := counterSum(stalls), counterSum(stallResends)
	// All queued before any waits, so that all are on the connection behind the slow one.
	waits := map[string]func() exchangeResult{"slow.example.": sendOn(t, c, "slow.example.")}
	for i := range behind {
		name := fmt.Sprintf("q%d.example.", i)
		waits[name] = sendOn(t, c, name)
	}
	var pipelined []frame
	for range len(waits) {
		pipelined = append(pipelined, s.next(t))
	}
	results := make(map[string]chan exchangeResult)
	for name, wait := range waits {
		out := make(chan exchangeResult, 1)
		results[name] = out
		go func() { out <- wait() }()
	}

	resent := map[string]frame{}
	deadline := time.After(waitLimit)
	poll := time.NewTicker(20 * time.Millisecond)
	defer poll.Stop()
	for len(resent) <= maxStallResends && (len(resent) < maxStallResends || counterSum(stalls)-stallsBefore < behind) {
		select {
		case f := <-s.frames:
			if f.conn == pipelined[0].conn {
				t.Fatalf("a query came again on the pipelined connection: %v", f.msg.Question)
			}
			resent[f.msg.Question[0].Name] = f
		case <-poll.C:
		case <-deadline:
			t.Fatalf("timed out: %d queries sent once more, %.0f stalled", len(resent), counterSum(stalls)-stallsBefore)
		}
	}
	if len(resent) != maxStallResends {
		t.Errorf("%d of %d stalled queries sent once more at the same time, want %d", len(resent), behind, maxStallResends)
	}
	if n := counterSum(stallResends) - resendsBefore; n != maxStallResends {
		t.Errorf("stall_resends_total grew by %.0f, want %d", n, maxStallResends)
	}

	pipelined[0].conn.Close()
	for name, ch := range results {
		if _, ok := resent[name]; ok {
			continue
		}
		want := errPipeStalled
		if name == "slow.example." {
			want = errPipeClosed
		}
		if r := <-ch; !errors.Is(r.err, want) {
			t.Errorf("%s: %v, %v; want %v", name, r.m, r.err, want)
		}
	}
	for name, f := range resent {
		reply(t, f)
		if r := <-results[name]; r.err != nil || r.m.Question[0].Name != name {
			t.Errorf("%s: %v, %v", name, r.m, r.err)
		}
	}
	waitFor(t, waitLimit, "the copies sent once more to return", func() bool { return len(p.resends) == 0 })
}

// startUpstreamSvc starts a handler forwarding to addr, with its pipelined connection up.
func startUpstreamSvc(t *testing.T, addr string) *UpstreamSvc {
	t.Helper()
	u := New(Config{Service: defaultService, Namespace: defaultNamespace, Expire: defaultExpire, HealthCheck: defaultHealthCheck})
	u.initial = upstreamSet{addrs: []string{addr}, source: sourceFallback}
	if err := u.OnStartup(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { u.OnShutdown() })
	if _, _, err := u.current.Load().pipes[0].conn(); err != nil {
		t.Fatal(err)
	}
	return u
}

type served struct {
	rcode int
	err   error
	msg   *dns.Msg
}

// stallBehind sends a query for slow and one for stalled through u, and returns them and the frames
// s read for them, both on one pipelined connection. On a busy machine the slow query can retire its
// connection (it waits stallAfter alone there) before the other is sent; then both are answered, and tried
// again.
func stallBehind(t *testing.T, s *frameServer, u *UpstreamSvc, slow, stalled string) (fSlow, fStalled frame, slowc, stalledc <-chan served) {
	t.Helper()
	for range 10 {
		slowc = goServe(u, slow)
		fSlow = s.next(t)
		stalledc = goServe(u, stalled)
		fStalled = s.next(t)
		if fStalled.conn == fSlow.conn {
			return fSlow, fStalled, slowc, stalledc
		}
		reply(t, fSlow)
		reply(t, fStalled)
		<-slowc
		<-stalledc
	}
	t.Fatal("the second query never went on the first one's connection")
	return
}

func goServe(u *UpstreamSvc, name string) <-chan served {
	out := make(chan served, 1)
	go func() {
		rec := dnstest.NewRecorder(&test.ResponseWriter{TCP: true})
		rcode, err := u.ServeDNS(context.Background(), rec, new(dns.Msg).SetQuestion(name, dns.TypeA))
		out <- served{rcode, err, rec.Msg}
	}()
	return out
}

// TestStalledQuerySentOnceMore holds the answer to a query, so that a query behind it on the pipelined
// connection stalls, and fails every other connection the stalled query comes on: it is sent once more,
// and no more, and gets its answer on the pipelined connection once it comes.
func TestStalledQuerySentOnceMore(t *testing.T) {
	s := newFrameServer(t)
	u := startUpstreamSvc(t, s.addr())
	fSlow, fStalled, slow, stalled := stallBehind(t, s, u, "slow.example.org.", "stalled.example.org.")
	sent := 0 // the stalled query's copies on other connections
	for {
		select {
		case f := <-s.frames:
			switch name := f.msg.Question[0].Name; {
			case name == ".": // forward's health check
				reply(t, f)
			case name != "stalled.example.org." || f.conn == fSlow.conn:
				t.Fatalf("unexpected query %s", name)
			default:
				sent++
				f.conn.Close()
				if sent == 1 {
					reply(t, fSlow)
					reply(t, fStalled)
				}
			}
		case r := <-stalled:
			if sent != 1 {
				t.Errorf("the stalled query was sent %d more times, want 1", sent)
			}
			if r.err != nil || r.rcode != dns.RcodeSuccess || r.msg == nil || len(r.msg.Answer) != 1 {
				t.Errorf("the stalled query: rcode %d, %v, %v", r.rcode, r.err, r.msg)
			}
			if r := <-slow; r.err != nil || r.msg == nil || len(r.msg.Answer) != 1 {
				t.Errorf("the slow query: %v, %v", r.err, r.msg)
			}
			return
		case <-time.After(waitLimit):
			t.Fatalf("timed out: the stalled query was sent %d more times", sent)
		}
	}
}

// TestStalledQueryFailsOnce holds the answer to a query, so that a query behind it stalls, fails the
// connection that query is sent once more on, then closes the pipelined connection: the stalled query is
// answered SERVFAIL, and never sent a third time.
func TestStalledQueryFailsOnce(t *testing.T) {
	s := newFrameServer(t)
	u := startUpstreamSvc(t, s.addr())
	fSlow, _, slow, stalled := stallBehind(t, s, u, "slow.example.org.", "stalled.example.org.")
	sent := 0 // the stalled query's copies on other connections
	for stalled != nil || slow != nil {
		select {
		case f := <-s.frames:
			switch name := f.msg.Question[0].Name; {
			case name == ".": // forward's health check
				reply(t, f)
			case name == "slow.example.org.": // forward carries the slow query once the connection closed
				reply(t, f)
			case name != "stalled.example.org." || f.conn == fSlow.conn:
				t.Fatalf("unexpected query %s", name)
			default:
				sent++
				f.conn.Close()
				if sent == 1 {
					fSlow.conn.Close()
				}
			}
		case r := <-stalled:
			stalled = nil
			if sent != 1 {
				t.Errorf("the stalled query was sent %d more times, want 1", sent)
			}
			if r.rcode != dns.RcodeServerFailure || !errors.Is(r.err, errPipeStalled) {
				t.Errorf("the stalled query: rcode %d, %v; want SERVFAIL, %v", r.rcode, r.err, errPipeStalled)
			}
		case r := <-slow:
			slow = nil
			if r.err != nil || r.msg == nil || len(r.msg.Answer) != 1 {
				t.Errorf("the slow query: %v, %v", r.err, r.msg)
			}
		case <-time.After(waitLimit):
			t.Fatalf("timed out: the stalled query was sent %d more times", sent)
		}
	}
}
