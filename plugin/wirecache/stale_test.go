package wirecache

import (
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/request"
	"github.com/nodelocaldns/nodelocaldns/plugin/clamp"

	"github.com/miekg/dns"
)

// outage is a plugin chain whose upstream can go away: while down, it either writes SERVFAIL, as a
// cache holding a SERVFAIL does, or returns SERVFAIL with an error and writes nothing, as forward does
// when its upstream does not answer.
type outage struct {
	next   *chain
	down   atomic.Bool
	silent atomic.Bool
	calls  atomic.Int64
}

func (o *outage) ServeDNS(ctx context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
	o.calls.Add(1)
	if !o.down.Load() {
		return o.next.ServeDNS(ctx, w, r)
	}
	if o.silent.Load() {
		return dns.RcodeServerFailure, errors.New("no healthy proxies")
	}
	m := new(dns.Msg)
	m.SetRcode(r, dns.RcodeServerFailure)
	return dns.RcodeSuccess, w.WriteMsg(m)
}

func (o *outage) Name() string { return "outage" }

// staleFixture is a fixture whose chain can fail, with serve_stale on: an hour, TTL 7.
func staleFixture(t *testing.T) (*fixture, *outage) {
	f := newFixture(t)
	o := &outage{next: f.chain}
	f.wc.Next = o
	f.wc.StaleFor, f.wc.StaleTTL = time.Hour, 7
	return f, o
}

// serve sends req through the server's writer and returns what the client got (nil if nothing) with the
// rcode and error ServeDNS returned.
func (f *fixture) serve(req *dns.Msg, remote net.Addr) (*dns.Msg, int, error) {
	f.t.Helper()
	w := newWireWriter(remote)
	rcode, err := f.wc.ServeDNS(context.Background(), request.NewScrubWriter(req, w), req)
	if len(w.out) > 1 {
		f.t.Fatalf("%d replies written", len(w.out))
	}
	if len(w.out) == 0 {
		return nil, rcode, err
	}
	m := new(dns.Msg)
	if err := m.Unpack(w.out[0]); err != nil {
		f.t.Fatal(err)
	}
	return m, rcode, err
}

func ttls(m *dns.Msg) []uint32 {
	var out []uint32
	for _, section := range [][]dns.RR{m.Answer, m.Ns, m.Extra} {
		for _, rr := range section {
			if rr.Header().Rrtype != dns.TypeOPT {
				out = append(out, rr.Header().Ttl)
			}
		}
	}
	return out
}

func allEqual(v []uint32, want uint32) bool {
	for _, x := range v {
		if x != want {
			return false
		}
	}
	return len(v) > 0
}

func staleCount() float64 { return value(servedStaleTotal.WithLabelValues("")) }

// TestServeStaleWhenTheChainFails: an expired entry goes to the chain; while the chain fails, either way,
// the entry answers with the stale TTL, and once the chain answers again its reply replaces the entry.
func TestServeStaleWhenTheChainFails(t *testing.T) {
	for _, silent := range []bool{false, true} {
		name := map[bool]string{false: "SERVFAIL written", true: "error without a reply"}[silent]
		t.Run(name, func(t *testing.T) {
			f, o := staleFixture(t)
			o.silent.Store(silent)
			q := func() *dns.Msg { return newQuery("www.example.org.", dns.TypeA, 1232, false) }
			fresh, _, _ := f.serve(q(), udp4Client)

			o.down.Store(true)
			f.now = f.now.Add(101 * time.Second) // the smallest TTL is 100
			before := staleCount()
			for i := range 3 {
				calls := o.calls.Load()
				m, rcode, err := f.serve(q(), udp4Client)
				if err != nil || rcode != dns.RcodeSuccess || m == nil {
					t.Fatalf("stale answer %d: rcode %d, err %v, reply %v", i, rcode, err, m)
				}
				if o.calls.Load() != calls+1 {
					t.Errorf("stale answer %d: the chain was not asked first", i)
				}
				if m.Rcode != dns.RcodeSuccess || len(m.Answer) != len(fresh.Answer) || !allEqual(ttls(m), 7) {
					t.Errorf("stale answer %d: %v, want the stored answer with every TTL 7", i, m)
				}
				if m.Id != 4242 {
					t.Errorf("stale answer %d: ID %d", i, m.Id)
				}
				f.now = f.now.Add(10 * time.Minute)
			}
			if n := staleCount() - before; n != 3 {
				t.Errorf("served_stale_total grew by %v, want 3", n)
			}

			o.down.Store(false)
			m, _, _ := f.serve(q(), udp4Client)
			if got := ttls(m); len(got) != 2 || got[0] != 120 || got[1] != 100 {
				t.Errorf("after the outage: TTLs %v, want the chain's fresh 120 and 100", got)
			}
			if _, called := f.ask(q(), udp4Client); called {
				t.Error("the fresh answer was not stored")
			}
		})
	}
}

