package clamp

import (
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/forward"

	"github.com/miekg/dns"
)

// corefileInput hands a Corefile held in memory to caddy.
type corefileInput string

func (c corefileInput) Body() []byte       { return []byte(c) }
func (c corefileInput) Path() string       { return "Corefile" }
func (c corefileInput) ServerType() string { return "dns" }

// directivesMu serialises the tests that change the global directive order.
var directivesMu sync.Mutex

// withClampBeforeCache puts clamp right before cache in the directive order, as plugin.cfg does,
// until the test ends.
func withClampBeforeCache(t *testing.T) {
	t.Helper()
	directivesMu.Lock()
	original := slices.Clone(dnsserver.Directives)
	i := slices.Index(original, "cache")
	if i < 0 {
		directivesMu.Unlock()
		t.Fatal("CoreDNS has no cache directive")
	}
	if err := dnsserver.SetDirectives(slices.Insert(slices.Clone(original), i, pluginName)); err != nil {
		directivesMu.Unlock()
		t.Fatalf("setting the directive order: %v", err)
	}
	t.Cleanup(func() {
		defer directivesMu.Unlock()
		if err := dnsserver.SetDirectives(original); err != nil {
			t.Errorf("restoring the directive order: %v", err)
		}
	})
}

// upstream is an authoritative server on loopback that counts the queries for each name.
type upstream struct {
	server  *dns.Server
	addr    string
	queries sync.Map // name -> *atomic.Int32
}

func startUpstream(t *testing.T, answer func(req *dns.Msg) *dns.Msg) *upstream {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listening for the upstream: %v", err)
	}
	u := &upstream{addr: pc.LocalAddr().String()}
	started := make(chan struct{})
	u.server = &dns.Server{PacketConn: pc, NotifyStartedFunc: func() { close(started) },
		Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
			n, _ := u.queries.LoadOrStore(r.Question[0].Name, new(atomic.Int32))
			n.(*atomic.Int32).Add(1)
			w.WriteMsg(answer(r))
		})}
	go u.server.ActivateAndServe()
	<-started
	t.Cleanup(func() { u.server.Shutdown() })
	return u
}

func (u *upstream) count(name string) int32 {
	n, ok := u.queries.Load(name)
	if !ok {
		return 0
	}
	return n.(*atomic.Int32).Load()
}

func exchange(t *testing.T, addr, name string, qtype uint16) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	c := &dns.Client{Timeout: 2 * time.Second}
	r, _, err := c.Exchange(m, addr)
	if err != nil {
		t.Fatalf("query %s: %v", name, err)
	}
	return r
}

// startCoreDNS starts the Corefile, which must hold one server block, and returns its address.
func startCoreDNS(t *testing.T, corefile string) string {
	t.Helper()
	caddy.Quiet = true
	dnsserver.Quiet = true
	inst, err := caddy.Start(corefileInput(corefile))
	if err != nil {
		t.Fatalf("starting CoreDNS: %v", err)
	}
	t.Cleanup(func() { inst.Stop() })
	return inst.Servers()[0].LocalAddr().String()
}

// answering returns an upstream handler: names starting with "long." have TTL 3600, with "short."
// TTL 1; anything else is NXDOMAIN with a SOA whose TTL and MINIMUM are 3600.
func answering(req *dns.Msg) *dns.Msg {
	m := new(dns.Msg)
	m.SetReply(req)
	m.Authoritative = true
	q := req.Question[0]
	a := &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET}, A: net.IPv4(192, 0, 2, 1)}
	switch {
	case strings.HasPrefix(q.Name, "long."):
		a.Hdr.Ttl = 3600
		m.Answer = []dns.RR{a}
	case strings.HasPrefix(q.Name, "short."):
		a.Hdr.Ttl = 1
		m.Answer = []dns.RR{a}
	default:
		m.Rcode = dns.RcodeNameError
		m.Ns = []dns.RR{&dns.SOA{Hdr: dns.RR_Header{Name: "example.org.", Rrtype: dns.TypeSOA, Class: dns.ClassINET, Ttl: 3600},
			Ns: "ns.example.org.", Mbox: "admin.example.org.", Serial: 1, Refresh: 7200, Retry: 3600, Expire: 1209600, Minttl: 3600}}
	}
	return m
}

