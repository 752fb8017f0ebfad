package upstreamsvc

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	_ "github.com/coredns/coredns/plugin/bind"

	"github.com/miekg/dns"
)

func TestMain(m *testing.M) {
	// The lead's plugin.cfg puts upstreamsvc right before forward; do the same for this package's servers.
	i := slices.Index(dnsserver.Directives, "forward")
	if i < 0 {
		fmt.Fprintln(os.Stderr, "forward is not a CoreDNS directive")
		os.Exit(2)
	}
	if err := dnsserver.SetDirectives(slices.Insert(slices.Clone(dnsserver.Directives), i, pluginName)); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	caddy.Quiet = true
	dnsserver.Quiet = true
	os.Exit(m.Run())
}

// noClusterAPI makes sure rest.InClusterConfig finds no cluster, whatever the environment running the tests.
func noClusterAPI(t *testing.T) {
	t.Helper()
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
}

// clearServiceEnv hides any injected variables for the default Service.
func clearServiceEnv(t *testing.T) {
	t.Helper()
	t.Setenv(HostEnvVar(defaultService), "")
	t.Setenv(portEnvVar(defaultService), "")
}

// testUpstream is a DNS server on one loopback address, answering every A query with its own
// marker address and counting queries by transport. Health-check queries (for ".") are not counted.
type testUpstream struct {
	ip     string
	marker net.IP
	udp    *dns.Server
	tcp    *dns.Server
	byUDP  atomic.Int64
	byTCP  atomic.Int64
	closed sync.Once
	// hold, when set (setHold), runs before each counted query is answered.
	hold atomic.Pointer[func()]
}

func (s *testUpstream) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(r)
	if len(r.Question) == 1 && r.Question[0].Name != "." {
		if _, ok := w.RemoteAddr().(*net.TCPAddr); ok {
			s.byTCP.Add(1)
		} else {
			s.byUDP.Add(1)
		}
		if hold := s.hold.Load(); hold != nil {
			(*hold)()
		}
		if r.Question[0].Qtype == dns.TypeA {
			m.Answer = []dns.RR{&dns.A{
				Hdr: dns.RR_Header{Name: r.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 5},
				A:   s.marker,
			}}
		}
	}
	w.WriteMsg(m)
}

// setHold makes hold run before each counted query is answered. The server learns of it through an
// atomic, since a query sent over the network orders nothing for the race detector.
func (s *testUpstream) setHold(hold func()) { s.hold.Store(&hold) }

func (s *testUpstream) queries() int64 { return s.byUDP.Load() + s.byTCP.Load() }

func (s *testUpstream) Close() {
	s.closed.Do(func() {
		s.udp.Shutdown()
		s.tcp.Shutdown()
	})
}

// listenUpstream binds UDP and TCP on ip:port; port 0 lets the kernel choose.
func listenUpstream(ip string, port int, marker net.IP) (*testUpstream, error) {
	tl, err := net.Listen("tcp", net.JoinHostPort(ip, fmt.Sprint(port)))
	if err != nil {
		return nil, err
	}
	pc, err := net.ListenPacket("udp", tl.Addr().String())
	if err != nil {
		tl.Close()
		return nil, err
	}
	s := &testUpstream{ip: ip, marker: marker}
	s.udp = &dns.Server{PacketConn: pc, Handler: s}
	s.tcp = &dns.Server{Listener: tl, Handler: s}
	started := make(chan struct{}, 2)
	s.udp.NotifyStartedFunc = func() { started <- struct{}{} }
	s.tcp.NotifyStartedFunc = func() { started <- struct{}{} }
	go s.udp.ActivateAndServe()
	go s.tcp.ActivateAndServe()
	<-started
	<-started
	return s, nil
}

