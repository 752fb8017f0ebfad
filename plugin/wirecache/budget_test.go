package wirecache

import (
	"fmt"
	"strings"
	"testing"

	"github.com/miekg/dns"
)

// floodTXT is an answer of about 4 KiB, the largest wirecache stores: what a client that controls a zone
// can have every one of its names answer.
func floodTXT(t testing.TB, owner string) []dns.RR {
	out := make([]dns.RR, 14)
	for i := range out {
		out[i] = rr(t, fmt.Sprintf("%s 600 IN TXT \"%02d-%s\"", owner, i, strings.Repeat("f", 240)))
	}
	return out
}

// TestFloodKeepsBudgetAndHotNames asks a flood of distinct names with 4 KiB answers, each name twice (so
// that repeats_only would store it too), while other clients keep asking a few hot names, asked before the
// flood and then once per 250 flood names, about as often as the flood replaces the whole store. The bytes held
// never pass max_memory, and every hot name keeps being answered from the store: the flood evicts its own
// entries. A store that evicts at random, or by recency alone (CLOCK), loses the hot names to the flood.
func TestFloodKeepsBudgetAndHotNames(t *testing.T) {
	f := newFixture(t)
	f.wc.Capacity = 100000 // the bytes bind, as in the shipped Corefile
	f.wc.MaxMemory = 2 << 20
	f.wc.prepare()
	f.chain.modify = func(m *dns.Msg) {
		if strings.HasPrefix(m.Question[0].Name, "flood-") {
			m.Rcode, m.Ns = dns.RcodeSuccess, nil
			m.Answer = floodTXT(t, m.Question[0].Name)
		}
	}
	hot := []*dns.Msg{
		newQuery("www.example.org.", dns.TypeA, 1232, false),
		newQuery("www.example.org.", dns.TypeAAAA, 1232, false),
		newQuery("alias.example.org.", dns.TypeA, 1232, false),
		newQuery("mid.example.org.", dns.TypeTXT, 1232, false),
		newQuery("big.example.org.", dns.TypeTXT, 4096, false),
		newQuery("huge.example.org.", dns.TypeTXT, 4096, false),
		newQuery("nx.example.org.", dns.TypeA, 1232, false),
	}
	for range 3 { // hot: asked before the flood, and again during it
		for _, q := range hot {
			f.ask(q, udp4Client)
		}
	}

	const flood = 5000
	misses := 0
	for i := range flood {
		q := newQuery(fmt.Sprintf("flood-%d.attacker.example.", i), dns.TypeTXT, 4096, false)
		for range 2 {
			if reply, _ := f.ask(q, tcp4Client); len(reply) < 3500 {
				t.Fatalf("flood answer of %d bytes, want about 4 KiB", len(reply))
			}
			if got := f.wc.store.size(); got > f.wc.MaxMemory {
				t.Fatalf("after %d flood names: %d bytes held, max_memory %d", i+1, got, f.wc.MaxMemory)
			}
		}
		if i%250 != 0 {
			continue
		}
		for _, q := range hot {
			if _, chainCalled := f.ask(q, udp4Client); chainCalled {
				misses++
			}
		}
	}
	if misses > 0 {
		t.Errorf("the hot names missed %d times in %d lookups during the flood", misses, flood/250*len(hot))
	}
	if n := f.wc.store.len(); n < 100 {
		t.Errorf("%d entries held at the end, want the budget used (about 2 MiB of 9 KiB entries)", n)
	}
}
