//go:build linux

package hostile

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nodelocaldns/nodelocaldns/corefile"
	"github.com/nodelocaldns/nodelocaldns/internal/privtest"
	"github.com/nodelocaldns/nodelocaldns/plugin/wirecache"
	"github.com/nodelocaldns/nodelocaldns/test/simnode"
)

// build is the node-cache binary, built once per test binary, on first use.
var build = simnode.SharedBuild{Prefix: "nodelocaldns-hostile-"}

func TestMain(m *testing.M) {
	if attacks, ok := os.LookupEnv(attackerEnv); ok {
		// This is the benchmark's attacker process (startAttacker), not a test run.
		os.Exit(runAttacker(strings.Split(attacks, ",")))
	}
	if spec, ok := os.LookupEnv(lookupsEnv); ok {
		// This is the benchmark's well-behaved Pod (podLookupsIn), not a test run.
		os.Exit(runLookups(spec))
	}
	code := m.Run()
	build.Remove()
	os.Exit(code)
}

// nodeCache returns the node-cache binary, built on first use.
func nodeCache(tb testing.TB) string {
	tb.Helper()
	privtest.RequirePrivileged(tb, append([]string{"go", "nft"}, simnode.Tools...)...)
	return build.Binary(tb)
}

// Where the two caches and the cluster DNS's own server listen, inside the simulated node.
const (
	// cacheMetrics and refMetrics are the prometheus listeners of the cache under test and of the reference,
	// in the node namespace.
	cacheMetrics = "127.0.0.1:9253"
	refMetrics   = "127.0.0.1:9263"
	// refPort is the reference's DNS port, on the same two addresses as the cache's port 53.
	refPort = 5353
	// backendAddr is the cluster DNS's CoreDNS, in the DNS namespace, behind brokenUpstream.
	backendAddr = "127.0.0.1:5300"
)

// Addresses the Pod asks: the cache under test on the link-local address and on the kube-dns ClusterIP, and
// the reference on the same addresses, port refPort.
var (
	linkLocal    = net.JoinHostPort(simnode.LinkLocalIP, "53")
	kubeDNS      = net.JoinHostPort(simnode.KubeDNSClusterIP, "53")
	refLinkLocal = net.JoinHostPort(simnode.LinkLocalIP, strconv.Itoa(refPort))
	refKubeDNS   = net.JoinHostPort(simnode.KubeDNSClusterIP, strconv.Itoa(refPort))
)

// hostileZone is the cluster.local zone of this tier: simnode's, a wildcard that gives each case a name of its
// own (so that cases asked at once do not share cache entries), an answer too large for 512 bytes, and the
// names brokenUpstream breaks.
var hostileZone = simnode.ClusterZone + `*.w.default.svc            3600 IN A   10.244.3.3
*.w.default.svc            3600 IN TXT "a wildcard of the hostile tier"
*.broken.default.svc       3600 IN A   10.244.5.5
` + bigRecords()

// bigName has 60 A records: 976 bytes, more than a query without EDNS may get over UDP.
const bigName = "big.default.svc.cluster.local."

func bigRecords() string {
	var b strings.Builder
	for i := 1; i <= 60; i++ {
		fmt.Fprintf(&b, "big.default.svc            3600 IN A   10.244.4.%d\n", i)
	}
	return b.String()
}

// The servers a rig can put where the node cache serves: node-cache in the shipped configuration, or, for the
// benchmark's control (HOSTILE_CACHE), unbound, the bar to beat.
const (
	serveNodeCache = "node-cache"
	serveUnbound   = "unbound"
)

// rig is a simulated node with the cache under test (the shipped configuration), the reference beside it,
// the cluster DNS behind brokenUpstream, and the node's resolver. A rig that serves unbound has no reference.
type rig struct {
	t     testing.TB
	n     *simnode.Node
	dir   string
	cache *simnode.Process
	// unbound says that cache is unbound (startUnbound), which has no metrics endpoint.
	unbound  bool
	ref      *simnode.Process
	backend  *simnode.Process // the cluster DNS's CoreDNS, behind upstream
	upstream *brokenUpstream
	ext      *simnode.Process // the node's resolver, which logs every query
	// hostile is the hostile Pod's side of the attacks, in this process; hostileNS its network namespace
	// (simnode.Node.AddPod).
	hostile   hostilePod
	hostileNS string
}

