//go:build linux

package wirecache

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	_ "github.com/coredns/coredns/plugin/chaos"
	_ "github.com/coredns/coredns/plugin/debug"
	_ "github.com/coredns/coredns/plugin/grpc_server"
	_ "github.com/coredns/coredns/plugin/https"
	_ "github.com/coredns/coredns/plugin/https3"
	_ "github.com/coredns/coredns/plugin/metadata"
	_ "github.com/coredns/coredns/plugin/multisocket"
	_ "github.com/coredns/coredns/plugin/proxyproto"
	_ "github.com/coredns/coredns/plugin/quic"
	_ "github.com/coredns/coredns/plugin/root"
	_ "github.com/coredns/coredns/plugin/shed"
	_ "github.com/coredns/coredns/plugin/timeouts"
	_ "github.com/coredns/coredns/plugin/trace"
	_ "github.com/coredns/coredns/plugin/tsig"
	_ "github.com/coredns/coredns/plugin/view"

	"github.com/miekg/dns"
)

// optionCase is one listener or server option of CoreDNS v1.15, in a Corefile whose wirecache block answers
// A queries under example.org from template, on 127.0.0.1.
type optionCase struct {
	name string
	// options are lines of the wirecache block; other is another block, on the same address, put first
	// (%[1]d is the port, %[2]s the wirecache block's fastpath setting, on or off).
	options, other string
	// noBind leaves the wirecache block on the wildcard address.
	noBind bool
	// sockets is how many sockets CoreDNS opens on the address (multisocket), when more than one.
	sockets int
	// fast is whether the address gets a fast path with fastpath on.
	fast bool
	// check, if set, checks more of the two instances once the datagrams are answered.
	check func(t *testing.T, on, off optionServer)
}

// optionServer is one of the two instances of an optionCase.
type optionServer struct {
	inst     *caddy.Instance
	addr     string // host:port
	server   string // dnsserver.Server.Addr
	fastpath string // on or off
	// udpReplies counts the UDP replies it sent.
	udpReplies int
	// hits0 and decorated0 are wirecache's hits and the test decorator's writes for the address when the
	// instance started: with -count, an earlier run may have used the same port, and the counters are the
	// process's.
	hits0      float64
	decorated0 int64
}

func (c optionCase) corefile(port int, fastpath string) string {
	bind := "bind 127.0.0.1"
	if c.noBind {
		bind = ""
	}
	var b strings.Builder
	if c.other != "" {
		fmt.Fprintf(&b, c.other, port, fastpath)
	}
	fmt.Fprintf(&b, ".:%d {\n %s\n %s\n wirecache {\n  fastpath %s\n }\n template IN A example.org {\n  answer \"{{ .Name }} 60 IN A 192.0.2.3\"\n }\n}\n",
		port, bind, c.options, fastpath)
	return b.String()
}

const (
	optionTSIGKey    = "node.key."
	optionTSIGSecret = "c2VjcmV0IG9mIHRoZSBub2RlIGNhY2hlIHRlc3Q="
)

