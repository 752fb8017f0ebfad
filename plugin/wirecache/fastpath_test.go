package wirecache

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	_ "github.com/coredns/coredns/plugin/bufsize"
	_ "github.com/coredns/coredns/plugin/template"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
)

// counterValue and gaugeValue return the child of a vector with the one label value server.
func counterValue(t *testing.T, vec *prometheus.CounterVec, server string) float64 {
	return childValue(t, vec.GetMetricWithLabelValues, server)
}

func gaugeValue(t *testing.T, vec *prometheus.GaugeVec, server string) float64 {
	return childValue(t, vec.GetMetricWithLabelValues, server)
}

func childValue[M prometheus.Metric](t *testing.T, get func(...string) (M, error), server string) float64 {
	t.Helper()
	m, err := get(server)
	if err != nil {
		t.Fatal(err)
	}
	return value(m)
}

// waitFastPathSteered sends a query to addr, which starts the fast path of its server, and waits until the
// server's UDP queries are steered to it. The deadline only bounds a failure. Where there is no fast path
// (on systems other than Linux) it skips the test.
func waitFastPathSteered(t *testing.T, server, addr string) {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("the fast path needs Linux")
	}
	// The first query starts the fast path. It may be a miss to an upstream that has just started too, so
	// on a busy machine it is asked again rather than failed at once; the deadline only bounds a failure.
	q := newQuery("start.fastpath.invalid.", dns.TypeA, 0, false)
	c := &dns.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(time.Minute)
	for {
		_, _, err := c.Exchange(q, addr)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("first query to %s: no answer within a minute: %v", addr, err)
		}
		time.Sleep(10 * time.Millisecond) // a refusal comes back at once
	}
	waitSteered(t, server)
}