// newRig starts a simulated node whose cache is server (serveNodeCache or serveUnbound).
func newRig(tb testing.TB, server string) *rig {
	tb.Helper()
	if server != serveNodeCache && server != serveUnbound {
		tb.Fatalf("no server %q to put under attack (%s, %s)", server, serveNodeCache, serveUnbound)
	}
	bin := nodeCache(tb)
	n := simnode.New(tb)
	r := &rig{t: tb, n: n, dir: tb.TempDir(), unbound: server == serveUnbound}
	r.hostileNS = n.AddPod("hostile", hostilePodIP, hostilePodNodeIP)
	// The well-behaved Pod's lookups over TCP each open a connection, which leaves a TIME_WAIT entry on the
	// Pod's side for a minute: back to back, about 1,300 a second to two addresses, which took the ports
	// its connects choose from within a few rounds of the benchmark (its lookups over TCP then took 3 ms
	// instead of 0.5, with the attack or without). tcp_tw_reuse lets a connect take a port whose TIME_WAIT
	// is over a second old, as a client that makes many short connections is set up.
	if out, err := n.In(context.Background(), n.PodNS, "sysctl", "-qw", "net.ipv4.tcp_tw_reuse=1"); err != nil {
		tb.Fatalf("letting the Pod's connects reuse ports in TIME_WAIT: %v\n%s", err, out)
	}
	r.hostile = hostilePod{inPod: func(fn func() error) error { return n.Do(r.hostileNS, fn) }}

	// The cluster DNS: CoreDNS on loopback in its namespace, behind the relay on the Pod IP that breaks some
	// replies.
	zone := filepath.Join(r.dir, "cluster.local.db")
	backendConf := filepath.Join(r.dir, "Corefile.clusterdns")
	r.write(zone, hostileZone)
	host, port, _ := net.SplitHostPort(backendAddr)
	r.write(backendConf, fmt.Sprintf("cluster.local:%s {\n    bind %s\n    file %s\n}\n", port, host, zone))
	r.backend = n.Start(n.DNSNS, bin, "-conf", backendConf)
	if err := n.WaitForDNS(n.DNSNS, "udp", backendAddr, "kubernetes.default.svc.cluster.local", 20*time.Second); err != nil {
		tb.Fatalf("the cluster DNS's CoreDNS: %v\n%s", err, r.backend.Output())
	}
	r.upstream = startBrokenUpstream(tb, n)
	r.ext = n.StartExternalResolver(bin)

	// The cache under test: the shipped configuration, as the DaemonSet renders it.
	base := corefile.Config{
		LocalIPs:      []netip.Addr{netip.MustParseAddr(simnode.LinkLocalIP)},
		ClusterDNSIPs: []netip.Addr{netip.MustParseAddr(simnode.KubeDNSClusterIP)},
		NodeUpstreams: []string{simnode.ExtResolverIP},
	}
	cfg := base
	cfg.MetricsAddress = cacheMetrics
	cfg.Notrack = corefile.Notrack{Backend: "nft", Lock: filepath.Join(r.dir, "nodelocaldns.lock")}
	if r.unbound {
		r.startUnbound(cfg)
		return r
	}
	r.cache = r.start("Corefile", cfg)
	r.waitOutput(r.cache, "rules in place for", 30*time.Second)

	// The reference: the same Corefile without wirecache, so CoreDNS's server and plugins alone, on port
	// refPort of the same addresses (which the cache's notrack put on the node's link), without notrack.
	ref := base
	ref.Port, ref.HealthPort, ref.ReadyPort = refPort, 8090, 8191
	ref.MetricsAddress = refMetrics
	ref.WireCache.Disabled = true
	ref.Notrack.Disabled = true
	r.ref = r.start("Corefile.reference", ref)
	for _, addr := range []string{linkLocal, kubeDNS, refLinkLocal, refKubeDNS} {
		if err := n.WaitForDNS(n.PodNS, "udp", addr, "kubernetes.default.svc.cluster.local", 20*time.Second); err != nil {
			tb.Fatalf("%s: %v\ncache:\n%s\nreference:\n%s", addr, err, r.cache.Output(), r.ref.Output())
		}
	}
	return r
}

