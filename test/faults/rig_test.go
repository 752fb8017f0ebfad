//go:build linux

package faults

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/privtest"
	"github.com/nodelocaldns/nodelocaldns/test/simnode"
)

// build is the node-cache binary, built once per test binary, with every plugin the cache needs compiled in:
// every fault here is about the rules and link notrack puts in place, so a build without notrack fails.
var build = simnode.SharedBuild{Prefix: "nodelocaldns-faults-", Check: func(binPath string) error {
	out, err := exec.Command(binPath, "-plugins").CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s -plugins: %w: %s", binPath, err, out)
	}
	if !slices.ContainsFunc(strings.Fields(string(out)), func(f string) bool { return f == "notrack" || f == "dns.notrack" }) {
		return fmt.Errorf("node-cache is built without the notrack plugin:\n%s", out)
	}
	return nil
}}

// kubeAPI is the API server of the package's nodes, shared as build is.
var kubeAPI simnode.SharedAPI

func TestMain(m *testing.M) {
	code := m.Run()
	build.Remove()
	if err := kubeAPI.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	os.Exit(code)
}

// binary returns the node-cache binary, built on first use.
func binary(t *testing.T) string {
	t.Helper()
	privtest.RequirePrivileged(t, append([]string{"go", "iptables-nft", "iptables-legacy"}, simnode.Tools...)...)
	return build.Binary(t)
}

// eventually bounds the waits for what the node does within a few sync or probe rounds: a failure bound for
// a busy machine, not an expectation. The times that tell something are logged.
const eventually = time.Minute

// terminationGrace is how long the kubelet waits after SIGTERM before it SIGKILLs the cache (Kubernetes'
// default terminationGracePeriodSeconds, which the manifests keep): a cache still running then is killed with
// its rules in place. Its own teardown is bounded far below this.
const terminationGrace = 30 * time.Second

// Ports of the metrics listeners, inside the simulated node's namespace.
const (
	cacheMetrics = "127.0.0.1:9253"
	guardMetrics = "127.0.0.1:9254"
)

// rig is a simulated node with its cluster DNS, its upstream resolver, and a node cache (notrack, sync
// every second) serving the link-local address and the kube-dns ClusterIP, as in iptables mode.
type rig struct {
	t          *testing.T
	n          *simnode.Node
	bin        string
	dir        string
	backend    string
	conf       string
	cache      *simnode.Process
	guard      *simnode.Process
	clusterDNS *simnode.Process
	// noCache leaves the cache plugin out of the Corefile: every lookup goes to the cluster DNS.
	noCache bool
	// handover makes the cache hand the node to the cluster DNS at exit instead of tearing it down.
	handover bool
	// wirecache puts wirecache in front of the cache, as the manifests do: hits cost a fraction of the CPU.
	wirecache bool
	// listen are the cache's addresses: the link-local one and the kube-dns ClusterIP (iptables mode),
	// or the link-local one only (IPVS mode); on a dual-stack node those of both families.
	listen []string
	// dualStack is set on a dual-stack node (newDualStackRig): the Service and upstream addresses are
	// those of both families.
	dualStack bool
}

func newRig(t *testing.T, backend string) *rig {
	t.Helper()
	return newRigMode(t, backend, simnode.IPTablesMode)
}

// newRigMode is newRig on a node whose kube-proxy runs in mode.
func newRigMode(t *testing.T, backend string, mode simnode.KubeProxyMode) *rig {
	t.Helper()
	return newRigWith(t, backend, mode, false)
}

// newRigWith is newRigMode; quiet starts the cluster DNS without its query log, for load. The node's rules
// are a real kube-proxy's (simnode.NewWithKubeProxy).
func newRigWith(t *testing.T, backend string, mode simnode.KubeProxyMode, quiet bool) *rig {
	t.Helper()
	return newRigOn(t, backend, quiet, func() *simnode.Node { return simnode.NewWithKubeProxy(t, &kubeAPI, mode) })
}

