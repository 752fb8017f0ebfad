package wirecache

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/file"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/whoami"

	"github.com/nodelocaldns/nodelocaldns"
	_ "github.com/nodelocaldns/nodelocaldns/plugin/clamp"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
)

var directivesOnce sync.Once

// useDirectives sets CoreDNS's directive order to plugin.cfg's, the order every build of ours runs: wirecache
// ahead of prometheus (metrics), errors, log, clamp and cache.
func useDirectives(t *testing.T) {
	directivesOnce.Do(func() {
		order, err := nodelocaldns.Directives()
		if err != nil {
			t.Fatalf("reading plugin.cfg: %v", err)
		}
		// The test plugin that sets the server options no plugin of this module's build sets (see
		// fastpath_options_test.go); last, since it only configures.
		order = append(order, testOptionDirective)
		if err := dnsserver.SetDirectives(order); err != nil {
			t.Fatal(err)
		}
		caddy.Quiet = true
		dnsserver.Quiet = true
	})
}

// freePort returns a loopback port free for both UDP and TCP, so one address serves both transports.
func freePort(t *testing.T) int { return freePortOn(t, "127.0.0.1") }

// freePortOn returns a port of host free for both UDP and TCP.
func freePortOn(t *testing.T, host string) int {
	t.Helper()
	for range 50 {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		pc, err := net.ListenPacket("udp", net.JoinHostPort(host, fmt.Sprint(port)))
		l.Close()
		if err == nil {
			pc.Close()
			return port
		}
	}
	t.Fatalf("no port of %s free for both UDP and TCP", host)
	return 0
}

// startCoreDNS starts an instance serving corefile until the test ends, and returns it.
func startCoreDNS(t *testing.T, corefile string) *caddy.Instance {
	t.Helper()
	useDirectives(t)
	inst, err := caddy.Start(caddy.CaddyfileInput{Contents: []byte(corefile), ServerTypeName: "dns"})
	if err != nil {
		t.Fatalf("starting CoreDNS with\n%s\n%v", corefile, err)
	}
	t.Cleanup(func() {
		inst.ShutdownCallbacks()
		inst.Stop()
	})
	return inst
}

// exchange sends q to addr over UDP or TCP and returns the raw reply.
func exchange(t *testing.T, q *dns.Msg, addr string, tcp bool) []byte {
	t.Helper()
	wire, err := q.Pack()
	if err != nil {
		t.Fatal(err)
	}
	network := "udp"
	if tcp {
		network = "tcp"
		wire = append(binary.BigEndian.AppendUint16(nil, uint16(len(wire))), wire...)
	}
	conn, err := net.DialTimeout(network, addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write(wire); err != nil {
		t.Fatal(err)
	}
	if tcp {
		var l [2]byte
		if _, err := io.ReadFull(conn, l[:]); err != nil {
			t.Fatalf("reading the TCP reply length from %s: %v", addr, err)
		}
		reply := make([]byte, binary.BigEndian.Uint16(l[:]))
		if _, err := io.ReadFull(conn, reply); err != nil {
			t.Fatalf("reading the TCP reply from %s: %v", addr, err)
		}
		return reply
	}
	buf := make([]byte, dns.MaxMsgSize)
	n, err := conn.Read(buf)
	if err != nil {
		t.Fatalf("reading the UDP reply from %s: %v", addr, err)
	}
	return buf[:n]
}

// sumCounter adds up a counter vector over all its label values.
func sumCounter(vec *prometheus.CounterVec) float64 {
	ch := make(chan prometheus.Metric, 16)
	go func() { vec.Collect(ch); close(ch) }()
	sum := 0.0
	for m := range ch {
		sum += value(m)
	}
	return sum
}

const differentialZone = `$ORIGIN example.org.
@          3600 IN SOA   ns hostmaster 1 7200 3600 1209600 300
@          3600 IN NS    ns
ns         3600 IN A     192.0.2.53
www         300 IN A     192.0.2.1
www         300 IN A     192.0.2.2
www         300 IN AAAA  2001:db8::1
alias       300 IN CNAME mid
mid         300 IN CNAME www
mail        300 IN MX    10 mx1
mail        300 IN MX    20 mx2
mx1         300 IN A     192.0.2.25
mx2         300 IN A     192.0.2.26
txt         300 IN TXT   "v=spf1 -all"
_sip._udp   300 IN SRV   10 60 5060 sip
sip         300 IN A     192.0.2.60
`

// txtRecords returns n TXT records of about 110 bytes each, for answers of a chosen size.
func txtRecords(owner string, n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "%s 300 IN TXT \"%02d-%s\"\n", owner, i, strings.Repeat("y", 96))
	}
	return b.String()
}