// startUnbound puts unbound where the node cache serves, as the benchmark's control. node-cache, started on
// cfg with skip_teardown, puts the link, the two addresses and the NOTRACK rules in place as it does for
// itself and leaves them at exit; unbound then serves both addresses with the configuration bench/cpu.sh
// gives it (simnode_unbound_conf in bench/simnode.sh, whose addresses are test/simnode's): one thread, the
// cluster domain and the reverse zones forwarded to kube-dns-upstream over TCP, every other name to the
// node's resolver, TTLs clamped to 5-30 s and 5 s negative as the Corefile clamps them, everything else
// unbound's defaults.
func (r *rig) startUnbound(cfg corefile.Config) {
	r.t.Helper()
	unbound, err := exec.LookPath("unbound")
	if err != nil {
		r.t.Fatalf("the unbound control needs unbound (Debian's package unbound): %v", err)
	}
	cfg.Notrack.SkipTeardown = true
	setup := r.start("Corefile.setup", cfg)
	r.waitOutput(setup, "rules in place for", 30*time.Second)
	if err := setup.Signal(syscall.SIGTERM); err != nil {
		r.t.Fatalf("stopping the node cache that set up the node for unbound: %v", err)
	}
	if err := setup.Wait(30 * time.Second); err != nil && !setup.Exited() {
		r.t.Fatalf("the node cache that set up the node for unbound: %v\n%s", err, setup.Output())
	}
	// The configuration bench/cpu.sh runs unbound with, written by the script that lays out the same node.
	script, err := filepath.Abs("../../bench/simnode.sh")
	if err != nil {
		r.t.Fatal(err)
	}
	write := exec.Command("bash", "-c", `die() { echo "$*" >&2; exit 1; }; source "$1" && work=$2 && simnode_unbound_conf`, "bash", script, r.dir)
	if out, err := write.CombinedOutput(); err != nil {
		r.t.Fatalf("writing unbound's configuration with %s: %v\n%s", script, err, out)
	}
	conf := filepath.Join(r.dir, "unbound.conf")
	r.boundUnboundTCP(conf)
	r.cache = r.n.Start(r.n.NodeNS, unbound, "-d", "-c", conf)
	for _, addr := range []string{linkLocal, kubeDNS} {
		if err := r.n.WaitForDNS(r.n.PodNS, "udp", addr, "kubernetes.default.svc.cluster.local", 20*time.Second); err != nil {
			r.t.Fatalf("unbound on %s: %v\n%s", addr, err, r.cache.Output())
		}
	}
}

// boundUnboundTCP adds to unbound's configuration at conf the bounds the node cache puts on TCP
// connections, as far as unbound has them, so that the connection attacks meet the same limits in both:
// wirecache's bound on the connections held in all, and CoreDNS's 3 s read timeout for a connection that
// sends no whole query (unbound shortens it further as its connections fill up). Its defaults, 10
// connections per thread each held 30 s, would make the attacks a test of those settings instead. It gets
// no bound per client: Debian's unbound 1.17.1 counts a client's connections under tcp-connection-limit
// but never counts them down as they close (with a limit of 2, a client's third sequential query over TCP
// and every one after it are closed unanswered), so the well-behaved Pod's lookups over TCP would fail
// once it had made that many.
func (r *rig) boundUnboundTCP(conf string) {
	r.t.Helper()
	f, err := os.OpenFile(conf, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		r.t.Fatalf("bounding unbound's TCP connections: %v", err)
	}
	defer f.Close()
	lines := fmt.Sprintf("server:\n    incoming-num-tcp: %d\n    tcp-idle-timeout: 3000\n", wirecache.DefaultTCPConnections)
	if _, err := f.WriteString(lines); err != nil {
		r.t.Fatalf("bounding unbound's TCP connections: %v", err)
	}
	if err := f.Close(); err != nil {
		r.t.Fatalf("bounding unbound's TCP connections: %v", err)
	}
	if out, err := exec.Command("unbound-checkconf", conf).CombinedOutput(); err != nil {
		r.t.Fatalf("unbound-checkconf rejects %s with the TCP bounds: %v\n%s", conf, err, out)
	}
}

func (r *rig) write(path, content string) {
	r.t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		r.t.Fatal(err)
	}
}

// start renders cfg into the file name and runs a node cache on it in the node namespace, with the
// environment the kubelet gives the DaemonSet's Pod: kube-dns-upstream's ClusterIP, no Kubernetes API.
func (r *rig) start(name string, cfg corefile.Config) *simnode.Process {
	r.t.Helper()
	conf, err := corefile.Render(cfg)
	if err != nil {
		r.t.Fatal(err)
	}
	path := filepath.Join(r.dir, name)
	r.write(path, string(conf))
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "KUBERNETES_") && !strings.HasPrefix(kv, "KUBE_DNS_UPSTREAM_") && !strings.HasPrefix(kv, "XTABLES_LOCKFILE=") {
			env = append(env, kv)
		}
	}
	env = append(env,
		"KUBE_DNS_UPSTREAM_SERVICE_HOST="+simnode.UpstreamClusterIP,
		"XTABLES_LOCKFILE="+filepath.Join(r.dir, name+".xtables.lock"))
	return r.n.StartEnv(r.n.NodeNS, env, nodeCache(r.t), "-conf", path)
}

