//go:build linux

package hostile

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/nodelocaldns/nodelocaldns/plugin/wirecache"

	"github.com/miekg/dns"
)

// testRefusedAgain asks, in a loop, a question the cluster DNS refuses (a reverse name it does not serve),
// over UDP and TCP on both addresses, as a retrying resolver or a hostile Pod would: every answer is the
// reference's REFUSED, and the cluster DNS is asked once per wirecache's refused window, not once per ask.
func (r *rig) testRefusedAgain(t *testing.T) {
	const (
		name = "9.8.7.10.in-addr.arpa."
		asks = 10 // per address and transport
	)
	query := func(id uint16) []byte { return msg(name, dns.TypePTR, dns.ClassINET, edns(1232))(id) }
	ask := func(tr transport, server string) answer {
		id := uint16(rand.N(1 << 16))
		var a answer
		if err := r.n.Do(r.n.PodNS, func() error {
			reply, closed, err := exchange(tr, server, query(id), askTimeout)
			a = describe(reply, closed, err, id)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return a
	}
	want := ask(udp, pairs[0].ref)
	if !strings.Contains(want.text, "status: REFUSED") {
		t.Fatalf("the reference's answer to %s PTR is not REFUSED, so the test asks nothing refused:\n%s", name, want.text)
	}
	before := r.upstream.askedFor(name)
	start := time.Now()
	for _, p := range pairs {
		for _, tr := range []transport{udp, tcp} {
			for i := range asks {
				if d := differs(ask(tr, p.cache), want); d != "" {
					t.Errorf("%s over %s, ask %d: %s", p.name, tr.name, i+1, d)
				}
			}
		}
	}
	took := time.Since(start)
	// The first ask goes through, and one more each time the window ends while the loop runs.
	bound := 1 + int64(took/wirecache.DefaultRefusedFor) + 1
	asked := r.upstream.askedFor(name) - before
	t.Logf("%d asks of %s PTR in %v; the cluster DNS was asked %d times", 2*len(pairs)*asks, name, took.Round(time.Millisecond), asked)
	if asked < 1 || asked > bound {
		t.Errorf("the cluster DNS was asked %s PTR %d times for %d asks in %v: want 1 to %d (one per %v)",
			name, asked, 2*len(pairs)*asks, took.Round(time.Millisecond), bound, wirecache.DefaultRefusedFor)
	}
}
