package wirecache

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// TestRefusedHeldForRefusedFor: a REFUSED the chain wrote answers its question again, from the store, for
// RefusedFor, with the client's ID and spelling, and then goes back to the chain. A client that loops on a
// question the upstream refuses no longer takes the upstream's time with each ask.
func TestRefusedHeldForRefusedFor(t *testing.T) {
	f := newFixture(t)
	f.wc.RefusedFor = 3 * time.Second
	q := func() *dns.Msg { return newQuery("refused.example.org.", dns.TypeA, 1232, false) }
	first, called := f.ask(q(), udp4Client)
	if !called {
		t.Fatal("the first query did not reach the chain")
	}
	f.now = t0.Add(3*time.Second - time.Millisecond)
	second, called := f.ask(q(), udp4Client)
	if called {
		t.Fatal("a REFUSED asked again within refused reached the chain")
	}
	if !bytes.Equal(first, second) {
		t.Errorf("the held REFUSED differs from the chain's:\n got %x\nwant %x", second, first)
	}
	other := newQuery("ReFuSeD.example.org.", dns.TypeA, 1232, false)
	other.Id = 7
	reply, called := f.ask(other, udp4Client)
	m := new(dns.Msg)
	if err := m.Unpack(reply); err != nil {
		t.Fatal(err)
	}
	if called || m.Id != 7 || m.Rcode != dns.RcodeRefused || m.Question[0].Name != "ReFuSeD.example.org." {
		t.Errorf("another client's ask: chain called %v, reply %v; want the held REFUSED with its ID and spelling", called, m)
	}

	f.now = t0.Add(3 * time.Second)
	if _, called := f.ask(q(), udp4Client); !called {
		t.Error("a REFUSED held beyond refused")
	}
}

// TestRefusedNotHeldWhenTheServerWritesIt: a REFUSED the chain returns with an error, without writing it
// (forward's and upstreamsvc's max_concurrent), is the server's to write and says nothing of the upstream:
// not held.
func TestRefusedNotHeldWhenTheServerWritesIt(t *testing.T) {
	f := newFixture(t)
	limited := &limitChain{}
	f.wc.Next = limited
	for range 2 {
		m, rcode, err := f.serve(newQuery("www.example.org.", dns.TypeA, 1232, false), udp4Client)
		if m != nil || rcode != dns.RcodeRefused || err == nil {
			t.Fatalf("reply %v, rcode %d, error %v; want none written, REFUSED and the chain's error", m, rcode, err)
		}
	}
	if limited.calls != 2 || f.wc.store.len() != 0 {
		t.Errorf("chain called %d times, %d entries; want 2 and 0", limited.calls, f.wc.store.len())
	}
}

// limitChain refuses every query as forward does beyond max_concurrent: an rcode and an error, no reply.
type limitChain struct{ calls int }

func (l *limitChain) ServeDNS(context.Context, dns.ResponseWriter, *dns.Msg) (int, error) {
	l.calls++
	return dns.RcodeRefused, errors.New("concurrent queries exceeded maximum")
}

func (l *limitChain) Name() string { return "limit" }

// TestRefusedAndServeStale: a REFUSED is a failure to serve_stale, like a SERVFAIL: it neither replaces an
// expired answer, which answers stale instead, nor is itself ever served stale.
func TestRefusedAndServeStale(t *testing.T) {
	f, o := staleFixture(t)
	www := func() *dns.Msg { return newQuery("www.example.org.", dns.TypeA, 1232, false) }
	f.serve(www(), udp4Client)
	f.now = f.now.Add(101 * time.Second) // the smallest TTL is 100
	f.chain.modify = func(m *dns.Msg) { m.Rcode, m.Answer, m.Ns, m.Extra = dns.RcodeRefused, nil, nil, nil }
	m, _, _ := f.serve(www(), udp4Client)
	if m == nil || m.Rcode != dns.RcodeSuccess || !allEqual(ttls(m), 7) {
		t.Fatalf("an expired answer refused by the chain: got %v, want the stale answer", m)
	}
	calls := o.calls.Load()
	if m, _, _ := f.serve(www(), udp4Client); m == nil || m.Rcode != dns.RcodeSuccess || o.calls.Load() != calls+1 {
		t.Errorf("asked again: reply %v, chain asked %d times; want the stale answer after asking the chain", m, o.calls.Load()-calls)
	}

	f.chain.modify = nil
	refused := func() *dns.Msg { return newQuery("refused.example.org.", dns.TypeA, 1232, false) }
	if m, _, _ := f.serve(refused(), udp4Client); m == nil || m.Rcode != dns.RcodeRefused {
		t.Fatalf("got %v, want the chain's REFUSED", m)
	}
	f.now = f.now.Add(f.wc.RefusedFor)
	o.down.Store(true)
	o.silent.Store(true)
	if m, rcode, err := f.serve(refused(), udp4Client); m != nil || err == nil || rcode != dns.RcodeServerFailure {
		t.Errorf("an expired REFUSED while the chain fails: reply %v, rcode %d, error %v; want the chain's failure", m, rcode, err)
	}
}
