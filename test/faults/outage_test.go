//go:build linux

package faults

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/corefile"
	"github.com/nodelocaldns/nodelocaldns/test/simnode"
)

// Bounds the outage test holds the node cache to, the figures. clientTimeout is a Pod resolver's
// (glibc's default): a lookup not answered within it has failed. failFast is "well under a second" for a
// SERVFAIL while the upstream is known to be down; the answer takes a millisecond or so on loopback-like
// veths, so the bound is only there to tell a fast failure from a client timeout.
const (
	clientTimeout = 5 * time.Second
	failFast      = time.Second
	// changedTTL is the TTL clients see for web.default.svc (3600 in the zone, clamp's MAX of 30 s in the
	// shipped configuration): once the cluster DNS is back, its changed address must show within it.
	changedTTL = 30 * time.Second
	// knownDownWithin bounds how long the node takes to learn that the cluster DNS stopped answering:
	// the first queries' connection attempts and three failed health checks, a few seconds.
	knownDownWithin = 20 * time.Second
)

// hotName is a name Pods on the node already use, with the answer they get.
type hotName struct {
	name  string
	qtype uint16
	rcode int
	want  string // an address in the answer; empty for NXDOMAIN
}

func (h hotName) String() string { return h.name + " " + dns.TypeToString[h.qtype] }

// problem says what is wrong with m as an answer to h: "" when it is the answer. want overrides h.want.
func (h hotName) problem(m *dns.Msg, err error, want string) string {
	if err != nil {
		return err.Error()
	}
	if m.Rcode != h.rcode {
		return "rcode " + dns.RcodeToString[m.Rcode]
	}
	if want == "" {
		return ""
	}
	for _, rr := range m.Answer {
		switch a := rr.(type) {
		case *dns.A:
			if a.A.String() == want {
				return ""
			}
		case *dns.AAAA:
			if a.AAAA.String() == want {
				return ""
			}
		}
	}
	return fmt.Sprintf("answer %v, want %s", m.Answer, want)
}

// lookup asks server one question over a fresh UDP socket, as a stub resolver does, and waits up to
// timeout. It must run on a thread inside the namespace to ask from.
func lookup(server, name string, qtype uint16, timeout time.Duration) (*dns.Msg, time.Duration, error) {
	start := time.Now()
	c, err := net.DialTimeout("udp", server, timeout)
	if err != nil {
		return nil, 0, err
	}
	defer c.Close()
	c.SetDeadline(start.Add(timeout))
	co := &dns.Conn{Conn: c}
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name), qtype)
	if err := co.WriteMsg(q); err != nil {
		return nil, time.Since(start), err
	}
	m, err := co.ReadMsg()
	took := time.Since(start)
	if err != nil {
		return nil, took, err
	}
	if m.Id != q.Id {
		return nil, took, fmt.Errorf("reply ID %d to query %d", m.Id, q.Id)
	}
	return m, took, nil
}

// outcome is one lookup of an unknown name.
type outcome struct {
	at    time.Duration // since the outage began
	took  time.Duration
	rcode int // -1 when the lookup got no answer
	err   error
}

