package wirecache

import (
	"testing"
	"time"

	"github.com/miekg/dns"
)

func TestDoorkeeper(t *testing.T) {
	d := newDoorkeeper(10000)
	if len(d.slots) != 4096 {
		t.Errorf("%d slots for 10000 entries, want 4096", len(d.slots))
	}
	if n := len(newDoorkeeper(1).slots); n != 1024 {
		t.Errorf("%d slots for 1 entry, want 1024", n)
	}
	if n := len(newDoorkeeper(1 << 30).slots); n != 1<<14 {
		t.Errorf("%d slots for 2^30 entries, want 16384", n)
	}
	const h = 0x1234_5678_9abc_0042
	if d.seen(h) {
		t.Error("a new question was seen")
	}
	for i := range 2 {
		if !d.seen(h) {
			t.Errorf("ask %d of a question: not seen", i+2)
		}
	}
	// Another question in the same slot takes it.
	other := uint64(h + 4096)
	if d.seen(other) {
		t.Error("a new question in a taken slot was seen")
	}
	if d.seen(h) {
		t.Error("a question whose slot was taken was still seen")
	}
}

// TestRepeatsOnly: with repeats_only, the first answer to a question is passed on but not stored, the second
// is stored, and the third is a hit; an expired entry kept for serve_stale is refreshed at once.
func TestRepeatsOnly(t *testing.T) {
	f := newFixture(t)
	f.wc.RepeatsOnly = true
	f.wc.StaleFor = time.Hour
	f.wc.prepare()
	req := newQuery("www.example.org.", dns.TypeA, 1232, false)
	for i, wantChain := range []bool{true, true, false} {
		if _, called := f.ask(req.Copy(), udp4Client); called != wantChain {
			t.Errorf("ask %d: chain called %v, want %v", i+1, called, wantChain)
		}
	}
	if n := f.wc.store.len(); n != 1 {
		t.Errorf("%d entries stored, want 1", n)
	}
	// Past the answer's TTL the entry is expired but kept; its question is a repeat, so the chain's new answer
	// is stored and the next ask is a hit.
	f.now = f.now.Add(10 * time.Minute)
	f.wc.doorkeeper = newDoorkeeper(f.wc.Capacity) // forget the question: only the expired entry remembers it
	if _, called := f.ask(req.Copy(), udp4Client); !called {
		t.Error("expired entry served as a hit")
	}
	if _, called := f.ask(req.Copy(), udp4Client); called {
		t.Error("the refreshed answer of an expired entry was not stored")
	}
	// Another name, asked once, is not stored.
	f.ask(newQuery("mail.example.org.", dns.TypeA, 1232, false), udp4Client)
	if n := f.wc.store.len(); n != 1 {
		t.Errorf("%d entries stored after a name asked once, want 1", n)
	}
}