func newRigOn(t *testing.T, backend string, quiet bool, node func() *simnode.Node) *rig {
	t.Helper()
	bin := binary(t)
	n := node()
	var clusterDNS *simnode.Process
	if quiet {
		clusterDNS = n.StartQuietClusterDNS(bin)
	} else {
		clusterDNS = n.StartClusterDNS(bin)
	}
	r := &rig{clusterDNS: clusterDNS, t: t, n: n, bin: bin, dir: t.TempDir(), backend: backend, listen: []string{simnode.LinkLocalIP, simnode.KubeDNSClusterIP}}
	r.conf = filepath.Join(r.dir, "Corefile")
	r.writeCorefile(r.corefile(53))
	return r
}

func (r *rig) corefile(port int) string {
	cache := "cache 30"
	if r.noCache {
		cache = ""
	}
	if r.wirecache && !r.noCache {
		cache = "wirecache\n    " + cache
	}
	handover := ""
	if r.handover {
		handover = "\n        handover " + strings.Join(r.upstreamIPs(), " ")
		if services := r.serviceIPs(); len(services) > 0 {
			handover += "\n        service " + strings.Join(services, " ")
		}
	}
	return fmt.Sprintf(`.:%d {
    bind %s
    notrack {
        sync 1s
        backend %s
        lock %s%s
    }
    prometheus %s
    errors
    %s
    forward . %s
}
`, port, strings.Join(r.listen, " "), r.backend, filepath.Join(r.dir, "nodelocaldns.lock"), handover, cacheMetrics, cache, r.forwardTo())
}

func (r *rig) writeCorefile(content string) {
	r.t.Helper()
	if err := os.WriteFile(r.conf, []byte(content), 0o644); err != nil {
		r.t.Fatal(err)
	}
}

// startCache starts the node cache, with extra arguments, and waits until its rules are in place.
func (r *rig) startCache(extra ...string) *simnode.Process {
	r.t.Helper()
	p := r.n.Start(r.n.NodeNS, r.bin, append([]string{"-conf", r.conf}, extra...)...)
	r.cache = p
	r.waitLog(p, "rules in place for", 1, 20*time.Second)
	return p
}

// startGuard starts the guard with its defaults (probes every 250 ms from when the cache's lock file is
// closed, every 5 s while the cache answers; fail open after 3 failed rounds) and extra arguments.
func (r *rig) startGuard(extra ...string) *simnode.Process {
	r.t.Helper()
	args := []string{"-guard", "-localip", strings.Join(r.listen, ",")}
	if services := r.serviceIPs(); len(services) > 0 {
		args = append(args, "-guard.serviceips", strings.Join(services, ","))
	}
	args = append(args,
		"-guard.upstreamips", strings.Join(r.upstreamIPs(), ","),
		"-guard.backend", r.backend,
		"-guard.lockpath", filepath.Join(r.dir, "guard.lock"),
		"-lockfile", filepath.Join(r.dir, "nodelocaldns.lock"), // the cache's, which tells the guard it died
		"-metrics-listen-address", guardMetrics)
	p := r.n.Start(r.n.NodeNS, r.bin, append(args, extra...)...)
	r.guard = p
	r.waitLog(p, "nodelocal guard: watching", 1, eventually)
	return p
}

// killCacheWhileQuerying has the Pod ask server every 100 ms, SIGKILLs the cache a second in, and returns
// the samples once lookups have failed and recovered, or after 15 s.
func (r *rig) killCacheWhileQuerying(server string) []sample {
	r.t.Helper()
	cache := r.cache
	killAt := time.Now().Add(time.Second)
	killed := false
	return r.podLoop(server, 100*time.Millisecond, 500*time.Millisecond, 200, 15*time.Second, func(s []sample) bool {
		if !killed && time.Now().After(killAt) {
			kill(r.t, cache, syscall.SIGKILL)
			killed = true
		}
		return killed && recoveredAfterFailure(s)
	})
}