// TestServeStaleBounds: past the stale window, and without serve_stale, the chain's failure reaches the
// client; a refreshed NXDOMAIN is an answer, not a failure.
func TestServeStaleBounds(t *testing.T) {
	q := func() *dns.Msg { return newQuery("www.example.org.", dns.TypeA, 1232, false) }

	f, o := staleFixture(t)
	f.serve(q(), udp4Client)
	o.down.Store(true)
	f.now = f.now.Add(100*time.Second + time.Hour)
	if m, _, _ := f.serve(q(), udp4Client); m == nil || m.Rcode != dns.RcodeServerFailure {
		t.Errorf("past the stale window: %v, want the chain's SERVFAIL", m)
	}

	f, o = staleFixture(t)
	f.wc.StaleFor = 0
	f.serve(q(), udp4Client)
	o.down.Store(true)
	f.now = f.now.Add(101 * time.Second)
	if m, _, _ := f.serve(q(), udp4Client); m == nil || m.Rcode != dns.RcodeServerFailure {
		t.Errorf("without serve_stale: %v, want the chain's SERVFAIL", m)
	}

	f, _ = staleFixture(t)
	f.serve(q(), udp4Client)
	f.chain.modify = func(m *dns.Msg) {
		m.Rcode, m.Answer = dns.RcodeNameError, nil
		m.Ns = []dns.RR{dns.Copy(f.chain.zone.soa)}
	}
	f.now = f.now.Add(101 * time.Second)
	before := staleCount()
	if m, _, _ := f.serve(q(), udp4Client); m == nil || m.Rcode != dns.RcodeNameError {
		t.Errorf("refreshed to NXDOMAIN: %v, want the NXDOMAIN", m)
	}
	if staleCount() != before {
		t.Error("an NXDOMAIN from the chain counted as a stale answer")
	}
}

// TestServeStaleKeepsClampFloor: with clamp in the block, a stale answer is not below clamp's MIN, as the
// cache plugin's stale answer is not once clamp raised it.
func TestServeStaleKeepsClampFloor(t *testing.T) {
	f, o := staleFixture(t)
	c := clamp.New()
	c.Success = clamp.Window{Min: 10, Max: 300}
	f.wc.floorer = c
	q := func() *dns.Msg { return newQuery("www.example.org.", dns.TypeA, 1232, false) }
	f.serve(q(), udp4Client)
	o.down.Store(true)
	f.now = f.now.Add(101 * time.Second)
	if m, _, _ := f.serve(q(), udp4Client); m == nil || !allEqual(ttls(m), 10) {
		t.Errorf("stale answer %v, want every TTL at clamp's MIN 10", m)
	}
}