// startDifferentialPair serves zoneText (example.org) from an upstream, and starts two servers forwarding
// to it through errors and cache, one with wirecache ahead of them; it returns their addresses once the
// one with wirecache has its fast path steered to.
func startDifferentialPair(t *testing.T, zoneText string) (withAddr, withoutAddr string) {
	t.Helper()
	zoneFile := filepath.Join(t.TempDir(), "example.org.db")
	if err := os.WriteFile(zoneFile, []byte(zoneText), 0o600); err != nil {
		t.Fatal(err)
	}
	upstream, with, without := freePort(t), freePort(t), freePort(t)
	// servfail.test answers SERVFAIL to everything; every other name is REFUSED (no zone).
	startCoreDNS(t, fmt.Sprintf("example.org:%d {\n bind 127.0.0.1\n file %s\n}\nservfail.test:%d {\n bind 127.0.0.1\n template ANY ANY {\n rcode SERVFAIL\n }\n}\n",
		upstream, zoneFile, upstream))
	block := func(port int, extra string) string {
		return fmt.Sprintf(".:%d {\n bind 127.0.0.1\n %s\n errors\n cache\n forward . 127.0.0.1:%d\n}\n", port, extra, upstream)
	}
	startCoreDNS(t, block(with, "wirecache"))
	startCoreDNS(t, block(without, ""))
	withAddr, withoutAddr = fmt.Sprintf("127.0.0.1:%d", with), fmt.Sprintf("127.0.0.1:%d", without)
	waitFastPathSteered(t, "dns://"+withAddr, withAddr)
	return withAddr, withoutAddr
}

// TestDifferential answers a corpus of queries with the same server block with and without wirecache and
// requires the same replies, byte for byte, apart from TTLs that counted down.
func TestDifferential(t *testing.T) {
	withAddr, withoutAddr := startDifferentialPair(t, differentialZone+txtRecords("medium", 6)+txtRecords("large", 12)+txtRecords("huge", 30))
	// UDP queries to the block with wirecache are answered by its fast path: the corpus checks its replies.
	withServer := "dns://" + withAddr
	fastBefore := counterValue(t, fastPathQueries, withServer)
	udpQueries := 0

	type question struct {
		name  string
		qtype uint16
	}
	questions := []question{
		{"www.example.org.", dns.TypeA}, {"www.example.org.", dns.TypeAAAA}, {"alias.example.org.", dns.TypeA},
		{"mail.example.org.", dns.TypeMX}, {"txt.example.org.", dns.TypeTXT}, {"_sip._udp.example.org.", dns.TypeSRV},
		{"nope.example.org.", dns.TypeA}, {"www.example.org.", dns.TypeMX}, {"medium.example.org.", dns.TypeTXT},
		{"large.example.org.", dns.TypeTXT}, {"huge.example.org.", dns.TypeTXT},
		// Outside the upstream's zones: REFUSED, which the block with wirecache holds (refused); and a SERVFAIL,
		// which it holds too (servfail) where the block without it has the cache plugin hold it.
		{"outside.example.net.", dns.TypeA}, {"x.servfail.test.", dns.TypeA},
	}
	type flags struct{ do, cd, ad bool }
	flagSets := []flags{{}, {do: true}, {cd: true}, {do: true, cd: true}, {ad: true}}
	sizes := []uint16{0, 512, 1232, 4096}

	var id uint16
	queries, expectedHits, hits := 0, 0, 0
	stored := map[string]bool{} // the questions and flags an untruncated reply was seen for
	for _, qu := range questions {
		for _, size := range sizes {
			for _, fl := range flagSets {
				if size == 0 && fl.do {
					continue // DO lives in the OPT record
				}
				for _, spelled := range []string{qu.name, mixCase(qu.name)} {
					for _, tcp := range []bool{false, true} {
						for round := 1; round <= 3; round++ {
							id++
							q := newQuery(spelled, qu.qtype, size, fl.do)
							q.Id, q.CheckingDisabled, q.AuthenticatedData = id, fl.cd, fl.ad
							before := sumCounter(hitsTotal)
							got := exchange(t, q, withAddr, tcp)
							if !tcp {
								udpQueries++
							}
							hit := sumCounter(hitsTotal) > before
							want := exchange(t, q, withoutAddr, tcp)
							queries++
							label := fmt.Sprintf("%s %s size=%d %+v tcp=%v round %d", spelled, dns.TypeToString[qu.qtype], size, fl, tcp, round)
							if err := sameApartFromTTL(got, want); err != nil {
								t.Errorf("%s (wirecache hit: %v): %v", label, hit, err)
							}
							if hit {
								hits++
							}
							// From the second round on, every reply must come from wirecache, in any spelling,
							// and so must a truncated one once an untruncated reply of its question and flags
							// was stored (the server truncates it from the entry): an upstream's truncated
							// reply is never stored.
							reply := new(dns.Msg)
							if err := reply.Unpack(want); err != nil {
								t.Fatalf("%s: %v", label, err)
							}
							key := fmt.Sprintf("%s %d edns=%v %+v", qu.name, qu.qtype, size > 0, fl)
							if !reply.Truncated {
								stored[key] = true
							}
							if round > 1 && (!reply.Truncated || stored[key]) {
								expectedHits++
								if !hit {
									t.Errorf("%s: not answered by wirecache", label)
								}
							}
						}
					}
				}
			}
		}
	}
	t.Logf("%d queries to each server, %d wirecache hits (%d required)", queries, hits, expectedHits)
	if fast := counterValue(t, fastPathQueries, withServer) - fastBefore; fast < float64(udpQueries) {
		t.Errorf("the fast path read %v of the %d UDP queries", fast, udpQueries)
	}
	if expectedHits == 0 || hits < expectedHits {
		t.Errorf("%d hits, want at least %d", hits, expectedHits)
	}
}

