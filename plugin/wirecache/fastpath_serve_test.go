//go:build linux

package wirecache

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"net"
	"testing"
	"time"

	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin"

	"github.com/miekg/dns"
)

// newTestChainServers returns chainServers for a CoreDNS server whose one block runs handler, writing
// through a socket on loopback, and a client socket to send from and read the replies on.
func newTestChainServers(t *testing.T, handler plugin.Handler) (*chainServers, *net.UDPConn) {
	t.Helper()
	cfg := &dnsserver.Config{Zone: ".", Port: "53", ListenHosts: []string{"127.0.0.1"}}
	cfg.AddPlugin(func(plugin.Handler) plugin.Handler { return handler })
	srv, err := dnsserver.NewServer("dns://127.0.0.1:53", []*dnsserver.Config{cfg})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	client, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	fp := &fastPath{srv: srv}
	if err := fp.useSocket(conn); err != nil {
		t.Fatal(err)
	}
	fp.chain = &chainConn{fp: fp, queue: make(chan passedQuery, passQueue), closed: make(chan struct{}), passed: make(chan struct{}, 1)}
	s := newChainServers(fp)
	// The tests trim by hand, unless they set a period of their own.
	s.trimEvery = time.Hour
	return s, client
}

// newHeldChainServers is newTestChainServers with a chain that holds every query until release lets it
// go; arrived (of room for n) tells when each has reached the chain.
func newHeldChainServers(t *testing.T, n int) (s *chainServers, client *net.UDPConn, arrived <-chan struct{}, release chan struct{}) {
	t.Helper()
	release = make(chan struct{})
	in := make(chan struct{}, n)
	s, client = newTestChainServers(t, plugin.HandlerFunc(func(ctx context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
		in <- struct{}{}
		<-release
		return answerA(ctx, w, r)
	}))
	return s, client, in, release
}

// readReplies reads n replies on client and returns their IDs. The deadline only bounds a failure.
func readReplies(client *net.UDPConn, n int) (map[uint16]bool, error) {
	ids := map[uint16]bool{}
	buf := make([]byte, 512)
	for i := range n {
		_ = client.SetReadDeadline(time.Now().Add(10 * time.Second))
		l, _, err := client.ReadFromUDP(buf)
		if err != nil {
			return ids, fmt.Errorf("reply %d of %d: %w", i+1, n, err)
		}
		m := new(dns.Msg)
		if err := m.Unpack(buf[:l]); err != nil {
			return ids, err
		}
		if len(m.Answer) != 1 {
			return ids, fmt.Errorf("reply %d: %v", m.Id, m)
		}
		ids[m.Id] = true
	}
	return ids, nil
}

func answerA(_ context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
	m := new(dns.Msg)
	m.SetReply(r)
	m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: r.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 30}, A: net.IPv4(192, 0, 2, 1)})
	return dns.RcodeSuccess, w.WriteMsg(m)
}

func packedQuery(t *testing.T, id uint16) []byte {
	t.Helper()
	q := newQuery(fmt.Sprintf("q%d.example.org.", id), dns.TypeA, 0, false)
	q.Id = id
	b, err := q.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestChainServersKeepTheirGoroutines hands queries over one at a time, and checks that they are answered
// by goroutines kept between queries rather than one started for each.
func TestChainServersKeepTheirGoroutines(t *testing.T) {
	s, client := newTestChainServers(t, plugin.HandlerFunc(answerA))
	from := client.LocalAddr().(*net.UDPAddr)
	const queries = 100
	for id := range uint16(queries) {
		s.serve(passedQuery{b: packedQuery(t, id), from: from})
		if ids, err := readReplies(client, 1); err != nil || !ids[id] {
			t.Fatalf("query %d: replies %v %v", id, ids, err)
		}
	}
	// One goroutine would do; a few more when a query comes before the last one is back to waiting. A
	// goroutine for each query is the fault this catches.
	if started := s.started.Load(); started > queries/10 {
		t.Errorf("%d goroutines started for %d queries one at a time", started, queries)
	}
	s.close()
	if err := s.wait(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestChainServersBeyondTheKept holds more queries than goroutines are kept in the chain at once: each is
// answered all the same, the kept ones no more than maxKeptServers, and wait waits for every one.
func TestChainServersBeyondTheKept(t *testing.T) {
	s, client, arrived, release := newHeldChainServers(t, maxKeptServers+20)
	from := client.LocalAddr().(*net.UDPAddr)
	const queries = maxKeptServers + 20
	for id := range uint16(queries) {
		s.serve(passedQuery{b: packedQuery(t, id), from: from})
	}
	for range queries {
		<-arrived
	}
	if kept := s.kept.Load(); kept != maxKeptServers {
		t.Errorf("%d goroutines kept, want %d", kept, maxKeptServers)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.wait(ctx); err == nil {
		t.Error("wait returned while every query was held in the chain")
	}
	// One released at a time, each reply read before the next: more replies at once than the client's
	// socket buffer holds would be dropped while the test reads.
	ids := map[uint16]bool{}
	for range queries {
		release <- struct{}{}
		got, err := readReplies(client, 1)
		if err != nil {
			t.Fatalf("after %d replies: %v", len(ids), err)
		}
		maps.Copy(ids, got)
	}
	if len(ids) != queries {
		t.Errorf("%d distinct replies to %d queries", len(ids), queries)
	}
	if err := s.wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Idle for a whole period, the goroutines beyond maxIdleServers end.
	if ended := s.trim(); ended != 0 {
		t.Errorf("the first trim after the burst ended %d goroutines", ended)
	}
	// The next trims end the rest. A goroutine that wait saw done may still be on its way back to idle (its
	// query answered, not yet waiting for the next), and a trim passes over it until it is: on a busy
	// machine that takes more than one.
	ended := 0
	for deadline := time.Now().Add(time.Minute); ended < maxKeptServers-maxIdleServers && time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		ended += s.trim()
	}
	if ended != maxKeptServers-maxIdleServers {
		t.Errorf("the trims after a whole period idle ended %d goroutines, want %d", ended, maxKeptServers-maxIdleServers)
	}
	waitKept(t, s, maxIdleServers)
	s.close()
}

// waitKept waits until s keeps want goroutines. The deadline only bounds a failure.
func waitKept(t *testing.T, s *chainServers, want int32) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); s.kept.Load() != want; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines kept, want %d", s.kept.Load(), want)
		}
	}
}