// TestServerClampBeforeCache runs a whole CoreDNS server with clamp in front of cache and checks
// that answers from the cache keep counting down inside the window, that short TTLs are raised on
// the way out although the cache stores them as they are, and that the negative TTL is clamped.
func TestServerClampBeforeCache(t *testing.T) {
	withClampBeforeCache(t)
	up := startUpstream(t, answering)

	// The cache has no minimum of its own, so the TTL 1 answer comes out of it as 1.
	addr := startCoreDNS(t, `example.org:0 {
		bind 127.0.0.1
		clamp
		cache {
			success 9984 30 0
			denial 9984 5 0
		}
		forward . `+up.addr+`
	}`)

	first := exchange(t, addr, "long.example.org.", dns.TypeA)
	if len(first.Answer) != 1 || first.Answer[0].Header().Ttl != 30 {
		t.Fatalf("first answer %v, want one A with TTL 30", first.Answer)
	}

	raised := exchange(t, addr, "short.example.org.", dns.TypeA)
	if len(raised.Answer) != 1 || raised.Answer[0].Header().Ttl != 5 {
		t.Errorf("answer for a TTL 1 record %v, want one A with TTL 5", raised.Answer)
	}

	gone := exchange(t, addr, "gone.example.org.", dns.TypeA)
	if gone.Rcode != dns.RcodeNameError || len(gone.Ns) != 1 {
		t.Fatalf("negative answer %v, want NXDOMAIN with a SOA", gone)
	}
	if soa, ok := gone.Ns[0].(*dns.SOA); !ok {
		t.Errorf("negative answer authority %v, want a SOA", gone.Ns[0])
	} else if soa.Hdr.Ttl != 5 || soa.Minttl != 5 {
		t.Errorf("negative answer SOA TTL %d MINIMUM %d, want 5 and 5", soa.Hdr.Ttl, soa.Minttl)
	}

	time.Sleep(1100 * time.Millisecond)

	cached := exchange(t, addr, "long.example.org.", dns.TypeA)
	if len(cached.Answer) != 1 {
		t.Fatalf("cached answer %v, want one A", cached.Answer)
	}
	if ttl := cached.Answer[0].Header().Ttl; ttl >= 30 || ttl < 5 {
		t.Errorf("cached answer TTL %d, want it counted down below 30 and not under 5", ttl)
	}
	if n := up.count("long.example.org."); n != 1 {
		t.Errorf("upstream saw %d queries for the long TTL name, want 1 (the second from the cache)", n)
	}
}

// TestServerClampsCacheOutput checks that clamp sits in front of cache: with a window above the
// cache's cap, both the answer that fills the cache and the one served from it are raised. Were
// clamp behind the cache, the cache would cap the stored answer to 30 and serve it as is.
func TestServerClampsCacheOutput(t *testing.T) {
	withClampBeforeCache(t)
	up := startUpstream(t, answering)

	addr := startCoreDNS(t, `example.org:0 {
		bind 127.0.0.1
		clamp {
			success 60 120
		}
		cache {
			success 9984 30 0
		}
		forward . `+up.addr+`
	}`)

	for i, what := range []string{"answer from upstream", "answer from the cache"} {
		r := exchange(t, addr, "long.example.org.", dns.TypeA)
		if len(r.Answer) != 1 || r.Answer[0].Header().Ttl != 60 {
			t.Errorf("%s: %v, want one A with TTL 60", what, r.Answer)
		}
		if n := up.count("long.example.org."); n != 1 {
			t.Errorf("after query %d upstream saw %d queries, want 1", i+1, n)
		}
	}
}
