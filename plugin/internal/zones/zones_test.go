package zones

import (
	"math/rand/v2"
	"testing"

	"github.com/coredns/coredns/plugin"
	"github.com/miekg/dns"
)

func TestIn(t *testing.T) {
	for _, tc := range []struct {
		zone, name string
		want       bool
	}{
		{".", "example.org.", true},
		{".", ".", true},
		{"org.", ".", false},
		{"org.", "org.", true},
		{"org.", "ORG.", true},
		{"Example.ORG.", "www.example.org.", true},
		{"example.org.", "wwwexample.org.", false},
		{"example.org.", `www\.example.org.`, false},   // the dot before the zone is escaped: one label
		{"example.org.", `www\\.example.org.`, true},   // an escaped backslash, then a separator
		{"example.org.", `www\\\.example.org.`, false}, // an escaped backslash and an escaped dot
		{"example.org.", "a..example.org.", true},
		{"example.org.", "org.", false},
		{"", "org.", false},
		{"", "", true},
		{"org.", "", false},
	} {
		if got := In(tc.zone, tc.name); got != tc.want {
			t.Errorf("In(%q, %q) = %v, want %v", tc.zone, tc.name, got, tc.want)
		}
		if got := dns.IsSubDomain(tc.zone, tc.name); got != tc.want {
			t.Errorf("dns.IsSubDomain(%q, %q) = %v: the case's want is wrong", tc.zone, tc.name, got)
		}
	}
}

// TestInAsMiekg holds In to dns.IsSubDomain over names made of the bytes that matter to it: letters of both
// cases, dots and backslashes.
func TestInAsMiekg(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const alphabet = `aAb.\`
	name := func() string {
		b := make([]byte, rng.IntN(9))
		for i := range b {
			b[i] = alphabet[rng.IntN(len(alphabet))]
		}
		if rng.IntN(4) > 0 {
			b = append(b, '.')
		}
		return string(b)
	}
	for range 500_000 {
		zone, n := name(), name()
		if rng.IntN(2) == 0 && len(zone) > 0 {
			// A name ending in the zone, the case that needs the labels' boundary.
			n = name() + zone
		}
		if got, want := In(zone, n), dns.IsSubDomain(zone, n); got != want {
			t.Fatalf("In(%q, %q) = %v, dns.IsSubDomain says %v", zone, n, got, want)
		}
	}
}

func TestMatchesAsCoreDNS(t *testing.T) {
	zones := []string{"example.org.", "org.", "sub.example.org.", "."}
	for _, name := range []string{"a.sub.example.org.", "example.org.", "b.org.", "com.", ".", "xorg."} {
		if got, want := Matches(zones, name), plugin.Zones(zones).Matches(name); got != want {
			t.Errorf("Matches(%q) = %q, plugin.Zones.Matches says %q", name, got, want)
		}
	}
	if got := Matches([]string{"org."}, "com."); got != "" {
		t.Errorf("Matches of a name in no zone = %q, want \"\"", got)
	}
}

func TestMatchesAllocatesNothing(t *testing.T) {
	zones := []string{"cluster.local.", "in-addr.arpa.", "ip6.arpa."}
	if n := testing.AllocsPerRun(100, func() { Matches(zones, "kubernetes.default.svc.cluster.local.") }); n != 0 {
		t.Errorf("%v allocations per call, want 0", n)
	}
}
