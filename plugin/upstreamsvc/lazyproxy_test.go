package upstreamsvc

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/plugin/pkg/dnstest"
	"github.com/coredns/coredns/plugin/test"

	"github.com/miekg/dns"
)

// connManagers returns the goroutine IDs of the started CoreDNS proxies' connection managers, each of which
// wakes every 10 s.
func connManagers() map[string]bool {
	buf := make([]byte, 1<<22)
	buf = buf[:runtime.Stack(buf, true)]
	ids := map[string]bool{}
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, "proxy.(*Transport).connManager") {
			ids[strings.Fields(g)[1]] = true
		}
	}
	return ids
}

// newConnManagers returns how many of the connection managers running now were not in before.
func newConnManagers(before map[string]bool) int {
	n := 0
	for id := range connManagers() {
		if !before[id] {
			n++
		}
	}
	return n
}

// TestProxiesStartWhenUsed checks that the proxies start when a query first goes through them, and not
// before: with the pipelines carrying every query, an idle upstream runs no proxy connection manager.
func TestProxiesStartWhenUsed(t *testing.T) {
	s, err := listenUpstream("127.0.0.1", 0, net.IPv4(192, 0, 2, 1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	addr := s.tcp.Listener.Addr().String()
	query := func(u *UpstreamSvc) {
		t.Helper()
		rec := dnstest.NewRecorder(&test.ResponseWriter{})
		if rcode, err := u.ServeDNS(context.Background(), rec, new(dns.Msg).SetQuestion("q.example.org.", dns.TypeA)); rcode != dns.RcodeSuccess || err != nil {
			t.Fatalf("rcode %d, %v", rcode, err)
		}
		if rec.Msg == nil || len(rec.Msg.Answer) != 1 {
			t.Fatalf("answer %v", rec.Msg)
		}
	}

	before := connManagers()
	pipelined := startUpstreamSvcWith(t, Config{}, addr)
	query(pipelined)
	if s.byTCP.Load() != 1 {
		t.Fatalf("%d queries over TCP, want the pipelined one", s.byTCP.Load())
	}
	if n := newConnManagers(before); n != 0 {
		t.Errorf("%d proxies started with the pipelines carrying the queries, want none", n)
	}

	before = connManagers()
	forwarded := startUpstreamSvcWith(t, Config{PreferUDP: true}, addr)
	if n := newConnManagers(before); n != 0 {
		t.Errorf("%d proxies started before any query, want none", n)
	}
	query(forwarded)
	query(forwarded)
	if s.byUDP.Load() != 2 {
		t.Fatalf("%d queries over UDP, want the two through the proxy", s.byUDP.Load())
	}
	if n := newConnManagers(before); n != 1 {
		t.Errorf("%d proxies started by queries through one, want it alone", n)
	}
}

// TestBlocksShareProxies checks that the server blocks of one Corefile that forward to the same address with
// the same options send through one proxy between them, and that a reload gets proxies of its own.
func TestBlocksShareProxies(t *testing.T) {
	noClusterAPI(t)
	clearServiceEnv(t)
	s, err := listenUpstream("127.0.0.1", 0, net.IPv4(192, 0, 2, 1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	block := func(zone string) string {
		return fmt.Sprintf("%s:0 {\n bind 127.0.0.1\n upstreamsvc {\n prefer_udp\n fallback %s\n }\n}\n", zone, s.tcp.Listener.Addr())
	}
	before := connManagers()
	inst, addr := startCoreDNS(t, block("a.example.org")+block("b.example.org"))
	defer func() { stopCoreDNS(t, inst) }()
	c := &dns.Client{Net: "udp", Timeout: 3 * time.Second}
	for _, name := range []string{"x.a.example.org.", "x.b.example.org."} {
		if _, err := ask(c, addr, name); err != nil {
			t.Fatal(err)
		}
	}
	if s.byUDP.Load() != 2 {
		t.Fatalf("%d queries over UDP, want one per block", s.byUDP.Load())
	}
	if n := newConnManagers(before); n != 1 {
		t.Errorf("%d proxies started for two blocks forwarding to one address, want one", n)
	}

	before = connManagers()
	reloaded, err := inst.Restart(caddy.CaddyfileInput{Contents: []byte(block("a.example.org") + block("b.example.org")), ServerTypeName: "dns"})
	if err != nil {
		t.Fatal(err)
	}
	inst = reloaded
	if _, err := ask(c, udpAddr(t, inst), "y.a.example.org."); err != nil {
		t.Fatal(err)
	}
	if n := newConnManagers(before); n != 1 {
		t.Errorf("%d proxies started after a reload, want a new one", n)
	}
}

// TestProxyPool checks that a pool hands out one proxy per address and options, and forgets it with its last
// holder only.
func TestProxyPool(t *testing.T) {
	pp := newProxyPool()
	cfg := Config{Expire: defaultExpire, HealthCheck: defaultHealthCheck}
	a := pp.acquire("127.0.0.1:53", cfg)
	b := pp.acquire("127.0.0.1:53", cfg)
	if a != b {
		t.Fatal("two holds on one address and options got two proxies")
	}
	udp := cfg
	udp.PreferUDP = true
	if pp.acquire("127.0.0.1:53", udp) == a || pp.acquire("127.0.0.2:53", cfg) == a {
		t.Fatal("another transport or address got the same proxy")
	}
	pp.release(a)
	if pp.acquire("127.0.0.1:53", cfg) != a {
		t.Fatal("the proxy was dropped while held")
	}
	pp.release(a)
	pp.release(b)
	if c := pp.acquire("127.0.0.1:53", cfg); c == a {
		t.Fatal("the proxy outlived its last holder")
	}
}
