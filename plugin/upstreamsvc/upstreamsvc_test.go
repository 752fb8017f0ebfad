package upstreamsvc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/coredns/coredns/plugin/metadata"
	"github.com/coredns/coredns/plugin/pkg/dnstest"
	"github.com/coredns/coredns/plugin/test"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// TestMaxConcurrent holds one query at a slow upstream and checks that the next one is refused.
func TestMaxConcurrent(t *testing.T) {
	arrived := make(chan struct{}, 1)
	release := make(chan struct{})
	up, err := listenUpstream("127.0.0.1", 0, net.IPv4(192, 0, 2, 1))
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	up.setHold(func() {
		arrived <- struct{}{}
		<-release
	})

	u := New(Config{Service: defaultService, Namespace: defaultNamespace, MaxConcurrent: 1, Expire: defaultExpire, HealthCheck: defaultHealthCheck})
	u.initial = upstreamSet{addrs: []string{up.tcp.Listener.Addr().String()}, source: sourceFallback}
	if err := u.OnStartup(); err != nil {
		t.Fatal(err)
	}
	defer u.OnShutdown()

	first := make(chan int, 1)
	go func() {
		rec := dnstest.NewRecorder(&test.ResponseWriter{})
		rcode, _ := u.ServeDNS(context.Background(), rec, new(dns.Msg).SetQuestion("slow.example.org.", dns.TypeA))
		first <- rcode
	}()
	select {
	case <-arrived:
	case <-time.After(5 * time.Second):
		t.Fatal("first query never reached the upstream")
	}

	rejectsBefore := counterSum(maxConcurrentRejects)
	rcode, err := u.ServeDNS(context.Background(), dnstest.NewRecorder(&test.ResponseWriter{}), new(dns.Msg).SetQuestion("second.example.org.", dns.TypeA))
	if rcode != dns.RcodeRefused || err == nil {
		t.Errorf("second query: rcode %d, err %v; want REFUSED with an error", rcode, err)
	}
	if n := counterSum(maxConcurrentRejects) - rejectsBefore; n != 1 {
		t.Errorf("max_concurrent_rejects_total grew by %.0f, want 1", n)
	}
	close(release)
	if rcode := <-first; rcode != dns.RcodeSuccess {
		t.Errorf("first query: rcode %d, want NOERROR", rcode)
	}
}

