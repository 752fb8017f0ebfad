package corefile

import (
	"net"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns"
	_ "github.com/nodelocaldns/nodelocaldns/plugin/health"
)

// The helpers here start real CoreDNS servers from rendered Corefiles. They listen on loopback only.

var setupServerType = sync.OnceValue(func() error {
	if err := dnsserver.Register(); err != nil {
		return err
	}
	order, err := nodelocaldns.Directives()
	if err != nil {
		return err
	}
	registered := map[string]bool{}
	for _, name := range caddy.ListPlugins()["others"] {
		if p, ok := strings.CutPrefix(name, "dns."); ok {
			registered[p] = true
		}
	}
	var directives []string
	for _, name := range order {
		if registered[name] {
			directives = append(directives, name)
		}
	}
	return dnsserver.SetDirectives(directives)
})

// registeredPlugin reports whether this test binary compiled in the plugin behind a directive.
func registeredPlugin(name string) bool {
	return slices.Contains(caddy.ListPlugins()["others"], "dns."+name)
}

// startCoreDNS starts a CoreDNS instance on corefile and stops it when the test ends.
func startCoreDNS(t testing.TB, corefile []byte) *caddy.Instance {
	t.Helper()
	if err := setupServerType(); err != nil {
		t.Fatalf("setting up the dns server type: %v", err)
	}
	caddy.Quiet = true
	dnsserver.Quiet = true
	inst, err := caddy.Start(caddy.CaddyfileInput{Contents: corefile, Filepath: "Corefile", ServerTypeName: "dns"})
	if err != nil {
		t.Fatalf("starting CoreDNS: %v\n%s", err, corefile)
	}
	// Shutdown callbacks first, as at a real exit: plugins with process-wide state (notrack's node
	// reconciler, upstreamsvc's watch) release it, so the next Corefile starts afresh.
	t.Cleanup(func() {
		for _, err := range inst.ShutdownCallbacks() {
			t.Errorf("shutdown: %v", err)
		}
		inst.Stop()
	})
	return inst
}

// fakeUpstream serves h on a loopback port over UDP and TCP and returns its address.
func fakeUpstream(t testing.TB, h dns.HandlerFunc) string {
	t.Helper()
	for range 5 {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		l, err := net.Listen("tcp", pc.LocalAddr().String())
		if err != nil {
			pc.Close()
			continue
		}
		udp := &dns.Server{PacketConn: pc, Handler: h}
		tcp := &dns.Server{Listener: l, Handler: h}
		var started sync.WaitGroup
		started.Add(2)
		udp.NotifyStartedFunc = started.Done
		tcp.NotifyStartedFunc = started.Done
		go udp.ActivateAndServe()
		go tcp.ActivateAndServe()
		started.Wait()
		t.Cleanup(func() { udp.Shutdown(); tcp.Shutdown() })
		return pc.LocalAddr().String()
	}
	t.Fatal("no free loopback port for a fake upstream")
	return ""
}

// freePort returns a loopback port that was free for TCP and UDP a moment ago.
func freePort(t testing.TB) string {
	t.Helper()
	for range 5 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		_, port, _ := net.SplitHostPort(l.Addr().String())
		pc, err := net.ListenPacket("udp", "127.0.0.1:"+port)
		l.Close()
		if err == nil {
			pc.Close()
			return port
		}
	}
	t.Fatal("no free loopback port")
	return ""
}

// answerEverything answers A queries with 10.0.0.1 for names under "svc." and NXDOMAIN otherwise, with an
// SOA in the authority section as an authoritative server would.
func answerEverything(w dns.ResponseWriter, r *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(r)
	m.Authoritative = true
	q := r.Question[0]
	if strings.Contains(q.Name, ".svc.") && q.Qtype == dns.TypeA {
		rr, _ := dns.NewRR(q.Name + " 30 IN A 10.0.0.1")
		m.Answer = append(m.Answer, rr)
	} else {
		m.Rcode = dns.RcodeNameError
		soa, _ := dns.NewRR("cluster.local. 5 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 1 7200 1800 86400 5")
		m.Ns = append(m.Ns, soa)
	}
	w.WriteMsg(m)
}

// exchange sends one query to addr over UDP.
func exchange(t testing.TB, addr, name string, qtype uint16) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	c := &dns.Client{Net: "udp"}
	r, _, err := c.Exchange(m, addr)
	if err != nil {
		t.Fatalf("query %s to %s: %v", name, addr, err)
	}
	return r
}