// TestClusterDNSOutage runs the shipped configuration (corefile.Render, as the manifests' DaemonSet runs it)
// with the fail-open guard beside it, and takes the cluster DNS away for 60 s (FAULTS_OUTAGE_DURATION):
// first hung (SIGSTOP: connections are accepted, nothing answers), then gone (SIGKILL: connections are
// refused). Throughout, Pods keep getting answers for the names they used before: every lookup of them is
// answered, from the caches' stale entries once those expire. Names the node never saw get SERVFAIL well
// under a second once the node knows the cluster DNS is down. The guard does not fail the node open. When
// the cluster DNS comes back with a changed record, the node serves the new record within its TTL, with no
// restart.
func TestClusterDNSOutage(t *testing.T) {
	outage := 60 * time.Second
	if v := os.Getenv("FAULTS_OUTAGE_DURATION"); v != "" {
		var err error
		if outage, err = time.ParseDuration(v); err != nil {
			t.Fatalf("FAULTS_OUTAGE_DURATION: %v", err)
		}
	}
	if outage < changedTTL+10*time.Second {
		t.Fatalf("an outage of %v ends before the hot names' entries expire (%v) and go stale; use 40s or more", outage, changedTTL)
	}
	bin := binary(t)
	n := simnode.NewWithKubeProxy(t, &kubeAPI, simnode.IPTablesMode)
	r := &rig{t: t, n: n, bin: bin, dir: t.TempDir(), backend: "nft", listen: []string{simnode.LinkLocalIP, simnode.KubeDNSClusterIP}}
	r.clusterDNS = n.StartClusterDNS(bin)
	n.StartExternalResolver(bin)

	conf := r.writeShippedCorefile()
	if !strings.Contains(conf, "serve_stale") {
		t.Fatalf("the shipped configuration does not serve stale answers:\n%s", conf)
	}
	r.startShippedCache()
	r.startGuard()

	hot := []hotName{
		{name: "kubernetes.default.svc.cluster.local", qtype: dns.TypeA, want: "10.96.0.1"},
		{name: "web.default.svc.cluster.local", qtype: dns.TypeA, want: "10.244.2.7"},
		{name: "web.default.svc.cluster.local", qtype: dns.TypeAAAA, want: "fd00:10:244:2::7"},
		{name: "gone.default.svc.cluster.local", qtype: dns.TypeA, rcode: dns.RcodeNameError},
	}
	webA := hot[1]
	const changedWeb = "10.244.2.8"
	err := n.Do(n.PodNS, func() error {
		for _, h := range hot {
			m, _, err := lookup(kubeDNS, h.name, h.qtype, clientTimeout)
			if p := h.problem(m, err, h.want); p != "" {
				return fmt.Errorf("before the outage: %s: %s", h, p)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	// Pods ask the hot names every 100 ms from the start of the outage until the new record has shown.
	var (
		mu          sync.Mutex
		hotFailures []string
		hotAsked    int
		webChanged  bool // set once the changed web address was seen; it must not go back
	)
	start := time.Now()
	kill(t, r.clusterDNS, syscall.SIGSTOP)
	stopHot := make(chan struct{})
	hotDone := make(chan error, 1)
	go func() {
		hotDone <- n.Do(n.PodNS, func() error {
			for i := 0; ; i++ {
				select {
				case <-stopHot:
					return nil
				case <-time.After(100 * time.Millisecond):
				}
				h := hot[i%len(hot)]
				m, _, err := lookup(kubeDNS, h.name, h.qtype, clientTimeout)
				mu.Lock()
				hotAsked++
				want := h.want
				if h == webA && webChanged {
					want = changedWeb
				}
				p := h.problem(m, err, want)
				if p != "" && h == webA && !webChanged && h.problem(m, err, changedWeb) == "" {
					webChanged, p = true, ""
				}
				if p != "" {
					hotFailures = append(hotFailures, fmt.Sprintf("%v into the outage: %s: %s", time.Since(start).Round(time.Millisecond), h, p))
				}
				mu.Unlock()
			}
		})
	}()
	defer func() {
		select {
		case <-stopHot:
		default:
			close(stopHot)
			<-hotDone
		}
	}()

	// Meanwhile, every 500 ms, a name nobody asked before. Halfway, the hung cluster DNS is killed.
	var unknown []outcome
	err = n.Do(n.PodNS, func() error {
		killed := false
		for i := 0; time.Since(start) < outage; i++ {
			if !killed && time.Since(start) > outage/2 {
				if err := r.clusterDNS.Signal(syscall.SIGKILL); err != nil {
					return err
				}
				killed = true
			}
			o := outcome{at: time.Since(start), rcode: -1}
			var m *dns.Msg
			m, o.took, o.err = lookup(kubeDNS, fmt.Sprintf("unknown-%d.default.svc.cluster.local", i), dns.TypeA, clientTimeout)
			if m != nil {
				o.rcode = m.Rcode
			}
			unknown = append(unknown, o)
			time.Sleep(500 * time.Millisecond)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = r.clusterDNS.Wait(10 * time.Second) // killed; its exit status is "signal: killed"

	// The node learns that the cluster DNS is down, and from then on fails unknown names fast.
	knownDown := -1
	for i, o := range unknown {
		if o.rcode == dns.RcodeServerFailure && o.took < failFast {
			knownDown = i
			break
		}
	}
	switch {
	case knownDown < 0:
		t.Errorf("no unknown name got a fast SERVFAIL during the outage: %v", unknown)
	case unknown[knownDown].at > knownDownWithin:
		t.Errorf("the first fast SERVFAIL came %v into the outage, want within %v: %v", unknown[knownDown].at, knownDownWithin, unknown[:knownDown+1])
	default:
		for _, o := range unknown[knownDown:] {
			if o.rcode != dns.RcodeServerFailure || o.took >= failFast {
				t.Errorf("%v into the outage, after the node knew: an unknown name got rcode %d (err %v) after %v, want SERVFAIL within %v",
					o.at.Round(time.Millisecond), o.rcode, o.err, o.took, failFast)
			}
		}
	}

	// The cluster DNS comes back, with web.default.svc moved.
	changed := strings.Replace(simnode.ClusterZone, "IN A   10.244.2.7", "IN A   "+changedWeb, 1)
	if changed == simnode.ClusterZone {
		t.Fatal("the zone has no web.default.svc A record to change")
	}
	r.clusterDNS = n.StartClusterDNSZone(bin, changed)
	back := time.Now()
	r.waitFor("the changed web.default.svc address through the node cache", changedTTL, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return webChanged
	})
	seenAfter := time.Since(back)
	var recovered bool
	err = n.Do(n.PodNS, func() error {
		m, _, err := lookup(kubeDNS, "unknown-after.default.svc.cluster.local", dns.TypeA, clientTimeout)
		if err != nil {
			return err
		}
		recovered = m.Rcode == dns.RcodeNameError
		return nil
	})
	if err != nil || !recovered {
		t.Errorf("after the outage, an unknown name is not NXDOMAIN from the cluster DNS (err %v)", err)
	}
	time.Sleep(time.Second) // a few more rounds of the hot names with the changed record
	close(stopHot)
	if err := <-hotDone; err != nil {
		t.Fatal(err)
	}

	mu.Lock()
	if len(hotFailures) > 0 {
		t.Errorf("%d of %d lookups of hot names were not answered as before the outage:\n%s", len(hotFailures), hotAsked, strings.Join(hotFailures, "\n"))
	}
	asked := hotAsked
	mu.Unlock()

	// What an alert sees: stale answers, fast failures and failed health checks of kube-dns-upstream.
	zone := `zones="cluster.local."`
	// wirecache is the shipped blocks' only cache; its series has a server label, no zone.
	stale := r.mustScrape(cacheMetrics, "coredns_wirecache_served_stale_total", "")
	fast := r.mustScrape(cacheMetrics, "coredns_upstreamsvc_failfast_total", zone)
	checks := r.mustScrape(cacheMetrics, "coredns_proxy_healthcheck_failures_total", `proxy_name="upstreamsvc"`)
	if stale == 0 || fast == 0 || checks == 0 {
		t.Errorf("metrics: served stale %v, failfast %v, health-check failures %v; want each above 0", stale, fast, checks)
	}

	// The guard watched a cache that answered, and left the node alone.
	if v := r.mustScrape(guardMetrics, "coredns_nodecache_guard_failovers_total", ""); v != 0 {
		t.Errorf("the guard failed the node open %v times during the upstream outage\n%s", v, r.guard.Output())
	}
	if v := r.mustScrape(guardMetrics, "coredns_nodecache_guard_state", ""); v != 0 {
		t.Errorf("guard state %v after the outage, want 0 (watching)", v)
	}
	if !r.jumps() {
		t.Error("the cache's jumps are gone")
	}

	t.Logf("outage of %v: %d lookups of %d hot names, all answered; %d unknown names, the first fast SERVFAIL %v in, "+
		"before it %s; changed record seen %v after the cluster DNS answered again (TTL %v); "+
		"served stale %v, failfast %v, health-check failures %v",
		outage, asked, len(hot), len(unknown), unknownAt(unknown, knownDown), beforeKnown(unknown, knownDown),
		seenAfter.Round(time.Millisecond), changedTTL, stale, fast, checks)
}

func unknownAt(unknown []outcome, i int) time.Duration {
	if i < 0 {
		return -1
	}
	return unknown[i].at.Round(time.Millisecond)
}

// beforeKnown lists how the unknown names asked before the node knew the upstream was down fared.
func beforeKnown(unknown []outcome, i int) string {
	if i < 0 {
		i = len(unknown)
	}
	var out []string
	for _, o := range unknown[:i] {
		what := "timeout"
		if o.rcode >= 0 {
			what = dns.RcodeToString[o.rcode]
		}
		out = append(out, fmt.Sprintf("%s after %v", what, o.took.Round(time.Millisecond)))
	}
	return "[" + strings.Join(out, ", ") + "]"
}

// writeShippedCorefile writes the shipped configuration (corefile.Render, as the manifests' DaemonSet runs
// it) for the rig's node to r.conf and returns it: the link-local address and the kube-dns ClusterIP, the
// cluster DNS through kube-dns-upstream, other names to the node's resolver, metrics on cacheMetrics.
func (r *rig) writeShippedCorefile() string {
	r.t.Helper()
	cfg := corefile.Config{
		LocalIPs:       []netip.Addr{netip.MustParseAddr(simnode.LinkLocalIP)},
		ClusterDNSIPs:  []netip.Addr{netip.MustParseAddr(simnode.KubeDNSClusterIP)},
		NodeUpstreams:  []string{simnode.ExtResolverIP},
		MetricsAddress: cacheMetrics,
		Notrack:        corefile.Notrack{Backend: r.backend, Lock: filepath.Join(r.dir, "nodelocaldns.lock")},
	}
	conf, err := corefile.Render(cfg)
	if err != nil {
		r.t.Fatal(err)
	}
	r.conf = filepath.Join(r.dir, "Corefile")
	r.writeCorefile(string(conf))
	return string(conf)
}

// startShippedCache starts the cache on r.conf with a Pod's environment (podEnv) and waits until its rules
// are in place.
func (r *rig) startShippedCache() *simnode.Process {
	r.t.Helper()
	r.cache = r.n.StartEnv(r.n.NodeNS, podEnv(r.dir), r.bin, "-conf", r.conf)
	r.waitLog(r.cache, "rules in place for", 1, 20*time.Second)
	return r.cache
}

// podEnv is the node cache's environment in a Pod: no Kubernetes API (unreachable from the simulated
// node), the kube-dns-upstream Service's variables as the kubelet sets them, an xtables lock of its own.
func podEnv(dir string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "KUBERNETES_") && !strings.HasPrefix(kv, "KUBE_DNS_UPSTREAM_") && !strings.HasPrefix(kv, "XTABLES_LOCKFILE=") {
			env = append(env, kv)
		}
	}
	return append(env,
		"KUBE_DNS_UPSTREAM_SERVICE_HOST="+simnode.UpstreamClusterIP,
		"XTABLES_LOCKFILE="+filepath.Join(dir, "xtables.lock"))
}
