package upstreamsvc

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/coredns/coredns/plugin/pkg/dnstest"
	"github.com/coredns/coredns/plugin/test"

	"github.com/miekg/dns"
)

// startUpstreamSvcWith starts a handler for cfg forwarding to addr, with its pipelined connection up unless
// it forwards over UDP.
func startUpstreamSvcWith(t *testing.T, cfg Config, addr string) *UpstreamSvc {
	t.Helper()
	cfg.Service, cfg.Namespace, cfg.Expire, cfg.HealthCheck = defaultService, defaultNamespace, defaultExpire, defaultHealthCheck
	u := New(cfg)
	u.initial = upstreamSet{addrs: []string{addr}, source: sourceFallback}
	if err := u.OnStartup(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { u.OnShutdown() })
	if pipes := u.current.Load().pipes; len(pipes) > 0 {
		if _, _, err := pipes[0].conn(); err != nil {
			t.Fatal(err)
		}
	}
	return u
}

// udpDropper reads UDP queries and answers none; it counts those for name on sent.
func udpDropper(t *testing.T, name string) (addr string, sent <-chan struct{}) {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	out := make(chan struct{}, 64)
	go func() {
		buf := make([]byte, dns.MaxMsgSize)
		for {
			n, _, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			m := new(dns.Msg)
			if m.Unpack(buf[:n]) == nil && len(m.Question) == 1 && m.Question[0].Name == name {
				out <- struct{}{}
			}
		}
	}()
	return pc.LocalAddr().String(), out
}

// TestMaxAttemptsBoundsDroppedQuery sends one query to an upstream that drops every query, silently or by
// closing the connection it came on: the upstream receives exactly max_attempts copies of it, and the client
// gets SERVFAIL as soon as the last one went unanswered. Before max_attempts, one dropped query over TCP was
// sent three times, pipelined and twice by forward's loop, and failed after 6 s.
func TestMaxAttemptsBoundsDroppedQuery(t *testing.T) {
	const name = "dropped.example.org."
	for _, tc := range []struct {
		desc        string
		maxAttempts int
		udp         bool // prefer_udp: no pipeline, every copy through the proxies
		close       bool // the upstream closes the connection of a query instead of leaving it unanswered
	}{
		{desc: "one attempt, dropped silently", maxAttempts: 1},
		{desc: "default, dropped by closing", maxAttempts: 0, close: true},
		{desc: "three attempts, dropped silently", maxAttempts: 3},
		{desc: "prefer_udp, default, dropped silently", maxAttempts: 0, udp: true},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			want := tc.maxAttempts
			if want == 0 {
				want = defaultMaxAttempts
			}
			var (
				u       *UpstreamSvc
				copies  <-chan struct{}
				tcpSide *frameServer
			)
			if tc.udp {
				addr, sent := udpDropper(t, name)
				copies = sent
				u = startUpstreamSvcWith(t, Config{MaxAttempts: tc.maxAttempts, PreferUDP: true}, addr)
			} else {
				tcpSide = newFrameServer(t)
				u = startUpstreamSvcWith(t, Config{MaxAttempts: tc.maxAttempts}, tcpSide.addr())
			}
			sentBefore, exhaustedBefore := counterSum(attemptsSent), counterSum(attemptsExhausted)
			out := make(chan served, 1)
			go func() {
				rec := dnstest.NewRecorder(&test.ResponseWriter{})
				rcode, err := u.ServeDNS(context.Background(), rec, new(dns.Msg).SetQuestion(name, dns.TypeA))
				out <- served{rcode, err, rec.Msg}
			}()
			sent := 0
			var frames chan frame
			if tcpSide != nil {
				frames = tcpSide.frames
			}
			for {
				select {
				case f := <-frames:
					if f.msg.Question[0].Name == name {
						sent++
						if tc.close {
							f.conn.Close()
						}
					}
					continue // health checks (".") go unanswered too
				case <-copies:
					sent++
					continue
				case r := <-out:
					if r.rcode != dns.RcodeServerFailure || !errors.Is(r.err, errAttemptsExhausted) || r.msg != nil {
						t.Errorf("rcode %d, err %v, reply %v; want SERVFAIL, %v, nothing written", r.rcode, r.err, r.msg, errAttemptsExhausted)
					}
				case <-time.After(waitLimit):
					t.Fatalf("timed out with %d copies sent", sent)
				}
				break
			}
			// Every copy was read before the handler returned (it waits for each one's answer); one more
			// read now would be a copy sent behind the client's back.
			for done := false; !done; {
				select {
				case f := <-frames:
					if f.msg.Question[0].Name == name {
						sent++
					}
				case <-copies:
					sent++
				case <-time.After(100 * time.Millisecond):
					done = true
				}
			}
			if sent != want {
				t.Errorf("the upstream received %d copies of the query, want max_attempts %d", sent, want)
			}
			if n := counterSum(attemptsSent) - sentBefore; n != float64(want) {
				t.Errorf("attempts_total grew by %.0f, want %d", n, want)
			}
			if n := counterSum(attemptsExhausted) - exhaustedBefore; n != 1 {
				t.Errorf("attempts_exhausted_total grew by %.0f, want 1", n)
			}
		})
	}
}

// TestMaxAttemptsOneStallsWithoutResend holds the answer to a query so that a query behind it stalls, with
// max_attempts 1: the stalled query is never sent once more, and both fail once their pipelined connection
// closes, each having been sent once.
func TestMaxAttemptsOneStallsWithoutResend(t *testing.T) {
	s := newFrameServer(t)
	u := startUpstreamSvcWith(t, Config{MaxAttempts: 1}, s.addr())
	stallsBefore, resendsBefore := counterSum(stalls), counterSum(stallResends)
	fSlow, _, slow, stalled := stallBehind(t, s, u, "slow.example.org.", "stalled.example.org.")
	waitFor(t, waitLimit, "the query to stall", func() bool { return counterSum(stalls) > stallsBefore })
	fSlow.conn.Close()
	for slow != nil || stalled != nil {
		var r served
		select {
		case r = <-slow:
			slow = nil
		case r = <-stalled:
			stalled = nil
		case f := <-s.frames:
			if f.msg.Question[0].Name != "." { // health checks go unanswered
				t.Fatalf("a query was sent again: %v", f.msg.Question)
			}
			continue
		case <-time.After(waitLimit):
			t.Fatal("timed out")
		}
		if r.rcode != dns.RcodeServerFailure || r.msg != nil {
			t.Errorf("rcode %d, err %v, reply %v; want SERVFAIL, nothing written", r.rcode, r.err, r.msg)
		}
	}
	if n := counterSum(stallResends) - resendsBefore; n != 0 {
		t.Errorf("stall_resends_total grew by %.0f with max_attempts 1", n)
	}
}