// sameApartFromTTL compares two replies byte for byte with their TTL fields masked, and requires those TTLs
// to differ by at most two seconds.
func sameApartFromTTL(got, want []byte) error {
	if len(got) != len(want) {
		return fmt.Errorf("lengths differ: %d and %d bytes\n got %x\nwant %x", len(got), len(want), got, want)
	}
	offsets, err := ttlOffsetList(want)
	if err != nil {
		return fmt.Errorf("walking the reply without wirecache: %v", err)
	}
	gotOffsets, err := ttlOffsetList(got)
	if err != nil {
		return fmt.Errorf("walking the reply with wirecache: %v", err)
	}
	if !slices.Equal(offsets, gotOffsets) {
		return fmt.Errorf("records at different offsets\n got %x\nwant %x", got, want)
	}
	g, w := slices.Clone(got), slices.Clone(want)
	for _, off := range offsets {
		gt, wt := int64(binary.BigEndian.Uint32(g[off:])), int64(binary.BigEndian.Uint32(w[off:]))
		if gt-wt > 2 || wt-gt > 2 {
			return fmt.Errorf("TTL %d with wirecache, %d without", gt, wt)
		}
		binary.BigEndian.PutUint32(g[off:], 0)
		binary.BigEndian.PutUint32(w[off:], 0)
	}
	if string(g) != string(w) {
		return fmt.Errorf("replies differ\n got %x\nwant %x", got, want)
	}
	return nil
}

// TestStepsAsideForPluginsThatSeeEveryQuery runs real server blocks with log and whoami: wirecache must
// answer none of their queries.
func TestStepsAsideForPluginsThatSeeEveryQuery(t *testing.T) {
	logPort, whoamiPort := freePort(t), freePort(t)
	// ttl 30 60 would keep whoami's TTL-0 answer for 30 s if wirecache did not step aside.
	startCoreDNS(t, fmt.Sprintf(".:%d {\n bind 127.0.0.1\n wirecache {\n ttl 30 60\n }\n log\n whoami\n}\n", logPort))
	startCoreDNS(t, fmt.Sprintf(".:%d {\n bind 127.0.0.1\n wirecache {\n ttl 30 60\n }\n whoami\n}\n", whoamiPort))
	before := sumCounter(hitsTotal) + sumCounter(missesTotal)
	for _, port := range []int{logPort, whoamiPort} {
		var ports []uint16
		for range 3 {
			reply := new(dns.Msg)
			if err := reply.Unpack(exchange(t, newQuery("example.org.", dns.TypeA, 0, false), fmt.Sprintf("127.0.0.1:%d", port), false)); err != nil {
				t.Fatal(err)
			}
			for _, rr := range reply.Extra {
				if srv, ok := rr.(*dns.SRV); ok {
					ports = append(ports, srv.Port)
				}
			}
		}
		// Each query comes from a new socket, so whoami reports a new source port each time.
		if len(ports) != 3 || ports[0] == ports[1] || ports[1] == ports[2] {
			t.Errorf("port %d: whoami reported source ports %v, want three different ones", port, ports)
		}
	}
	if after := sumCounter(hitsTotal) + sumCounter(missesTotal); after != before {
		t.Errorf("wirecache counted %v queries in blocks it must step aside from", after-before)
	}
}