// TestChainServersKeepThroughBursts hands over bursts of concurrent queries, as a loaded node's misses come
// in batches, and checks that the goroutines of one burst answer the next: a goroutine is ended only after
// a whole period (between two trims) idle, not as soon as more than maxIdleServers are idle.
func TestChainServersKeepThroughBursts(t *testing.T) {
	const burst, bursts = 4 * maxIdleServers, 5
	s, client, arrived, release := newHeldChainServers(t, burst)
	from := client.LocalAddr().(*net.UDPAddr)
	for b := range uint16(bursts) {
		for i := range uint16(burst) {
			s.serve(passedQuery{b: packedQuery(t, b*burst+i), from: from})
		}
		for range burst {
			<-arrived
		}
		for range burst {
			release <- struct{}{}
		}
		if _, err := readReplies(client, burst); err != nil {
			t.Fatalf("burst %d: %v", b, err)
		}
		// Every goroutine back to waiting for the next query. The deadline only bounds a failure.
		for deadline := time.Now().Add(time.Minute); s.busy.Load() != 0; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("burst %d: %d goroutines still busy a minute after their replies", b, s.busy.Load())
			}
		}
	}
	// A goroutine may find no one waiting while another is between its reply and its next wait; ending the
	// ones beyond maxIdleServers after each burst would start burst-maxIdleServers more for every burst.
	if started := s.started.Load(); started >= 2*burst {
		t.Errorf("%d goroutines started for %d bursts of %d queries", started, bursts, burst)
	}
	// Queries came during this period: no goroutine was idle all through it.
	if ended := s.trim(); ended != 0 {
		t.Errorf("the first trim after the bursts ended %d goroutines", ended)
	}
	// kept is read before the trim: the goroutines it ends leave kept as they go.
	want := int(s.kept.Load() - maxIdleServers)
	if ended := s.trim(); ended != want {
		t.Errorf("the second trim ended %d goroutines, want %d", ended, want)
	}
	waitKept(t, s, maxIdleServers)
	s.close()
	if err := s.wait(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestChainServersEndABurstsGoroutinesOnTheirOwn holds a burst of queries in the chain at once, releases
// them, and waits, with nothing else to do, until the goroutines beyond maxIdleServers have ended, and the
// trim timer is no longer set. A burst's goroutines were trimmed only at the fast path's group checks,
// which back off to 5 minutes on an idle node: after a flood of queries the cluster DNS never answered
// (NOTIFY), 511 goroutines of two fast paths were still there 25 s later.
func TestChainServersEndABurstsGoroutinesOnTheirOwn(t *testing.T) {
	const burst = 4 * maxIdleServers
	s, client, arrived, release := newHeldChainServers(t, burst)
	s.trimEvery = 10 * time.Millisecond
	from := client.LocalAddr().(*net.UDPAddr)
	for i := range uint16(burst) {
		s.serve(passedQuery{b: packedQuery(t, i), from: from})
	}
	for range burst {
		<-arrived
	}
	close(release)
	if _, err := readReplies(client, burst); err != nil {
		t.Fatal(err)
	}
	waitKept(t, s, maxIdleServers)
	// The deadline only bounds a failure.
	for deadline := time.Now().Add(time.Minute); s.trimArmed.Load(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the trim timer is still set a minute after the goroutines beyond maxIdleServers ended")
		}
	}
	s.close()
	if err := s.wait(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestChainServersAnswerAsTheServer hands the datagrams the fast path does not answer both ways it can: to
// the kept goroutines, where serverAccepts lets it, and to the fast path's miekg/dns server, which applies
// the server's own checks; the replies must be the same, byte for byte. Every datagram serverAccepts turns
// away must be one that server does not serve.
func TestChainServersAnswerAsTheServer(t *testing.T) {
	echo := func(_ context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
		m := new(dns.Msg)
		m.SetReply(r)
		m.Answer = append(m.Answer, &dns.TXT{Hdr: dns.RR_Header{Name: "echo.", Rrtype: dns.TypeTXT, Class: dns.ClassINET, Ttl: 30},
			Txt: []string{fmt.Sprintf("opcode %d class %d questions %d extra %d", r.Opcode, r.Question[0].Qclass, len(r.Question), len(r.Extra))}})
		return dns.RcodeSuccess, w.WriteMsg(m)
	}
	s, client := newTestChainServers(t, plugin.HandlerFunc(echo))
	inner := chainServer(s.fp.srv, s.fp.chain)
	if err := activate(inner); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = inner.Shutdown() })
	from := client.LocalAddr().(*net.UDPAddr)
	reply := func() []byte {
		buf := make([]byte, 4096)
		_ = client.SetReadDeadline(time.Now().Add(10 * time.Second))
		n, _, err := client.ReadFromUDP(buf)
		if err != nil {
			t.Fatalf("no reply: %v", err)
		}
		return buf[:n]
	}

	in := func(m *dns.Msg) []byte { return mustPack(t, m) }
	query := func(edit func(m *dns.Msg)) []byte {
		m := newQuery("www.example.org.", dns.TypeA, 1232, false)
		edit(m)
		return in(m)
	}
	header := func(b []byte, edit func(h []byte)) []byte { edit(b[:headerLen]); return b }
	plain := query(func(*dns.Msg) {})
	accepted := map[string][]byte{
		"plain":           plain,
		"class chaos":     query(func(m *dns.Msg) { m.Question[0].Qclass = dns.ClassCHAOS }),
		"class any":       query(func(m *dns.Msg) { m.Question[0].Qclass = dns.ClassANY }),
		"DS":              query(func(m *dns.Msg) { m.Question[0].Qtype = dns.TypeDS }),
		"AXFR":            query(func(m *dns.Msg) { m.Question[0].Qtype = dns.TypeAXFR }),
		"NOTIFY":          query(func(m *dns.Msg) { m.Opcode = dns.OpcodeNotify }),
		"two OPT records": query(func(m *dns.Msg) { m.Extra = append(m.Extra, m.Extra[0]) }),
		"escaped name":    query(func(m *dns.Msg) { m.Question[0].Name = `we\.ird.example.org.` }),
		"trailing bytes":  append(bytes.Clone(plain), 1, 2, 3),
		"ANCOUNT 1, none": header(bytes.Clone(plain), func(h []byte) { h[7] = 1 }),
		"cut short":       plain[:len(plain)-3],
		"TSIG, no secrets": in(func() *dns.Msg {
			m := newQuery("www.example.org.", dns.TypeA, 0, false)
			m.SetTsig("k.", dns.HmacSHA256, 300, 0)
			return m
		}()),
	}
	refused := map[string][]byte{
		"two questions": query(func(m *dns.Msg) { m.Question = append(m.Question, m.Question[0]) }),
		"opcode STATUS": query(func(m *dns.Msg) { m.Opcode = dns.OpcodeStatus }),
		"opcode UPDATE": query(func(m *dns.Msg) { m.Opcode = dns.OpcodeUpdate }),
		"ARCOUNT 3":     header(bytes.Clone(plain), func(h []byte) { h[11] = 3 }),
		"NSCOUNT 2":     header(bytes.Clone(plain), func(h []byte) { h[9] = 2 }),
		"no question":   header(bytes.Clone(plain[:headerLen]), func(h []byte) { h[5] = 0 }),
		"a response":    header(bytes.Clone(plain), func(h []byte) { h[2] |= 0x80 }),
		"5 bytes":       plain[:5],
		// The server reads 512 bytes of a datagram: it answers a longer one FORMERR.
		"513 bytes": query(func(m *dns.Msg) {
			m.IsEdns0().Option = []dns.EDNS0{&dns.EDNS0_PADDING{Padding: make([]byte, maxFastQuery+1-len(plain)-4)}}
		}),
	}
	for name, b := range accepted {
		if !serverAccepts(b) {
			t.Errorf("%s: not handed to the kept goroutines", name)
			continue
		}
		s.serve(passedQuery{b: b, from: from})
		kept := reply()
		// The server refuses classes other than IN without a chaos plugin, and FORMERRs what it cannot read.
		if m := new(dns.Msg); name == "plain" && (m.Unpack(kept) != nil || len(m.Answer) != 1) {
			t.Errorf("%s: the handler did not answer: %x", name, kept)
		}
		s.fp.chain.passQuery(passedQuery{b: b, from: from})
		if server := reply(); !bytes.Equal(kept, server) {
			t.Errorf("%s: the kept goroutines reply %x, the server %x", name, kept, server)
		}
	}
	if l := len(refused["513 bytes"]); l != maxFastQuery+1 {
		t.Fatalf("the 513-byte query has %d bytes", l)
	}
	for name, b := range refused {
		if serverAccepts(b) {
			t.Errorf("%s: handed to the kept goroutines, which serve what the server refuses", name)
		}
	}
	s.close()
	if err := s.wait(context.Background()); err != nil {
		t.Fatal(err)
	}
}