// TestSwitchKeepsInflightQuery replaces the upstream while a query waits at the old one: the query
// must still be answered, and the next query must go to the new upstream.
func TestSwitchKeepsInflightQuery(t *testing.T) {
	arrived := make(chan struct{}, 1)
	release := make(chan struct{})
	old, next, port := upstreamPair(t)
	old.setHold(func() {
		arrived <- struct{}{}
		<-release
	})
	oldAddr, nextAddr := fmt.Sprintf("127.0.0.1:%d", port), fmt.Sprintf("127.0.0.2:%d", port)

	u := New(Config{Service: defaultService, Namespace: defaultNamespace, Expire: defaultExpire, HealthCheck: defaultHealthCheck})
	u.initial = upstreamSet{addrs: []string{oldAddr}, source: sourceFallback}
	if err := u.OnStartup(); err != nil {
		t.Fatal(err)
	}
	defer u.OnShutdown()
	oldUpstream := u.current.Load()

	answer := make(chan *dns.Msg, 1)
	go func() {
		rec := dnstest.NewRecorder(&test.ResponseWriter{})
		u.ServeDNS(context.Background(), rec, new(dns.Msg).SetQuestion("inflight.example.org.", dns.TypeA))
		answer <- rec.Msg
	}()
	select {
	case <-arrived:
	case <-time.After(5 * time.Second):
		t.Fatal("query never reached the old upstream")
	}

	u.switchTo(upstreamSet{addrs: []string{nextAddr}, source: sourceAPI})
	if !oldUpstream.retired.Load() || oldUpstream.inflight.Load() != 1 {
		t.Fatalf("old upstream: retired %v, %d in flight; want retired with the held query", oldUpstream.retired.Load(), oldUpstream.inflight.Load())
	}
	rec := dnstest.NewRecorder(&test.ResponseWriter{})
	u.ServeDNS(context.Background(), rec, new(dns.Msg).SetQuestion("new.example.org.", dns.TypeA))
	if rec.Msg == nil || len(rec.Msg.Answer) != 1 || !rec.Msg.Answer[0].(*dns.A).A.Equal(net.IPv4(192, 0, 2, 2)) {
		t.Errorf("query after the switch: %v, want 192.0.2.2", rec.Msg)
	}

	close(release)
	select {
	case m := <-answer:
		if m == nil || len(m.Answer) != 1 || !m.Answer[0].(*dns.A).A.Equal(net.IPv4(192, 0, 2, 1)) {
			t.Errorf("in-flight query: %v, want 192.0.2.1 from the old upstream", m)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("in-flight query never returned")
	}
	if next.queries() != 1 {
		t.Errorf("new upstream got %d queries, want 1", next.queries())
	}
	if oldUpstream.inflight.Load() != 0 {
		t.Errorf("old upstream still has %d queries in flight", oldUpstream.inflight.Load())
	}
}

// TestFailFastWhileUpstreamDown stops the upstream: once its health checks have failed, queries get
// SERVFAIL without a connection attempt, and once it answers again they are forwarded again, with no
// restart.
func TestFailFastWhileUpstreamDown(t *testing.T) {
	marker := net.IPv4(192, 0, 2, 1)
	up, err := listenUpstream("127.0.0.1", 0, marker)
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	addr := up.tcp.Listener.Addr().String()
	port := up.tcp.Listener.Addr().(*net.TCPAddr).Port

	u := New(Config{Service: defaultService, Namespace: defaultNamespace, Expire: defaultExpire, HealthCheck: 20 * time.Millisecond})
	u.initial = upstreamSet{addrs: []string{addr}, source: sourceFallback}
	if err := u.OnStartup(); err != nil {
		t.Fatal(err)
	}
	defer u.OnShutdown()
	serve := func(name string) (*dns.Msg, int, error) {
		rec := dnstest.NewRecorder(&test.ResponseWriter{})
		rcode, err := u.ServeDNS(context.Background(), rec, new(dns.Msg).SetQuestion(name, dns.TypeA))
		return rec.Msg, rcode, err
	}
	if m, _, err := serve("before.example.org."); err != nil || m == nil || len(m.Answer) != 1 {
		t.Fatalf("before the outage: %v, %v", m, err)
	}

	up.Close()
	// The first query after the outage goes to forward; its failed connection starts the health checks.
	if m, rcode, err := serve("first.example.org."); rcode != dns.RcodeServerFailure || err == nil || m != nil {
		t.Fatalf("first query of the outage: rcode %d, err %v, reply %v; want SERVFAIL with an error", rcode, err, m)
	}
	current := u.current.Load()
	waitFor(t, waitLimit, "the upstream's health checks to fail", current.down)

	before := counterSum(failFasts)
	m, rcode, err := serve("unknown.example.org.")
	if rcode != dns.RcodeServerFailure || !errors.Is(err, errAllDown) || m != nil {
		t.Errorf("while down: rcode %d, err %v, reply %v; want SERVFAIL and %v, nothing written", rcode, err, m, errAllDown)
	}
	if n := counterSum(failFasts) - before; n != 1 {
		t.Errorf("failfast_total grew by %.0f, want 1", n)
	}
	if n := current.inflight.Load(); n != 0 {
		t.Errorf("%d queries still hold the upstream", n)
	}

	back, err := listenUpstream("127.0.0.1", port, marker)
	if err != nil {
		t.Fatalf("restarting the upstream on %s: %v", addr, err)
	}
	defer back.Close()
	waitFor(t, waitLimit, "a health check to succeed", func() bool { return !current.down() })
	if m, _, err := serve("after.example.org."); err != nil || m == nil || len(m.Answer) != 1 {
		t.Errorf("after the outage: %v, %v", m, err)
	}
	if back.queries() != 1 {
		t.Errorf("the restarted upstream got %d queries, want 1", back.queries())
	}
}

// TestPipelinedQuerySetsForwardUpstream answers a query over the pipelined connection: forward's
// forward/upstream metadata names the address it went to, as forward sets it for the queries it sends.
func TestPipelinedQuerySetsForwardUpstream(t *testing.T) {
	s := newFrameServer(t)
	u := startUpstreamSvc(t, s.addr())
	up := u.current.Load()
	c, _, err := up.pipes[0].conn()
	if err != nil {
		t.Fatal(err)
	}
	ctx := metadata.ContextWithMetadata(context.Background())
	done := make(chan int, 1)
	go func() {
		rcode, _ := u.ServeDNS(ctx, dnstest.NewRecorder(&test.ResponseWriter{}), new(dns.Msg).SetQuestion("q.example.org.", dns.TypeA))
		done <- rcode
	}()
	f := s.next(t)
	if f.conn.LocalAddr().String() != c.c.RemoteAddr().String() || f.conn.RemoteAddr().String() != c.c.LocalAddr().String() {
		t.Fatal("the query did not come on the pipelined connection")
	}
	reply(t, f)
	if rcode := <-done; rcode != dns.RcodeSuccess {
		t.Fatalf("rcode %d", rcode)
	}
	v := metadata.ValueFunc(ctx, "forward/upstream")
	if v == nil {
		t.Fatal("no forward/upstream metadata")
	}
	if got, want := v(), up.proxies[0].Addr(); got != want {
		t.Errorf("forward/upstream is %q, want %q", got, want)
	}
}

// TestChangesExportedAtZero checks upstream_changes_total has the block's series from the first upstream on,
// at zero: a dashboard of a node whose upstream never moved shows no changes rather than no data.
func TestChangesExportedAtZero(t *testing.T) {
	const namespace = "changes-at-zero"
	u := New(Config{Service: defaultService, Namespace: namespace, Expire: defaultExpire, HealthCheck: defaultHealthCheck})
	u.initial = upstreamSet{addrs: []string{"127.0.0.1:53"}, source: sourceFallback}
	if err := u.OnStartup(); err != nil {
		t.Fatal(err)
	}
	defer u.OnShutdown()

	ch := make(chan prometheus.Metric, 64)
	go func() { upstreamChanges.Collect(ch); close(ch) }()
	var found []float64
	for m := range ch {
		var pb dto.Metric
		if m.Write(&pb) != nil {
			continue
		}
		for _, l := range pb.Label {
			if l.GetName() == "namespace" && l.GetValue() == namespace {
				found = append(found, pb.Counter.GetValue())
			}
		}
	}
	if len(found) != 1 || found[0] != 0 {
		t.Errorf("upstream_changes_total of namespace %s: %v, want one series at 0", namespace, found)
	}
}