// clampZone has TTLs of 30 seconds, with clamp's MIN at 29, so a test sees a wirecache entry count below the
// MIN within two seconds, and the entry still lives long after that however busy the machine is.
// Names under in.example.org are in clamp's zones, www.example.org is not.
const clampZone = `$ORIGIN example.org.
@          30 IN SOA   ns hostmaster 1 7200 3600 1209600 30
@          30 IN NS    ns
ns         30 IN A     192.0.2.53
www        30 IN A     192.0.2.1
www.in     30 IN A     192.0.2.2
`

// TestServerHitsKeepClampWindow runs plugin.cfg's order with wirecache, clamp and cache in one block: a hit
// whose stored TTLs have counted below clamp's MIN is served with the MIN, as a cache hit through clamp would
// be, while a name outside clamp's zones keeps counting down.
func TestServerHitsKeepClampWindow(t *testing.T) {
	zoneFile := filepath.Join(t.TempDir(), "example.org.db")
	if err := os.WriteFile(zoneFile, []byte(clampZone), 0o600); err != nil {
		t.Fatal(err)
	}
	upstream, node := freePort(t), freePort(t)
	// servfail.test answers SERVFAIL to everything; every other name is REFUSED (no zone).
	startCoreDNS(t, fmt.Sprintf("example.org:%d {\n bind 127.0.0.1\n file %s\n}\nservfail.test:%d {\n bind 127.0.0.1\n template ANY ANY {\n rcode SERVFAIL\n }\n}\n",
		upstream, zoneFile, upstream))
	startCoreDNS(t, fmt.Sprintf(`.:%d {
 bind 127.0.0.1
 wirecache
 clamp in.example.org {
  success 29 30
  denial 29 30
 }
 cache
 forward . 127.0.0.1:%d
}
`, node, upstream))
	addr := fmt.Sprintf("127.0.0.1:%d", node)

	type question struct {
		name    string
		qtype   uint16
		clamped bool
	}
	questions := []question{
		{"www.in.example.org.", dns.TypeA, true},
		{"nope.in.example.org.", dns.TypeA, true}, // NXDOMAIN: the denial window
		{"www.example.org.", dns.TypeA, false},
	}
	ask := func(qu question) (ttls []uint32, hit bool) {
		t.Helper()
		before := sumCounter(hitsTotal)
		reply := new(dns.Msg)
		if err := reply.Unpack(exchange(t, newQuery(qu.name, qu.qtype, 1232, false), addr, false)); err != nil {
			t.Fatal(err)
		}
		hit = sumCounter(hitsTotal) > before
		for _, section := range [][]dns.RR{reply.Answer, reply.Ns, reply.Extra} {
			for _, r := range section {
				if r.Header().Rrtype != dns.TypeOPT {
					ttls = append(ttls, r.Header().Ttl)
				}
			}
		}
		if len(ttls) == 0 {
			t.Fatalf("%s: no records in the reply %v", qu.name, reply)
		}
		return ttls, hit
	}
	for _, qu := range questions {
		if _, hit := ask(qu); hit {
			t.Fatalf("%s: first query answered by wirecache", qu.name)
		}
	}
	// Every entry is stored with TTL 30 and lives 30 s; after 2.5 s a hit counts them down to 28 or less.
	time.Sleep(2500 * time.Millisecond)
	for _, qu := range questions {
		ttls, hit := ask(qu)
		if !hit {
			t.Fatalf("%s: not answered by wirecache", qu.name)
		}
		clampedTTLs := !slices.ContainsFunc(ttls, func(ttl uint32) bool { return ttl != 29 })
		countedDown := !slices.ContainsFunc(ttls, func(ttl uint32) bool { return ttl >= 29 || ttl == 0 })
		switch {
		case qu.clamped && !clampedTTLs:
			t.Errorf("%s: TTLs %v on a hit, want clamp's MIN 29", qu.name, ttls)
		case !qu.clamped && !countedDown:
			t.Errorf("%s: TTLs %v on a hit, want them counted down below 29 (outside clamp's zones)", qu.name, ttls)
		}
	}
}
