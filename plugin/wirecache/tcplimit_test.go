package wirecache

import (
	"net/netip"
	"testing"
)

// TestConnLimits counts connections in and out of the bounds.
func TestConnLimits(t *testing.T) {
	a, b, c := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.3")
	l := newConnLimits(3, 2)
	for _, step := range []struct {
		admit   netip.Addr
		release bool
		want    string
	}{
		{admit: a}, {admit: a}, {admit: a, want: refusedClient},
		{admit: b}, {admit: c, want: refusedTotal}, {admit: b, want: refusedTotal},
		{admit: a, release: true}, {admit: c}, {admit: c, want: refusedTotal},
		{admit: c, release: true}, {admit: b}, {admit: b, want: refusedTotal},
		{admit: a, release: true}, {admit: b, want: refusedClient},
	} {
		if step.release {
			l.release(step.admit)
			continue
		}
		if got := l.admit(step.admit); got != step.want {
			t.Fatalf("admit %s with %d open (%v): %q, want %q", step.admit, l.open, l.clients, got, step.want)
		}
	}
	for _, addr := range []netip.Addr{b, b} {
		l.release(addr)
	}
	if l.open != 0 || len(l.clients) != 0 {
		t.Errorf("after every release: %d open, %v", l.open, l.clients)
	}
}