// upstreamPair starts two upstreams on the same port of 127.0.0.1 and 127.0.0.2, the way one Service
// port sits on an old and a new ClusterIP. Their A answers are 192.0.2.1 and 192.0.2.2.
func upstreamPair(t *testing.T) (first, second *testUpstream, port int) {
	t.Helper()
	for range 20 {
		a, err := listenUpstream("127.0.0.1", 0, net.IPv4(192, 0, 2, 1))
		if err != nil {
			t.Fatal(err)
		}
		port = a.tcp.Listener.Addr().(*net.TCPAddr).Port
		b, err := listenUpstream("127.0.0.2", port, net.IPv4(192, 0, 2, 2))
		if err != nil {
			a.Close()
			continue
		}
		t.Cleanup(a.Close)
		t.Cleanup(b.Close)
		return a, b, port
	}
	t.Fatal("no port free on both 127.0.0.1 and 127.0.0.2")
	return nil, nil, 0
}

// startCoreDNS starts a CoreDNS instance from corefile and returns it with its UDP address.
func startCoreDNS(t *testing.T, corefile string) (*caddy.Instance, string) {
	t.Helper()
	inst, err := caddy.Start(caddy.CaddyfileInput{Contents: []byte(corefile), ServerTypeName: "dns"})
	if err != nil {
		t.Fatalf("starting CoreDNS: %v", err)
	}
	return inst, udpAddr(t, inst)
}

func udpAddr(t *testing.T, inst *caddy.Instance) string {
	t.Helper()
	srvs := inst.Servers()
	if len(srvs) == 0 || srvs[0].LocalAddr() == nil {
		t.Fatal("CoreDNS has no UDP listener")
	}
	return srvs[0].LocalAddr().String()
}

// stopCoreDNS stops inst the way a final shutdown does: servers first, then OnShutdown callbacks.
func stopCoreDNS(t *testing.T, inst *caddy.Instance) {
	t.Helper()
	if err := inst.Stop(); err != nil {
		t.Errorf("stopping CoreDNS: %v", err)
	}
	for _, err := range inst.ShutdownCallbacks() {
		t.Errorf("shutdown callback: %v", err)
	}
}

// ask sends one A query over UDP and returns the answer's address, or an error for anything but
// NOERROR with one A record.
func ask(c *dns.Client, server, name string) (net.IP, error) {
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), dns.TypeA)
	r, _, err := c.Exchange(m, server)
	if err != nil {
		return nil, err
	}
	if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
		return nil, fmt.Errorf("%s: rcode %s, %d answers", name, dns.RcodeToString[r.Rcode], len(r.Answer))
	}
	a, ok := r.Answer[0].(*dns.A)
	if !ok {
		return nil, fmt.Errorf("%s: answer is %T", name, r.Answer[0])
	}
	return a.A, nil
}

// waitLimit bounds the tests' waits for evidence: a failure bound for a busy machine, not an expectation.
const waitLimit = time.Minute

// waitFor polls cond every 20ms until it holds or limit passes.
func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", limit, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// writeKubeconfig points a kubeconfig at server and returns its path.
func writeKubeconfig(t *testing.T, server string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	content := `apiVersion: v1
kind: Config
clusters:
- name: fake
  cluster:
    server: ` + server + `
users:
- name: fake
  user: {}
contexts:
- name: fake
  context:
    cluster: fake
    user: fake
current-context: fake
`
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// pluginGoroutines counts goroutines that belong to this plugin's machinery: the informer, CoreDNS
// proxies and health probes, and the watch.
func pluginGoroutines() int {
	buf := make([]byte, 1<<22)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		for _, mark := range []string{
			"k8s.io/client-go/tools/cache.",
			"github.com/coredns/coredns/plugin/pkg/proxy.",
			"github.com/coredns/coredns/plugin/pkg/up.",
			"upstreamsvc.(*serviceWatch)",
			"upstreamsvc.(*pipeConn)",
			"upstreamsvc.(*pipeline)",
		} {
			if strings.Contains(g, mark) {
				n++
				break
			}
		}
	}
	return n
}

// settledGoroutines runs the collector (stopped proxies end their connection sweeper from a
// finalizer) until the count stops falling or reaches want, bounded by limit.
func settledGoroutines(want int, limit time.Duration) int {
	deadline := time.Now().Add(limit)
	n := pluginGoroutines()
	for n > want && time.Now().Before(deadline) {
		runtime.GC()
		time.Sleep(50 * time.Millisecond)
		n = pluginGoroutines()
	}
	return n
}