// waitSteered waits until the UDP queries of server, whose fast path a query started, are steered to it. The
// deadline only bounds a failure.
func waitSteered(t *testing.T, server string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for gaugeValue(t, fastPathSteered, server) != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("the fast path of %s was not steered to within a minute", server)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// askA asks addr over UDP for name's A record and returns the address answered.
func askA(t *testing.T, addr, name string) string {
	t.Helper()
	c := &dns.Client{Timeout: 5 * time.Second}
	r, _, err := c.Exchange(newQuery(name, dns.TypeA, 1232, false), addr)
	if err != nil {
		t.Fatalf("%s A: %v", name, err)
	}
	if len(r.Answer) != 1 {
		t.Fatalf("%s A: %v", name, r)
	}
	return r.Answer[0].(*dns.A).A.String()
}

const fastPathCorefile = `sub.example.org:%[1]d {
    bind 127.0.0.1
    wirecache
    template IN A sub.example.org {
        answer "{{ .Name }} 60 IN A 192.0.2.1"
    }
}
example.org:%[1]d {
    bind 127.0.0.1
    bufsize 1232
    wirecache
    template IN A example.org {
        answer "{{ .Name }} 60 IN A 192.0.2.2"
    }
}
.:%[1]d {
    bind 127.0.0.1
    wirecache
    template IN A {
        answer "{{ .Name }} 60 IN A 192.0.2.3"
    }
}
`

// TestFastPathAnswersEachBlocksHits serves three blocks on one address: the fast path answers the hits of
// the two whose plugins ahead of wirecache it may skip, each from its own block, and passes every query of
// the block with bufsize ahead of wirecache to CoreDNS's server.
func TestFastPathAnswersEachBlocksHits(t *testing.T) {
	port := freePort(t)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	server := "dns://" + addr
	startCoreDNS(t, fmt.Sprintf(fastPathCorefile, port))
	waitFastPathSteered(t, server, addr)

	for _, tc := range []struct {
		name, want string
		fast       bool
	}{
		{"a.sub.example.org.", "192.0.2.1", true},
		{"b.example.org.", "192.0.2.2", false},
		{"c.example.net.", "192.0.2.3", true},
		{"sub.example.org.", "192.0.2.1", true},
		{"example.org.", "192.0.2.2", false},
	} {
		if got := askA(t, addr, tc.name); got != tc.want {
			t.Fatalf("%s: %s, want %s", tc.name, got, tc.want)
		}
		passed, hits := counterValue(t, fastPathPassed, server), sumCounter(hitsTotal)
		for range 3 {
			if got := askA(t, addr, tc.name); got != tc.want {
				t.Fatalf("%s asked again: %s, want %s", tc.name, got, tc.want)
			}
		}
		passedAgain := counterValue(t, fastPathPassed, server) - passed
		if tc.fast && passedAgain != 0 {
			t.Errorf("%s: the fast path passed %v hits to the server", tc.name, passedAgain)
		}
		if !tc.fast && passedAgain != 3 {
			t.Errorf("%s: the fast path passed %v of 3 queries to the server, want all: bufsize runs ahead of wirecache", tc.name, passedAgain)
		}
		if got := sumCounter(hitsTotal) - hits; got != 3 {
			t.Errorf("%s: %v wirecache hits of 3 queries", tc.name, got)
		}
	}
}

// TestFastPathReloadLosesNothing reloads the instance, as the reload plugin does, while a client asks
// without pause: the old fast path hands the address back and the new one takes it, and no query is lost.
func TestFastPathReloadLosesNothing(t *testing.T) {
	useDirectives(t)
	port := freePort(t)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	server := "dns://" + addr
	input := caddy.CaddyfileInput{Contents: fmt.Appendf(nil, fastPathCorefile, port), ServerTypeName: "dns"}
	inst, err := caddy.Start(input)
	if err != nil {
		t.Fatal(err)
	}
	waitFastPathSteered(t, server, addr)

	var asked, lost atomic.Int64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		c := &dns.Client{Timeout: 2 * time.Second}
		// Bounded: 20,000 queries at most, and it stops when told.
		for i := range 20000 {
			select {
			case <-stop:
				return
			default:
			}
			name := fmt.Sprintf("n%d.sub.example.org.", i%50)
			r, _, err := c.Exchange(newQuery(name, dns.TypeA, 1232, false), addr)
			asked.Add(1)
			if err != nil || len(r.Answer) != 1 {
				lost.Add(1)
			}
		}
	}()
	for asked.Load() < 500 {
		time.Sleep(time.Millisecond)
	}
	restarted, err := inst.Restart(input)
	if err != nil {
		close(stop)
		<-done
		t.Fatal(err)
	}
	defer func() {
		restarted.ShutdownCallbacks()
		restarted.Stop()
	}()
	// The new instance's fast path starts with the first query its chain sees, and takes the address.
	from := asked.Load()
	deadline := time.Now().Add(time.Minute)
	for gaugeValue(t, fastPathSteered, server) != 1 || asked.Load() < from+500 {
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	close(stop)
	<-done
	if got := gaugeValue(t, fastPathSteered, server); got != 1 {
		t.Errorf("the new instance's fast path was not steered to within a minute")
	}
	if lost.Load() > 0 {
		t.Errorf("%d of %d queries lost across the reload", lost.Load(), asked.Load())
	}
	t.Logf("%d queries across the reload, none lost", asked.Load())
}

// TestServerZonesReadsCoreDNS checks that the server's blocks are where the fast path reads them, in the
// CoreDNS version this module builds with.
func TestServerZonesReadsCoreDNS(t *testing.T) {
	a := &dnsserver.Config{Zone: "example.org.", ListenHosts: []string{"127.0.0.1"}, Port: "53"}
	b := &dnsserver.Config{Zone: ".", ListenHosts: []string{"127.0.0.1"}, Port: "53"}
	srv, err := dnsserver.NewServer("dns://127.0.0.1:53", []*dnsserver.Config{a, b})
	if err != nil {
		t.Fatal(err)
	}
	zones, err := serverZones(srv)
	if err != nil {
		t.Fatal(err)
	}
	if len(zones) != 2 || len(zones["example.org."]) != 1 || zones["example.org."][0] != a || zones["."][0] != b {
		t.Errorf("zones %v", zones)
	}
}

func TestFastRoutingRoutesLikeTheServer(t *testing.T) {
	sub, org, root := &fastBlock{}, &fastBlock{}, &fastBlock{}
	r := newFastRouting(map[string]*fastBlock{"sub.example.org.": sub, "example.org.": org, ".": root, "other.example.org.": nil})
	for name, want := range map[string]*fastBlock{
		"a.sub.example.org.": sub, "sub.example.org.": sub, "b.example.org.": org, "example.org.": org,
		"x.other.example.org.": nil, "example.net.": root, ".": root, "org.": root,
	} {
		if got := r.route(name); got != want {
			t.Errorf("%s routed to %p, want %p", name, got, want)
		}
	}
}

// TestFastRoutingMatchesEverySuffixWalk holds route, which looks up only the suffixes as long as a zone, to
// the walk the server makes (every suffix, longest first), over zone sets of mixed lengths and names with
// escaped dots.
func TestFastRoutingMatchesEverySuffixWalk(t *testing.T) {
	walk := func(byZone map[string]*fastBlock, name string) *fastBlock {
		for off := 0; ; {
			if b, ok := byZone[name[off:]]; ok {
				return b
			}
			next, end := dns.NextLabel(name, off)
			if end {
				return byZone["."]
			}
			off = next
		}
	}
	labels := []string{"a", "b", "example", "org", `x\.y`, `\.`, "svc", "cluster", "local"}
	rnd := rand.New(rand.NewPCG(1, 2))
	randomName := func() string {
		name := ""
		for range rnd.IntN(7) {
			name += labels[rnd.IntN(len(labels))] + "."
		}
		if name == "" {
			return "."
		}
		return name
	}
	for set := range 200 {
		byZone := map[string]*fastBlock{}
		for range 1 + rnd.IntN(5) {
			if rnd.IntN(3) == 0 {
				byZone[randomName()] = nil // a block the fast path does not answer for
			} else {
				byZone[randomName()] = &fastBlock{}
			}
		}
		if set%2 == 0 {
			byZone["."] = &fastBlock{}
		}
		r := newFastRouting(byZone)
		for range 200 {
			name := randomName()
			if got, want := r.route(name), walk(byZone, name); got != want {
				t.Fatalf("zones %v: %s routed to %p, the server's walk to %p", slices.Collect(maps.Keys(byZone)), name, got, want)
			}
		}
	}
}

// TestFastPathIPv6 answers hits on an IPv6 address, to an IPv6 sender.
func TestFastPathIPv6(t *testing.T) {
	port := freePortOn(t, "::1")
	addr := fmt.Sprintf("[::1]:%d", port)
	server := "dns://" + addr
	startCoreDNS(t, fmt.Sprintf(".:%d {\n    bind ::1\n    wirecache\n    template IN A {\n        answer \"{{ .Name }} 60 IN A 192.0.2.3\"\n    }\n}\n", port))
	waitFastPathSteered(t, server, addr)
	if got := askA(t, addr, "v6.example.net."); got != "192.0.2.3" {
		t.Fatalf("v6.example.net.: %s", got)
	}
	passed := counterValue(t, fastPathPassed, server)
	for range 3 {
		if got := askA(t, addr, "v6.example.net."); got != "192.0.2.3" {
			t.Fatalf("v6.example.net. asked again: %s", got)
		}
	}
	if got := counterValue(t, fastPathPassed, server) - passed; got != 0 {
		t.Errorf("the fast path passed %v hits to the server", got)
	}
}