// optionCases are the options, each against the same block with fastpath off.
var optionCases = []optionCase{
	{name: "none", fast: true},
	{name: "proxyproto", options: "proxyproto", fast: false},
	{name: "proxyproto in another block", other: "example.net:%[1]d {\n bind 127.0.0.1\n proxyproto {\n  allow 127.0.0.0/8\n }\n template IN A example.net {\n  answer \"{{ .Name }} 60 IN A 192.0.2.8\"\n }\n}\n", fast: false},
	{name: "proxyproto udp_session_tracking", options: "proxyproto {\n  udp_session_tracking 30s 100\n }", fast: false},
	{name: "proxyproto tlv_metadata", options: "proxyproto {\n  tlv_metadata\n }", fast: false},
	{name: "shed", options: "shed", fast: false},
	{name: "shed in another block", other: "example.net:%[1]d {\n bind 127.0.0.1\n shed\n template IN A example.net {\n  answer \"{{ .Name }} 60 IN A 192.0.2.8\"\n }\n}\n", fast: false,
		check: noUDPHits},
	{name: "writer decorator in another block", other: "example.net:%[1]d {\n bind 127.0.0.1\n " + testOptionDirective + " decorator %[2]s-%[1]d\n template IN A example.net {\n  answer \"{{ .Name }} 60 IN A 192.0.2.8\"\n }\n}\n", fast: false,
		check: func(t *testing.T, on, off optionServer) {
			noUDPHits(t, on, off)
			for _, s := range []optionServer{on, off} {
				port := s.addr[strings.LastIndexByte(s.addr, ':')+1:]
				if got := decoratedWrites(s.fastpath+"-"+port).Load() - s.decorated0; got != int64(s.udpReplies) {
					t.Errorf("fastpath %s: the decorator saw %d replies of the %d UDP replies sent", s.fastpath, got, s.udpReplies)
				}
			}
		}},
	{name: "opcode UPDATE in another block (dynupdate)", other: "example.net:%[1]d {\n bind 127.0.0.1\n " + testOptionDirective + " opcode UPDATE\n template IN A example.net {\n  answer \"{{ .Name }} 60 IN A 192.0.2.8\"\n }\n}\n", fast: false},
	{name: "view", other: ".:%[1]d {\n bind 127.0.0.1\n view mixed {\n  expr name() == 'A.Example.ORG.'\n }\n template IN A example.org {\n  answer \"{{ .Name }} 60 IN A 192.0.2.9\"\n }\n}\n", fast: false},
	{name: "wildcard address", noBind: true, fast: false},
	{name: "metadata", options: "metadata", fast: false},
	{name: "multisocket", options: "multisocket 2", sockets: 2, fast: true},
	{name: "timeouts", options: "timeouts {\n  read 2s\n  write 2s\n  idle 2s\n  maxtcpqueries 3\n }", fast: true},
	{name: "tsig in another block", other: "example.net:%[1]d {\n bind 127.0.0.1\n tsig {\n  secret " + optionTSIGKey + " " + optionTSIGSecret + "\n  require all\n }\n template IN A example.net {\n  answer \"{{ .Name }} 60 IN A 192.0.2.8\"\n }\n}\n", fast: true},
	{name: "trace", options: "trace zipkin 127.0.0.1:9", fast: false},
	{name: "trace in another block", other: "example.net:%[1]d {\n bind 127.0.0.1\n trace zipkin 127.0.0.1:9\n template IN A example.net {\n  answer \"{{ .Name }} 60 IN A 192.0.2.8\"\n }\n}\n", fast: true},
	{name: "debug", options: "debug", fast: true},
	{name: "errors stacktrace", options: "errors {\n  stacktrace\n }", fast: true},
	{name: "root", options: "root /", fast: true},
	{name: "chaos", options: "chaos CoreDNS-test", fast: true},
	{name: "tls", options: testOptionDirective + " tls", fast: true},
	{name: "https request validation", options: testOptionDirective + " validate", fast: true},
	{name: "quic limits", options: "quic {\n  max_streams 5\n  max_connections 5\n  worker_pool_size 2\n }", fast: true},
	{name: "grpc_server limits", options: "grpc_server {\n  max_streams 5\n  max_connections 5\n }", fast: true},
	{name: "https limits", options: "https {\n  max_connections 5\n  max_streams 5\n }", fast: true},
	{name: "https3 limits", options: "https3 {\n  max_streams 5\n  max_connections 5\n }", fast: true},
}

// noUDPHits requires that wirecache answered no UDP query of either instance itself (a UDP writer
// decorator on the address must see every reply), and that it still answers TCP ones.
func noUDPHits(t *testing.T, on, off optionServer) {
	t.Helper()
	for _, s := range []optionServer{on, off} {
		udpHits := counterValue(t, hitsTotal, s.server) - s.hits0
		if udpHits != 0 {
			t.Errorf("fastpath %s: wirecache answered %v UDP queries past the address's writer decorator", s.fastpath, udpHits)
		}
		for range 2 {
			exchange(t, newQuery("tcp.example.org.", dns.TypeA, 0, false), s.addr, true)
		}
		if hits := counterValue(t, hitsTotal, s.server) - s.hits0 - udpHits; hits != 1 {
			t.Errorf("fastpath %s: %v wirecache hits of two TCP queries, want one", s.fastpath, hits)
		}
	}
}

// optionDatagram is a datagram the option tests send, as a client would, once in the first round; repeat
// is set for the queries wirecache stores, sent in every round, and late for datagrams sent in the last
// round only, when the query they are made from is stored.
type optionDatagram struct {
	name         string
	wire         []byte
	repeat, late bool
}