// waitOutput waits until p has printed s; it fails the test when p exits first or after timeout.
func (r *rig) waitOutput(p *simnode.Process, s string, timeout time.Duration) {
	r.t.Helper()
	deadline := time.Now().Add(timeout)
	for !strings.Contains(p.Output(), s) {
		if p.Exited() {
			r.t.Fatalf("exited before printing %q: %v\n%s", s, p.Wait(0), p.Output())
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("no %q within %v:\n%s", s, timeout, p.Output())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// alive fails tb when either cache has exited.
func (r *rig) alive(tb testing.TB) {
	tb.Helper()
	for _, p := range []*simnode.Process{r.cache, r.ref} {
		if p != nil && p.Exited() {
			tb.Fatalf("a node cache exited: %v\n%s", p.Wait(0), p.Output())
		}
	}
}

// process is what the metrics endpoint says of a node cache process.
type process struct {
	goroutines float64
	rss        float64 // bytes
	heap       float64 // bytes of heap in use
	// tcpConnections are the TCP connections the fast paths hold (coredns_wirecache_tcp_connections).
	tcpConnections float64
	// metrics are every series of the endpoint, summed by metric name over their labels.
	metrics map[string]float64
}

func (p process) String() string {
	return fmt.Sprintf("%.0f goroutines, %.1f MiB resident, %.1f MiB heap in use", p.goroutines, p.rss/(1<<20), p.heap/(1<<20))
}

// scrape reads the metrics of the node cache whose prometheus listens on addr. A scrape the endpoint
// fails (the Prometheus handler answers with an error when a collector fails, as reading /proc may while
// thousands of sockets come and go) is tried again, up to three times.
func (r *rig) scrape(addr string) (process, error) {
	var p process
	var err error
	for range 3 {
		if p, err = r.scrapeOnce(addr); err == nil {
			return p, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return p, err
}

// scrapeUntil scrapes the cache under test every `every` until ok accepts its figures or deadline passes, and
// returns the last figures and whether ok accepted them; a scrape that fails ends the test.
func (r *rig) scrapeUntil(tb testing.TB, deadline time.Time, every time.Duration, ok func(process) bool) (process, bool) {
	tb.Helper()
	var p process
	accepted := pollUntil(deadline, every, func() bool {
		var err error
		if p, err = r.scrape(cacheMetrics); err != nil {
			tb.Fatal(err)
		}
		return ok(p)
	})
	return p, accepted
}

// pollUntil calls ok every `every` until it returns true or deadline passes (it is called once more then),
// and returns what ok returned last.
func pollUntil(deadline time.Time, every time.Duration, ok func() bool) bool {
	for {
		if ok() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(every)
	}
}

func (r *rig) scrapeOnce(addr string) (process, error) {
	var c net.Conn
	err := r.n.Do(r.n.NodeNS, func() (err error) {
		c, err = net.DialTimeout("tcp", addr, 5*time.Second)
		return err
	})
	if err != nil {
		return process{}, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "GET /metrics HTTP/1.0\r\nHost: %s\r\n\r\n", addr)
	body, err := io.ReadAll(c)
	if err != nil {
		return process{}, fmt.Errorf("reading %s/metrics: %w", addr, err)
	}
	p := process{metrics: map[string]float64{}}
	sc := bufio.NewScanner(strings.NewReader(string(body)))
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		name, _, _ := strings.Cut(line[:i], "{")
		p.metrics[name] += v
	}
	for name, to := range map[string]*float64{"go_goroutines": &p.goroutines, "process_resident_memory_bytes": &p.rss, "go_memstats_heap_inuse_bytes": &p.heap} {
		v, ok := p.metrics[name]
		if !ok {
			head := string(body[:min(len(body), 400)])
			return process{}, fmt.Errorf("%s/metrics has no %s; it answered:\n%s", addr, name, head)
		}
		*to = v
	}
	p.tcpConnections = p.metrics["coredns_wirecache_tcp_connections"]
	return p, nil
}

// sampler scrapes the cache under test every interval until stopped and keeps the highest figures.
type sampler struct {
	stop chan struct{}
	done chan struct{}
	mu   sync.Mutex
	peak process
	errs []error
}

func (r *rig) sample(interval time.Duration) *sampler {
	s := &sampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for {
			p, err := r.scrape(cacheMetrics)
			s.mu.Lock()
			if err != nil {
				s.errs = append(s.errs, err)
			}
			s.peak.goroutines = max(s.peak.goroutines, p.goroutines)
			s.peak.rss = max(s.peak.rss, p.rss)
			s.peak.heap = max(s.peak.heap, p.heap)
			s.peak.tcpConnections = max(s.peak.tcpConnections, p.tcpConnections)
			s.mu.Unlock()
			select {
			case <-s.stop:
				return
			case <-time.After(interval):
			}
		}
	}()
	return s
}

// end stops the sampler and returns the peak.
func (s *sampler) end() (process, []error) {
	close(s.stop)
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.peak, s.errs
}
