package wirecache

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// failureNames are the test zone's names whose answers are failures, by rcode.
var failureNames = map[int]string{dns.RcodeRefused: "refused.example.org.", dns.RcodeServerFailure: "fail.example.org."}

// TestFailureHeld: a REFUSED or SERVFAIL the chain wrote answers its question again, from the store, for
// refused or servfail, with the client's ID and spelling, and then goes back to the chain. A client that
// loops on a question the upstream refuses or fails no longer takes the upstream's time with each ask.
func TestFailureHeld(t *testing.T) {
	for rcode, name := range failureNames {
		t.Run(dns.RcodeToString[rcode], func(t *testing.T) {
			f := newFixture(t)
			f.wc.RefusedFor, f.wc.ServfailFor = 3*time.Second, 3*time.Second
			q := func() *dns.Msg { return newQuery(name, dns.TypeA, 1232, false) }
			first, called := f.ask(q(), udp4Client)
			if !called {
				t.Fatal("the first query did not reach the chain")
			}
			f.now = t0.Add(3*time.Second - time.Millisecond)
			second, called := f.ask(q(), udp4Client)
			if called {
				t.Fatal("the failure asked again within its hold reached the chain")
			}
			if !bytes.Equal(first, second) {
				t.Errorf("the held failure differs from the chain's:\n got %x\nwant %x", second, first)
			}
			spelled := mixCase(name)
			other := newQuery(spelled, dns.TypeA, 1232, false)
			other.Id = 7
			reply, called := f.ask(other, udp4Client)
			m := new(dns.Msg)
			if err := m.Unpack(reply); err != nil {
				t.Fatal(err)
			}
			if called || m.Id != 7 || m.Rcode != rcode || m.Question[0].Name != spelled {
				t.Errorf("another client's ask: chain called %v, reply %v; want the held failure with its ID and spelling", called, m)
			}

			f.now = t0.Add(3 * time.Second)
			if _, called := f.ask(q(), udp4Client); !called {
				t.Error("a failure held beyond its hold")
			}
		})
	}
}

// TestFailureNotHeldWhenTheServerWritesIt: a failure the chain returns with an error, without writing it
// (forward's and upstreamsvc's REFUSED beyond max_concurrent, their SERVFAIL when no upstream answered), is
// the server's to write and says nothing of the upstream's answer: not held.
func TestFailureNotHeldWhenTheServerWritesIt(t *testing.T) {
	for _, rcode := range []int{dns.RcodeRefused, dns.RcodeServerFailure} {
		t.Run(dns.RcodeToString[rcode], func(t *testing.T) {
			f := newFixture(t)
			failing := &failingChain{rcode: rcode}
			f.wc.Next = failing
			for range 2 {
				m, got, err := f.serve(newQuery("www.example.org.", dns.TypeA, 1232, false), udp4Client)
				if m != nil || got != rcode || err == nil {
					t.Fatalf("reply %v, rcode %d, error %v; want none written, rcode %d and the chain's error", m, got, err, rcode)
				}
			}
			if failing.calls != 2 || f.wc.store.len() != 0 {
				t.Errorf("chain called %d times, %d entries; want 2 and 0", failing.calls, f.wc.store.len())
			}
		})
	}
}

// failingChain fails every query as forward does beyond max_concurrent or without an upstream: an rcode and
// an error, no reply.
type failingChain struct {
	rcode int
	calls int
}

func (c *failingChain) ServeDNS(context.Context, dns.ResponseWriter, *dns.Msg) (int, error) {
	c.calls++
	return c.rcode, errors.New("no upstream for this query")
}

func (c *failingChain) Name() string { return "failing" }

// TestFailuresAndServeStale: a held failure neither replaces an expired answer, which answers stale
// instead, nor is itself ever served stale.
func TestFailuresAndServeStale(t *testing.T) {
	for rcode, name := range failureNames {
		t.Run(dns.RcodeToString[rcode], func(t *testing.T) {
			f, o := staleFixture(t)
			www := func() *dns.Msg { return newQuery("www.example.org.", dns.TypeA, 1232, false) }
			f.serve(www(), udp4Client)
			f.now = f.now.Add(101 * time.Second) // the smallest TTL is 100
			f.chain.modify = func(m *dns.Msg) { m.Rcode, m.Answer, m.Ns, m.Extra = rcode, nil, nil, nil }
			m, _, _ := f.serve(www(), udp4Client)
			if m == nil || m.Rcode != dns.RcodeSuccess || !allEqual(ttls(m), 7) {
				t.Fatalf("an expired answer the chain now fails: got %v, want the stale answer", m)
			}
			calls := o.calls.Load()
			if m, _, _ := f.serve(www(), udp4Client); m == nil || m.Rcode != dns.RcodeSuccess || o.calls.Load() != calls+1 {
				t.Errorf("asked again: reply %v, chain asked %d times; want the stale answer after asking the chain", m, o.calls.Load()-calls)
			}

			f.chain.modify = nil
			failed := func() *dns.Msg { return newQuery(name, dns.TypeA, 1232, false) }
			if m, _, _ := f.serve(failed(), udp4Client); m == nil || m.Rcode != rcode {
				t.Fatalf("got %v, want the chain's %s", m, dns.RcodeToString[rcode])
			}
			f.now = f.now.Add(max(f.wc.RefusedFor, f.wc.ServfailFor))
			o.down.Store(true)
			o.silent.Store(true)
			if m, got, err := f.serve(failed(), udp4Client); m != nil || err == nil || got != dns.RcodeServerFailure {
				t.Errorf("an expired held failure while the chain fails: reply %v, rcode %d, error %v; want the chain's failure", m, got, err)
			}
		})
	}
}