// sentIn reports whether d is sent in round (0 to 2).
func (d optionDatagram) sentIn(round int) bool {
	switch {
	case d.repeat:
		return true
	case d.late:
		return round == 2
	}
	return round == 0
}

// proxyV2 returns a PROXY protocol version 2 header for a UDP datagram from 192.0.2.77:5353 to to, followed by
// payload.
func proxyV2(to netip.AddrPort, payload []byte) []byte {
	b := []byte("\r\n\r\n\x00\r\nQUIT\n")
	b = append(b, 0x21, 0x12) // version 2, PROXY; IPv4, datagram
	b = binary.BigEndian.AppendUint16(b, 12)
	b = append(b, 192, 0, 2, 77)
	b = append(b, to.Addr().AsSlice()...)
	b = binary.BigEndian.AppendUint16(b, 5353)
	b = binary.BigEndian.AppendUint16(b, to.Port())
	return append(b, payload...)
}

// optionDatagrams are the datagrams each option is tried with: queries the fast path answers once they are
// hits, and queries the server's own checks answer or drop.
func optionDatagrams(t *testing.T) []optionDatagram {
	t.Helper()
	pack := func(m *dns.Msg) []byte { return mustPack(t, m) }
	var out []optionDatagram
	add := func(name string, m *dns.Msg) { out = append(out, optionDatagram{name: name, wire: pack(m)}) }
	stored := func(name string, m *dns.Msg) {
		out = append(out, optionDatagram{name: name, wire: pack(m), repeat: true})
	}

	stored("A", newQuery("a.example.org.", dns.TypeA, 0, false))
	stored("A EDNS DO", newQuery("a.example.org.", dns.TypeA, 1232, true))
	stored("A mixed case", newQuery("A.Example.ORG.", dns.TypeA, 1232, false))
	stored("A in example.net", newQuery("b.example.net.", dns.TypeA, 1232, false))
	add("AAAA", newQuery("a.example.org.", dns.TypeAAAA, 1232, false))
	// The stored query as a response (the server ignores it) and as a NOTIFY (it goes down the chain).
	response := newQuery("a.example.org.", dns.TypeA, 0, false)
	response.Response = true
	out = append(out, optionDatagram{name: "A with QR set", wire: pack(response), late: true})
	notify := newQuery("a.example.org.", dns.TypeA, 0, false)
	notify.Opcode = dns.OpcodeNotify
	out = append(out, optionDatagram{name: "A as NOTIFY", wire: pack(notify), late: true})
	ch := newQuery("version.bind.", dns.TypeTXT, 0, false)
	ch.Question[0].Qclass = dns.ClassCHAOS
	add("CH TXT version.bind", ch)
	v1 := newQuery("a.example.org.", dns.TypeA, 1232, false)
	v1.IsEdns0().SetVersion(1)
	add("EDNS version 1", v1)
	update := newQuery("b.example.net.", dns.TypeSOA, 0, false)
	update.Opcode = dns.OpcodeUpdate
	add("UPDATE", update)
	signed := newQuery("a.example.org.", dns.TypeA, 0, false)
	signed.SetTsig(optionTSIGKey, dns.HmacSHA256, 300, time.Now().Unix())
	wire, _, err := dns.TsigGenerate(signed, optionTSIGSecret, "", false)
	if err != nil {
		t.Fatal(err)
	}
	// The PROXY header's destination is not checked; any address does.
	to := netip.MustParseAddrPort("127.0.0.1:53")
	out = append(out,
		optionDatagram{name: "A signed with TSIG", wire: wire},
		optionDatagram{name: "no question", wire: []byte{0x10, 0x92, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
		optionDatagram{name: "garbage", wire: []byte{0x12, 0x34, 0x01}},
		// Sent again: the fast path answered each such datagram NOTIMP (ID 0x0d0a), once steered.
		optionDatagram{name: "PROXY v2, A", wire: proxyV2(to, pack(newQuery("p.example.org.", dns.TypeA, 1232, false))), repeat: true},
		optionDatagram{name: "PROXY v2 header alone", wire: proxyV2(to, nil)},
	)
	return out
}

// optionReplyWait bounds the wait for a reply; a datagram that gets none from either instance within it is
// a non-answer for both.
const optionReplyWait = 3 * time.Second

// askDatagram sends d to addr from a socket of its own and returns the reply, or nil for none.
func askDatagram(t *testing.T, addr string, d []byte) []byte {
	conn, err := net.Dial("udp", addr)
	if err != nil {
		t.Error(err)
		return nil
	}
	defer conn.Close()
	if _, err := conn.Write(d); err != nil {
		t.Error(err)
		return nil
	}
	_ = conn.SetReadDeadline(time.Now().Add(optionReplyWait))
	buf := make([]byte, 65535)
	n, err := conn.Read(buf)
	if err != nil {
		return nil
	}
	return buf[:n]
}

// settleFastPath asks s's address a first query, which has the instance decide whether the address gets a
// fast path, waits for that decision and, when it does, until the address's queries are steered to it. It
// returns the fast path, or nil. The deadline only bounds a failure.
func settleFastPath(t *testing.T, s *optionServer) *fastPath {
	t.Helper()
	if askDatagram(t, s.addr, mustPack(t, newQuery("start.fastpath.invalid.", dns.TypeA, 0, false))) != nil {
		s.udpReplies++
	}
	f, ok := s.inst.Storage[fastPathsKey{}].(*fastPaths)
	if !ok {
		return nil
	}
	// The first query reached wirecache, which started the decision before the reply left. It did so
	// holding f.mu: taking the lock first orders that start before the wait, as the reply did (the race
	// detector does not see what a network round trip orders).
	f.mu.Lock()
	f.mu.Unlock() //nolint:staticcheck // an empty critical section: it orders notice's start before the wait
	f.starting.Wait()
	f.mu.Lock()
	fp := f.servers[s.server]
	decided := len(f.servers)
	f.mu.Unlock()
	if fp == nil {
		if s.fastpath == "on" && decided == 0 {
			t.Logf("fastpath on: wirecache did not consider a fast path for %s (it steps aside or its block does not qualify)", s.server)
		}
		return nil
	}
	deadline := time.Now().Add(time.Minute)
	for gaugeValue(t, fastPathSteered, s.server) != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("the fast path of %s was not steered to within a minute", s.server)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fp
}

// optionRun is an optionCase being tried: its two instances, and what they answered.
type optionRun struct {
	optionCase
	on, off *optionServer
	fp      *fastPath
	// ownSockets is how many sockets this process has on the address of the instance with fastpath on.
	ownSockets int
	// fastRead and fastPassed are the fast path's counts before the datagrams were sent.
	fastRead, fastPassed float64
	datagrams            []optionDatagram
	// replies[round][side][i] is the reply to datagrams[i] in a round (0 to 2), side 0 with fastpath on
	// and 1 with it off.
	replies [3][2][][]byte
}

// wantSockets is how many sockets the instance with fastpath on should have on its address: CoreDNS's, and
// the fast path's if it has one.
func (r *optionRun) wantSockets() int {
	n := max(r.sockets, 1)
	if r.fp != nil {
		n++
	}
	return n
}

// TestFastPathOptions runs each listener and server option of CoreDNS v1.15 with the wirecache block's
// fastpath on and off, sends both the same datagrams, the queries wirecache stores three times (so that
// they are hits from the second time on) and the others once, and requires the same replies, or no reply
// from either. It also requires the fast path where the option lets it answer (and that it answered
// hits), and no fast path, not even a socket in the address's group, where the option keeps the address
// in the chain. The options are tried side by side, since a datagram without a reply costs a wait.
func TestFastPathOptions(t *testing.T) {
	useDirectives(t)
	runs := make([]*optionRun, len(optionCases))
	for i, c := range optionCases {
		r := &optionRun{optionCase: c}
		for _, fastpath := range []string{"on", "off"} {
			port := freePort(t)
			s := &optionServer{
				inst: startCoreDNS(t, c.corefile(port, fastpath)), addr: fmt.Sprintf("127.0.0.1:%d", port),
				server: fmt.Sprintf("dns://127.0.0.1:%d", port), fastpath: fastpath,
			}
			if c.noBind {
				s.server = fmt.Sprintf("dns://:%d", port)
			}
			s.hits0, s.decorated0 = counterValue(t, hitsTotal, s.server), decoratedWrites(fastpath+"-"+strconv.Itoa(port)).Load()
			if fastpath == "on" {
				r.on = s
			} else {
				r.off = s
			}
		}
		r.fp = settleFastPath(t, r.on)
		if settleFastPath(t, r.off) != nil {
			t.Fatalf("%s: fastpath off, and the address has a fast path", c.name)
		}
		r.datagrams = optionDatagrams(t)
		runs[i] = r
	}
	// Before any datagram is sent: /proc/net/udp, which the socket count reads, may skip sockets while others
	// open and close (see ownSockets).
	for _, r := range runs {
		local := netip.MustParseAddrPort(r.on.addr)
		if r.noBind {
			// A wildcard server listens on both families, through one IPv6 socket.
			local = netip.AddrPortFrom(netip.IPv6Unspecified(), local.Port())
		}
		r.ownSockets = ownSockets(t, local, r.wantSockets())
		r.fastRead, r.fastPassed = counterValue(t, fastPathQueries, r.on.server), counterValue(t, fastPathPassed, r.on.server)
	}
	for round := range 3 {
		var wg sync.WaitGroup
		for _, r := range runs {
			for side, s := range []*optionServer{r.on, r.off} {
				r.replies[round][side] = make([][]byte, len(r.datagrams))
				for i, d := range r.datagrams {
					if !d.sentIn(round) {
						continue
					}
					wg.Go(func() { r.replies[round][side][i] = askDatagram(t, s.addr, d.wire) })
				}
			}
		}
		wg.Wait()
	}

	for _, r := range runs {
		t.Run(r.name, func(t *testing.T) {
			if (r.fp != nil) != r.fast {
				t.Errorf("fastpath on: the address has a fast path: %v, want %v", r.fp != nil, r.fast)
			}
			if want := r.wantSockets(); r.ownSockets != want {
				t.Errorf("fastpath on: %d sockets of this process on %s, want %d", r.ownSockets, r.on.addr, want)
			}
			for round := range 3 {
				for i, d := range r.datagrams {
					got, want := r.replies[round][0][i], r.replies[round][1][i]
					if got != nil {
						r.on.udpReplies++
					}
					if want != nil {
						r.off.udpReplies++
					}
					switch {
					case got == nil && want == nil:
					case got == nil || want == nil:
						t.Errorf("round %d, %s: reply %x with fastpath on, %x with it off", round+1, d.name, got, want)
					case bytes.Equal(got, want):
					default:
						if err := sameApartFromTTL(got, want); err != nil {
							t.Errorf("round %d, %s: %v", round+1, d.name, err)
						}
					}
				}
			}
			if r.fp != nil {
				read := counterValue(t, fastPathQueries, r.on.server) - r.fastRead
				passed := counterValue(t, fastPathPassed, r.on.server) - r.fastPassed
				if read-passed < 2 {
					t.Errorf("the fast path read %v datagrams and answered %v itself, want the hits of rounds 2 and 3", read, read-passed)
				}
			}
			if r.check != nil {
				r.check(t, *r.on, *r.off)
			}
		})
	}
}

// TestChainServerIsCoreDNSs compares the miekg/dns server the fast path passes datagrams to with the one
// CoreDNS's server serves its UDP socket with (dnsserver.Server.ServePacket), once both serve: every
// setting but the connection, the handler and the start notification must be the same.
func TestChainServerIsCoreDNSs(t *testing.T) {
	cfg := &dnsserver.Config{Zone: ".", ListenHosts: []string{"127.0.0.1"}, Port: "0", Transport: "dns",
		TsigSecret: map[string]string{optionTSIGKey: optionTSIGSecret}}
	srv, err := dnsserver.NewServer("dns://127.0.0.1:0", []*dnsserver.Config{cfg})
	if err != nil {
		t.Fatal(err)
	}
	theirsConn, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.ServePacket(theirsConn) }()
	defer srv.Stop()
	// A block without plugins: the server answers REFUSED, so a reply says its miekg/dns server is serving.
	if askDatagram(t, theirsConn.LocalAddr().String(), mustPack(t, newQuery("example.org.", dns.TypeA, 0, false))) == nil {
		t.Fatal("CoreDNS's server did not answer")
	}
	theirs := coreDNSServer(t, srv, 1)

	oursConn, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ours := chainServer(srv, oursConn)
	if err := activate(ours); err != nil {
		t.Fatal(err)
	}
	defer ours.Shutdown()

	sameServerSettings(t, ours, theirs, "PacketConn")
}
