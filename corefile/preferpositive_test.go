package corefile

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// flippingUpstream is a cluster DNS whose names can turn NXDOMAIN or empty (NOERROR, no records), as a
// restarted CoreDNS answers before its kubernetes plugin has synced (kubernetes/dns#747). It counts the
// queries it answers for each name since the name turned.
type flippingUpstream struct {
	addr   string
	mu     sync.Mutex
	turned map[string]int // rcode the name turned to: dns.RcodeNameError, or dns.RcodeSuccess for empty
	since  map[string]int // queries answered since the name turned
}

func newFlippingUpstream(t *testing.T) *flippingUpstream {
	u := &flippingUpstream{turned: map[string]int{}, since: map[string]int{}}
	u.addr = fakeUpstream(t, func(w dns.ResponseWriter, r *dns.Msg) {
		name := strings.ToLower(r.Question[0].Name)
		u.mu.Lock()
		rcode, turned := u.turned[name]
		if turned {
			u.since[name]++
		}
		u.mu.Unlock()
		m := new(dns.Msg)
		m.Authoritative = true
		if !turned {
			// TTL 1: the cache's least (5 s) and clamp's MIN (5 s) decide how long it is held.
			m.SetReply(r)
			rr, _ := dns.NewRR(r.Question[0].Name + " 1 IN A 10.0.0.1")
			m.Answer = []dns.RR{rr}
			w.WriteMsg(m)
			return
		}
		m.SetRcode(r, rcode)
		soa, _ := dns.NewRR("cluster.local. 5 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 1 7200 1800 86400 5")
		m.Ns = []dns.RR{soa}
		w.WriteMsg(m)
	})
	return u
}

func (u *flippingUpstream) turn(name string, rcode int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.turned[dns.Fqdn(name)] = rcode
}

func (u *flippingUpstream) askedSinceTurn(name string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.since[dns.Fqdn(name)]
}

// TestPreferPositiveEndToEnd renders a node cache's Corefile (wirecache, its only cache, and clamp in the
// cluster block), starts it in CoreDNS on loopback in front of a cluster DNS, and turns one name NXDOMAIN and another
// empty once the cache holds them. With ServeStale.PreferPositive, once the cache has asked the cluster DNS
// again and heard the denial, clients keep getting the last address, with clamp's TTL window applied
// (at most the stale TTL, 5 s); without it, they get the denial. The wait is for the cache's refresh (the
// upstream answering the turned name), bounded at 30 s; nothing is timed.
func TestPreferPositiveEndToEnd(t *testing.T) {
	for _, prefer := range []bool{true, false} {
		name := map[bool]string{true: "prefer_positive", false: "default"}[prefer]
		t.Run(name, func(t *testing.T) {
			c := Config{LocalIPs: addrs("169.254.20.10"), ClusterDNSIPs: addrs("10.96.0.10"),
				ServeStale: ServeStale{PreferPositive: prefer}}
			out, err := Render(c)
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Contains(string(out), "prefer_positive"); got != prefer {
				t.Fatalf("Corefile has prefer_positive: %v, want %v\n%s", got, prefer, out)
			}
			f, err := Parse(out)
			if err != nil {
				t.Fatal(err)
			}
			up := newFlippingUpstream(t)
			lb := toLoopback(t, f, up.addr)
			startCoreDNS(t, lb.file.Format())

			names := map[string]int{"gone.default.svc.cluster.local.": dns.RcodeNameError, "empty.default.svc.cluster.local.": dns.RcodeSuccess}
			for n := range names {
				for range 2 { // twice: wirecache stores an answer at its question's second ask (repeats_only)
					if r := exchange(t, lb.dns, n, dns.TypeA); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
						t.Fatalf("%s before the turn: %v", n, r)
					}
				}
			}
			for n, rcode := range names {
				up.turn(n, rcode)
			}
			for n, rcode := range names {
				var r *dns.Msg
				for deadline := time.Now().Add(30 * time.Second); up.askedSinceTurn(n) == 0; time.Sleep(100 * time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatalf("%s: the cache never asked the cluster DNS again", n)
					}
					r = exchange(t, lb.dns, n, dns.TypeA)
				}
				// The answer to the query that made the cache ask, and the next ones.
				for i := range 3 {
					if i > 0 {
						r = exchange(t, lb.dns, n, dns.TypeA)
					}
					switch {
					case prefer && (r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1):
						t.Errorf("%s after it turned %s (answer %d): %v, want the last address", n, dns.RcodeToString[rcode], i, r)
					case prefer && (r.Answer[0].Header().Ttl == 0 || r.Answer[0].Header().Ttl > 5):
						t.Errorf("%s: the kept address has TTL %d, want 1-5 s (the stale TTL)", n, r.Answer[0].Header().Ttl)
					case !prefer && (r.Rcode != rcode || len(r.Answer) != 0):
						t.Errorf("%s after it turned %s (answer %d): %v, want the denial", n, dns.RcodeToString[rcode], i, r)
					}
				}
			}
		})
	}
}