func TestSetupServeStale(t *testing.T) {
	tests := []struct {
		input   string
		wantErr string
		d       time.Duration
		ttl     uint32
		wait    time.Duration
	}{
		{input: "wirecache"},
		{input: "wirecache {\n serve_stale\n}", d: DefaultStaleFor, ttl: DefaultStaleTTL},
		{input: "wirecache {\n serve_stale 10m\n}", d: 10 * time.Minute, ttl: DefaultStaleTTL},
		{input: "wirecache {\n serve_stale 1h 5s\n}", d: time.Hour, ttl: 5},
		{input: "wirecache {\n serve_stale 1h 0s\n}", d: time.Hour, ttl: 0},
		{input: "wirecache {\n serve_stale 0s\n}", wantErr: "not a positive duration"},
		{input: "wirecache {\n serve_stale soon\n}", wantErr: "not a positive duration"},
		{input: "wirecache {\n serve_stale 1h 5\n}", wantErr: "whole number of seconds"},
		{input: "wirecache {\n serve_stale 1h 1500ms\n}", wantErr: "whole number of seconds"},
		{input: "wirecache {\n serve_stale 1h 5s 1s\n}", d: time.Hour, ttl: 5, wait: time.Second},
		{input: "wirecache {\n serve_stale 1h 5s 0s\n}", d: time.Hour, ttl: 5},
		{input: "wirecache {\n serve_stale 1h 5s 2m\n}", wantErr: "WAIT"},
		{input: "wirecache {\n serve_stale 1h 5s soon\n}", wantErr: "WAIT"},
		{input: "wirecache {\n serve_stale 1h 5s 1s 1s\n}", wantErr: "Wrong argument count"},
		{input: "wirecache {\n serve_stale\n serve_stale 1h\n}", wantErr: "given twice"},
	}
	for _, tc := range tests {
		t.Run(tc.input, func(t *testing.T) {
			wc, err := parse(caddy.NewTestController("dns", tc.input))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if wc.StaleFor != tc.d || wc.StaleTTL != tc.ttl || wc.StaleWait != tc.wait {
				t.Errorf("serve_stale %v TTL %d WAIT %v, want %v, %d and %v", wc.StaleFor, wc.StaleTTL, wc.StaleWait, tc.d, tc.ttl, tc.wait)
			}
		})
	}
}

// hungChain is a chain whose answers wait until the test releases them, as an upstream that accepted the
// query and is slow to answer; answered says when the reply was written (and so stored).
type hungChain struct {
	next     *chain
	release  chan struct{}
	answered chan struct{}
	calls    atomic.Int64
}

func (h *hungChain) ServeDNS(ctx context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
	h.calls.Add(1)
	<-h.release
	defer func() { h.answered <- struct{}{} }()
	return h.next.ServeDNS(ctx, w, r)
}

func (h *hungChain) Name() string { return "hung" }

// TestServeStaleWait: with a WAIT, a query of an expired entry whose chain does not answer in time is answered
// stale, queries meanwhile are answered stale without asking the chain again, and the chain's late answer
// replaces the entry. When the chain answers within the wait, its answer goes to the client.
func TestServeStaleWait(t *testing.T) {
	f := newFixture(t)
	f.wc.StaleFor, f.wc.StaleTTL = time.Hour, 7
	req := newQuery("www.example.org.", dns.TypeA, 1232, false)
	f.ask(req, udp4Client) // stored, lifetime 100 s

	h := &hungChain{next: f.chain, release: make(chan struct{}), answered: make(chan struct{}, 1)}
	f.wc.Next = h
	f.wc.StaleWait = time.Millisecond // the chain is held until released, so the wait always runs out
	f.now = t0.Add(101 * time.Second)
	before := staleCount()
	for i := range 3 {
		got, rcode, err := f.serve(req, udp4Client)
		if err != nil || rcode != dns.RcodeSuccess || got == nil || !allEqual(ttls(got), 7) {
			t.Fatalf("query %d of the expired entry while the chain hangs: %v, rcode %d, %v; want the stale answer", i, got, rcode, err)
		}
	}
	if n := h.calls.Load(); n > 1 {
		t.Errorf("the chain was asked %d times while one refresh was under way", n)
	}
	if got := staleCount() - before; got != 3 {
		t.Errorf("served stale counted %v, want 3", got)
	}
	close(h.release)
	<-h.answered
	// The late answer replaced the expired entry: a hit again, with its TTLs counted from its arrival.
	reply, chainCalled := f.ask(req, udp4Client)
	if chainCalled {
		t.Error("the chain's late answer was not stored")
	}
	if got := answerTTLs(t, reply); !slices.Equal(got, []uint32{120, 100}) {
		t.Errorf("TTLs after the refresh %v, want the refreshed answer's 120 100", got)
	}

	// A chain that answers within the wait gives the client its answer.
	f.wc.StaleWait = time.Hour
	f.now = f.now.Add(101 * time.Second)
	go func() { <-h.answered }()
	got, _, err := f.serve(req, udp4Client)
	if err != nil || got == nil || !slices.Equal(ttls(got), []uint32{120, 100}) {
		t.Errorf("refresh within the wait: %v, %v; want the chain's answer", got, err)
	}
}
