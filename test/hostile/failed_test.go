//go:build linux

package hostile

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/nodelocaldns/nodelocaldns/plugin/wirecache"
	"github.com/nodelocaldns/nodelocaldns/test/simnode"

	"github.com/miekg/dns"
)

// testFailedAgain asks, in a loop, questions whose upstream fails them, over UDP and TCP on both addresses,
// as a retrying resolver or a hostile Pod would: a reverse name the cluster DNS refuses, and an outside
// name the node's resolver answers SERVFAIL (it answers A queries only). Every answer is the reference's,
// and the upstream is asked once per wirecache's hold (refused, servfail), not once per ask.
func (r *rig) testFailedAgain(t *testing.T) {
	const asks = 10 // per address and transport
	for _, c := range []struct {
		name   string
		qtype  uint16
		status string
		hold   time.Duration
		asked  func(name string) int64 // the upstream's count of queries for name so far
	}{
		{"9.8.7.10.in-addr.arpa.", dns.TypePTR, "REFUSED", wirecache.DefaultRefusedFor, r.upstream.askedFor},
		{"failed-again.example.", dns.TypeTXT, "SERVFAIL", wirecache.DefaultServfailFor, func(name string) int64 {
			log := r.ext.Output()
			return int64(simnode.CountQueries(log, name, "udp") + simnode.CountQueries(log, name, "tcp"))
		}},
	} {
		t.Run(c.status, func(t *testing.T) {
			ask := func(tr transport, server string) answer {
				id := uint16(rand.N(1 << 16))
				return r.askFromPod(tr, server, msg(c.name, c.qtype, dns.ClassINET, edns(1232))(id), id, askTimeout)
			}
			want := ask(udp, pairs[0].ref)
			if !strings.Contains(want.text, "status: "+c.status) {
				t.Fatalf("the reference's answer to %s %s is not %s, so the test asks nothing that fails:\n%s", c.name, dns.TypeToString[c.qtype], c.status, want.text)
			}
			// The upstream logs a query once it has answered it: wait for the reference's.
			before := r.waitAsked(c.asked, c.name, 1)
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
			// The first ask goes through, and one more each time the hold ends while the loop runs.
			bound := 1 + int64(took/c.hold) + 1
			asked := r.waitAsked(c.asked, c.name, before+1) - before
			t.Logf("%d asks of %s %s in %v; the upstream was asked %d times", 2*len(pairs)*asks, c.name, dns.TypeToString[c.qtype], took.Round(time.Millisecond), asked)
			if asked < 1 || asked > bound {
				t.Errorf("the upstream was asked %s %s %d times for %d asks in %v: want 1 to %d (one per %v)",
					c.name, dns.TypeToString[c.qtype], asked, 2*len(pairs)*asks, took.Round(time.Millisecond), bound, c.hold)
			}
		})
	}
}

// waitAsked returns asked(name) once it reaches atLeast, or after a few seconds whatever it is.
func (r *rig) waitAsked(asked func(string) int64, name string, atLeast int64) int64 {
	var n int64
	pollUntil(time.Now().Add(5*time.Second), 10*time.Millisecond, func() bool {
		n = asked(name)
		return n >= atLeast
	})
	return n
}