// waitLog waits until p's output holds s at least n times.
func (r *rig) waitLog(p *simnode.Process, s string, n int, timeout time.Duration) {
	r.t.Helper()
	deadline := time.Now().Add(timeout)
	for strings.Count(p.Output(), s) < n {
		if p.Exited() {
			r.t.Fatalf("process exited before logging %q: %v\n%s", s, p.Wait(0), p.Output())
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("no %q (%d times) within %v:\n%s", s, n, timeout, p.Output())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitFor polls cond every 20 ms and returns how long it took, failing the test after timeout.
func (r *rig) waitFor(what string, timeout time.Duration, cond func() bool) time.Duration {
	r.t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > timeout {
			r.t.Fatalf("not within %v: %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(start)
}

// ipt runs the rig's iptables in the node namespace.
func (r *rig) ipt(args ...string) (string, error) {
	return r.n.In(context.Background(), r.n.NodeNS, "iptables-"+r.backend, append([]string{"-w", "5"}, args...)...)
}

func (r *rig) mustIpt(args ...string) string {
	r.t.Helper()
	out, err := r.ipt(args...)
	if err != nil {
		r.t.Fatal(err)
	}
	return out
}

// jumps reports whether the cache's jump is the first rule of raw PREROUTING and OUTPUT and of filter
// INPUT and OUTPUT, in ip6tables too on a dual-stack node.
func (r *rig) jumps() bool {
	for _, ipt := range r.families() {
		for _, hook := range [][2]string{{"raw", "PREROUTING"}, {"raw", "OUTPUT"}, {"filter", "INPUT"}, {"filter", "OUTPUT"}} {
			out, err := ipt("-t", hook[0], "-S", hook[1], "1")
			if err != nil || !strings.Contains(out, "-j NODELOCALDNS") {
				return false
			}
		}
	}
	return true
}

// anyJump reports whether any hook still jumps to the cache's chains, in either family on a dual-stack
// node.
func (r *rig) anyJump() bool {
	for _, ipt := range r.families() {
		for _, table := range []string{"raw", "filter"} {
			out, _ := ipt("-t", table, "-S")
			if strings.Contains(out, "-j NODELOCALDNS") {
				return true
			}
		}
	}
	return false
}

// chainRules counts the rules of our chain in table, -1 when it does not exist.
func (r *rig) chainRules(table, chain string) int {
	out, err := r.ipt("-t", table, "-S", chain)
	if err != nil {
		return -1
	}
	return strings.Count(out, "-A "+chain+" ")
}

// linkAddrs returns the addresses on the cache's link, the kernel's own IPv6 link-local one aside, nil when
// it does not exist.
func (r *rig) linkAddrs() []string {
	out, err := r.n.In(context.Background(), r.n.NodeNS, "ip", "-o", "addr", "show", "dev", "nodelocaldns")
	if err != nil {
		return nil
	}
	var addrs []string
	for line := range strings.SplitSeq(out, "\n") {
		f := strings.Fields(line)
		for i := range f {
			if (f[i] == "inet" || f[i] == "inet6") && i+1 < len(f) && !strings.HasPrefix(f[i+1], "fe80:") {
				addrs = append(addrs, strings.Split(f[i+1], "/")[0])
			}
		}
	}
	if addrs == nil {
		addrs = []string{}
	}
	return addrs
}

func has(list []string, s string) bool {
	return slices.Contains(list, s)
}

// scrape reads one metric's value from a Prometheus endpoint in the node namespace; labels, when given,
// must appear in the series.
func (r *rig) scrape(addr, name, labels string) (float64, error) {
	var c net.Conn
	err := r.n.Do(r.n.NodeNS, func() (err error) {
		c, err = net.DialTimeout("tcp", addr, 2*time.Second)
		return err
	})
	if err != nil {
		return 0, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "GET /metrics HTTP/1.0\r\nHost: %s\r\n\r\n", addr)
	body, err := io.ReadAll(c)
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(strings.NewReader(string(body)))
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) || !strings.Contains(line, labels) {
			continue
		}
		rest := strings.TrimPrefix(line, name)
		if rest == "" || (rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		f := strings.Fields(line)
		return strconv.ParseFloat(f[len(f)-1], 64)
	}
	return 0, fmt.Errorf("no metric %s%s at %s", name, labels, addr)
}

func (r *rig) mustScrape(addr, name, labels string) float64 {
	r.t.Helper()
	v, err := r.scrape(addr, name, labels)
	if err != nil {
		r.t.Fatal(err)
	}
	return v
}

// queryOnce asks server for kubernetes.default.svc.cluster.local over a fresh UDP socket, as a stub
// resolver does. It must run on a thread inside the namespace to query from.
func queryOnce(server string, timeout time.Duration) error {
	c, err := net.DialTimeout("udp", server, timeout)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	co := &dns.Conn{Conn: c}
	m := new(dns.Msg)
	m.SetQuestion("kubernetes.default.svc.cluster.local.", dns.TypeA)
	if err := co.WriteMsg(m); err != nil {
		return err
	}
	resp, err := co.ReadMsg()
	if err != nil {
		return err
	}
	if resp.Id != m.Id || resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 {
		return fmt.Errorf("unexpected answer: %v", resp)
	}
	return nil
}

// sample is one lookup of a load loop.
type sample struct {
	start, end time.Time
	err        error
}

// podLoop queries server from the Pod namespace every interval (each query waits for its answer, at most
// timeout) until stop says so, at most max queries or until limit has passed.
func (r *rig) podLoop(server string, interval, timeout time.Duration, max int, limit time.Duration, stop func([]sample) bool) []sample {
	var samples []sample
	err := r.n.Do(r.n.PodNS, func() error {
		deadline := time.Now().Add(limit)
		next := time.Now()
		for len(samples) < max && time.Now().Before(deadline) && !stop(samples) {
			if d := time.Until(next); d > 0 {
				time.Sleep(d)
			}
			next = next.Add(interval)
			s := sample{start: time.Now()}
			s.err = queryOnce(server, timeout)
			s.end = time.Now()
			samples = append(samples, s)
		}
		return nil
	})
	if err != nil {
		r.t.Fatal(err)
	}
	return samples
}

// hammer runs workers goroutines in the Pod namespace, each sending queries back to back (waiting for
// each answer) until d has passed or max queries were sent in all, and returns the counts.
func (r *rig) hammer(server string, workers int, d time.Duration, max int64) (ok, failed int64) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	deadline := time.Now().Add(d)
	perWorker := max / int64(workers)
	for range workers {
		wg.Go(func() {
			var o, f int64
			err := r.n.Do(r.n.PodNS, func() error {
				for i := int64(0); i < perWorker && time.Now().Before(deadline); i++ {
					if err := queryOnce(server, time.Second); err != nil {
						f++
					} else {
						o++
					}
				}
				return nil
			})
			if err != nil {
				r.t.Error(err)
			}
			mu.Lock()
			ok, failed = ok+o, failed+f
			mu.Unlock()
		})
	}
	wg.Wait()
	return ok, failed
}

// podQuery asks server once from the Pod namespace, waiting as long as a Pod's resolver does (glibc's
// timeout): a lookup answered within it resolved, however busy the machine.
func (r *rig) podQuery(server string) error {
	return r.n.Do(r.n.PodNS, func() error { return queryOnce(server, clientTimeout) })
}

func kill(t *testing.T, p *simnode.Process, sig syscall.Signal) {
	t.Helper()
	if err := p.Signal(sig); err != nil {
		t.Fatal(err)
	}
}

var (
	kubeDNS   = net.JoinHostPort(simnode.KubeDNSClusterIP, "53")
	linkLocal = net.JoinHostPort(simnode.LinkLocalIP, "53")
)
