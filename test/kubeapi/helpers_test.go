//go:build linux

package kubeapi

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	manifests "github.com/nodelocaldns/nodelocaldns/examples/kubernetes"
	"github.com/nodelocaldns/nodelocaldns/internal/kubeapi"
	"github.com/nodelocaldns/nodelocaldns/test/simnode"
)

// waitLimit bounds every wait for evidence; it is a failure bound for a busy machine, not an expectation.
const waitLimit = 2 * time.Minute

// strict is how every object goes in: an unknown or duplicate field is an error, not a warning.
var strict = metav1.CreateOptions{FieldValidation: metav1.FieldValidationStrict}

// nodeCacheBinary builds cmd/node-cache once per test binary.
var nodeCacheBinary = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "kubeapi-node-cache-")
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	return simnode.BuildNodeCache(ctx, dir)
})

func TestMain(m *testing.M) {
	code := m.Run()
	if bin, err := nodeCacheBinary(); err == nil {
		os.RemoveAll(filepath.Dir(bin))
	}
	os.Exit(code)
}

// waitFor polls cond until it holds; it fails the test after waitLimit.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %s", what, waitLimit)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// manifest loads the iptables manifest, whose ServiceAccount, Role, RoleBinding and kube-dns-upstream
// Service the plugin tests use (the three manifests have the same ones).
func manifest(t *testing.T) *manifests.Objects {
	t.Helper()
	objs, err := manifests.Load("nodelocaldns-iptables.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(objs.ServiceAccounts) != 1 || len(objs.Roles) != 1 || len(objs.RoleBindings) != 1 {
		t.Fatalf("the manifest has %d ServiceAccounts, %d Roles, %d RoleBindings; the tests expect one each",
			len(objs.ServiceAccounts), len(objs.Roles), len(objs.RoleBindings))
	}
	return objs
}

// serviceAccountToken creates the manifest's ServiceAccount and asks the API for a token of it.
func serviceAccountToken(t *testing.T, admin kubernetes.Interface, objs *manifests.Objects) string {
	t.Helper()
	ctx := context.Background()
	sa := objs.ServiceAccounts[0]
	if _, err := admin.CoreV1().ServiceAccounts(sa.Namespace).Create(ctx, sa.DeepCopy(), strict); err != nil {
		t.Fatalf("creating ServiceAccount %s/%s: %v", sa.Namespace, sa.Name, err)
	}
	tr, err := admin.CoreV1().ServiceAccounts(sa.Namespace).CreateToken(ctx, sa.Name, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("TokenRequest for %s/%s: %v", sa.Namespace, sa.Name, err)
	}
	return tr.Status.Token
}

func createRole(t *testing.T, admin kubernetes.Interface, objs *manifests.Objects) {
	t.Helper()
	r := objs.Roles[0]
	if _, err := admin.RbacV1().Roles(r.Namespace).Create(context.Background(), r.DeepCopy(), strict); err != nil {
		t.Fatalf("creating Role %s/%s: %v", r.Namespace, r.Name, err)
	}
}

func createRoleBinding(t *testing.T, admin kubernetes.Interface, objs *manifests.Objects) {
	t.Helper()
	rb := objs.RoleBindings[0]
	if _, err := admin.RbacV1().RoleBindings(rb.Namespace).Create(context.Background(), rb.DeepCopy(), strict); err != nil {
		t.Fatalf("creating RoleBinding %s/%s: %v", rb.Namespace, rb.Name, err)
	}
}

// upstreamService is the manifest's kube-dns-upstream Service with its ClusterIP and both ports set to the
// responder's, so that what upstreamsvc forwards to lands on the responder.
func upstreamService(t *testing.T, objs *manifests.Objects, r *responder) *corev1.Service {
	t.Helper()
	svc := objs.Service("kube-dns-upstream")
	if svc == nil {
		t.Fatal("the manifest has no Service kube-dns-upstream")
	}
	svc = svc.DeepCopy()
	svc.Spec.ClusterIP = r.ip
	svc.Spec.ClusterIPs = []string{r.ip}
	for i := range svc.Spec.Ports {
		svc.Spec.Ports[i].Port = int32(r.port)
	}
	return svc
}

// createService creates svc and checks it got the ClusterIP asked for.
func createService(t *testing.T, admin kubernetes.Interface, svc *corev1.Service) {
	t.Helper()
	got, err := admin.CoreV1().Services(svc.Namespace).Create(context.Background(), svc, strict)
	if err != nil {
		t.Fatalf("creating Service %s/%s with ClusterIP %s: %v", svc.Namespace, svc.Name, svc.Spec.ClusterIP, err)
	}
	if got.Spec.ClusterIP != svc.Spec.ClusterIP {
		t.Fatalf("Service %s/%s got ClusterIP %s, asked for %s", svc.Namespace, svc.Name, got.Spec.ClusterIP, svc.Spec.ClusterIP)
	}
}

func deleteService(t *testing.T, admin kubernetes.Interface, namespace, name string) {
	t.Helper()
	if err := admin.CoreV1().Services(namespace).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("deleting Service %s/%s: %v", namespace, name, err)
	}
}

// responder is a DNS server on a ClusterIP (an address of 127.0.0.0/8 in kubeapi.ServiceCIDR) that answers
// every A query with that address, so a test can tell which upstream answered.
type responder struct {
	ip       string
	port     int
	udp, tcp *dns.Server
}

// usedClusterIPs keeps the responders of one test binary on distinct addresses.
var usedClusterIPs sync.Map

// startResponder starts a responder on a random, unused address of 127.96.128.0/17 (the part of the
// server's Service range the API does not hand out first) on one port for UDP and TCP.
func startResponder(t *testing.T) *responder {
	t.Helper()
	for range 20 {
		ip := fmt.Sprintf("127.96.%d.%d", 128+rand.IntN(128), 1+rand.IntN(254))
		if _, taken := usedClusterIPs.LoadOrStore(ip, true); taken {
			continue
		}
		r, err := listenResponder(ip)
		if err != nil {
			continue
		}
		t.Cleanup(r.close)
		return r
	}
	t.Fatal("no address and port free for a responder")
	return nil
}

func listenResponder(ip string) (*responder, error) {
	tl, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		return nil, err
	}
	pc, err := net.ListenPacket("udp", tl.Addr().String())
	if err != nil {
		tl.Close()
		return nil, err
	}
	r := &responder{ip: ip, port: tl.Addr().(*net.TCPAddr).Port}
	answer := dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		if len(q.Question) == 1 && q.Question[0].Qtype == dns.TypeA {
			m.Answer = []dns.RR{&dns.A{
				Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET},
				A:   net.ParseIP(ip),
			}}
		}
		_ = w.WriteMsg(m)
	})
	r.udp = &dns.Server{PacketConn: pc, Handler: answer}
	r.tcp = &dns.Server{Listener: tl, Handler: answer}
	started := make(chan struct{}, 2)
	r.udp.NotifyStartedFunc = func() { started <- struct{}{} }
	r.tcp.NotifyStartedFunc = func() { started <- struct{}{} }
	go r.udp.ActivateAndServe()
	go r.tcp.ActivateAndServe()
	<-started
	<-started
	return r, nil
}

func (r *responder) addr() string { return net.JoinHostPort(r.ip, fmt.Sprint(r.port)) }

func (r *responder) close() {
	_ = r.udp.Shutdown()
	_ = r.tcp.Shutdown()
}

// nodeCache is a node-cache process (plain CoreDNS with this repository's plugins) serving the cluster
// zone on loopback with upstreamsvc, with its output kept for the test to read.
type nodeCache struct {
	cmd         *exec.Cmd
	dnsAddr     string
	metricsAddr string
	out         *syncBuffer
	exited      chan struct{}
}

// startNodeCache runs node-cache on a Corefile whose cluster.local block holds upstreamsvc with the given
// properties, and waits until its metrics answer. The process is stopped when the test ends.
func startNodeCache(t *testing.T, upstreamsvcProps ...string) *nodeCache {
	t.Helper()
	bin, err := nodeCacheBinary()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for attempt := 1; ; attempt++ {
		dnsPort, metricsPort := freePort(t), freePort(t)
		nc := &nodeCache{
			dnsAddr:     fmt.Sprintf("127.0.0.1:%d", dnsPort),
			metricsAddr: fmt.Sprintf("127.0.0.1:%d", metricsPort),
			out:         &syncBuffer{},
			exited:      make(chan struct{}),
		}
		conf := filepath.Join(dir, "Corefile")
		corefile := fmt.Sprintf("cluster.local:%d {\n    bind 127.0.0.1\n    prometheus %s\n    upstreamsvc {\n        %s\n    }\n}\n",
			dnsPort, nc.metricsAddr, strings.Join(upstreamsvcProps, "\n        "))
		if err := os.WriteFile(conf, []byte(corefile), 0o644); err != nil {
			t.Fatal(err)
		}
		nc.cmd = exec.Command(bin, "-conf", conf)
		nc.cmd.Env = cleanEnv()
		nc.cmd.Stdout, nc.cmd.Stderr = nc.out, nc.out
		nc.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := nc.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { _ = nc.cmd.Wait(); close(nc.exited) }()
		t.Cleanup(nc.stop)
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("node-cache output:\n%s", nc.out.String())
			}
		})
		deadline := time.Now().Add(waitLimit)
		for {
			if _, err := nc.metrics(); err == nil {
				return nc
			}
			select {
			case <-nc.exited:
			case <-time.After(50 * time.Millisecond):
				if time.Now().Before(deadline) {
					continue
				}
				t.Fatalf("node-cache's metrics did not answer within %s; output:\n%s", waitLimit, nc.out.String())
			}
			break
		}
		if !strings.Contains(nc.out.String(), "address already in use") || attempt == 3 {
			t.Fatalf("node-cache exited (%v); output:\n%s", nc.cmd.ProcessState, nc.out.String())
		}
	}
}

// runNodeCacheToExit runs node-cache on a Corefile as startNodeCache does and returns its output once it
// exits, for a configuration that must not start.
func runNodeCacheToExit(t *testing.T, upstreamsvcProps ...string) (string, error) {
	t.Helper()
	bin, err := nodeCacheBinary()
	if err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(t.TempDir(), "Corefile")
	corefile := fmt.Sprintf("cluster.local:%d {\n    bind 127.0.0.1\n    upstreamsvc {\n        %s\n    }\n}\n",
		freePort(t), strings.Join(upstreamsvcProps, "\n        "))
	if err := os.WriteFile(conf, []byte(corefile), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-conf", conf)
	cmd.Env = cleanEnv()
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// cleanEnv is the test's environment without Service variables, so that upstreamsvc sees only the API.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasSuffix(name, "_SERVICE_HOST") || strings.Contains(name, "_SERVICE_PORT") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

func (nc *nodeCache) stop() {
	select {
	case <-nc.exited:
		return
	default:
	}
	_ = nc.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-nc.exited:
	case <-time.After(30 * time.Second):
		_ = nc.cmd.Process.Kill()
		<-nc.exited
	}
}

// metrics fetches node-cache's Prometheus metrics as text.
func (nc *nodeCache) metrics() (string, error) {
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get("http://" + nc.metricsAddr + "/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("/metrics: %s", resp.Status)
	}
	return string(b), err
}

var upstreamInfoLine = regexp.MustCompile(`(?m)^coredns_upstreamsvc_upstream_info\{([^}]*)\} 1$`)
var labelPair = regexp.MustCompile(`(\w+)="([^"]*)"`)

// upstreams is coredns_upstreamsvc_upstream_info: where queries go ("source to", sorted), e.g. "api 127.96.1.2:53".
func (nc *nodeCache) upstreams() []string {
	text, err := nc.metrics()
	if err != nil {
		return nil
	}
	var out []string
	for _, m := range upstreamInfoLine.FindAllStringSubmatch(text, -1) {
		labels := map[string]string{}
		for _, l := range labelPair.FindAllStringSubmatch(m[1], -1) {
			labels[l[1]] = l[2]
		}
		out = append(out, labels["source"]+" "+labels["to"])
	}
	return out
}

// waitUpstream waits until the plugin reports that queries go to exactly want ("source to").
func (nc *nodeCache) waitUpstream(t *testing.T, want string) {
	t.Helper()
	waitFor(t, "coredns_upstreamsvc_upstream_info of "+want, func() bool {
		got := nc.upstreams()
		return len(got) == 1 && got[0] == want
	})
}

// waitLog waits for a line of node-cache's output that contains every one of parts.
func (nc *nodeCache) waitLog(t *testing.T, parts ...string) string {
	t.Helper()
	var found string
	waitFor(t, fmt.Sprintf("node-cache log line with %q", parts), func() bool {
		for line := range strings.SplitSeq(nc.out.String(), "\n") {
			all := true
			for _, p := range parts {
				all = all && strings.Contains(line, p)
			}
			if all {
				found = line
				return true
			}
		}
		return false
	})
	return found
}

// answeredBy asks node-cache for an A record and returns the responder address in the answer.
func (nc *nodeCache) answeredBy() (string, error) {
	m := new(dns.Msg)
	m.SetQuestion("probe.default.svc.cluster.local.", dns.TypeA)
	c := &dns.Client{Net: "udp", Timeout: 5 * time.Second}
	r, _, err := c.Exchange(m, nc.dnsAddr)
	if err != nil {
		return "", err
	}
	if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
		return "", fmt.Errorf("rcode %s with %d answers", dns.RcodeToString[r.Rcode], len(r.Answer))
	}
	a, ok := r.Answer[0].(*dns.A)
	if !ok {
		return "", fmt.Errorf("answer is %T", r.Answer[0])
	}
	return a.A.String(), nil
}

// wantAnsweredBy checks that a query through node-cache is answered by r.
func (nc *nodeCache) wantAnsweredBy(t *testing.T, r *responder) {
	t.Helper()
	got, err := nc.answeredBy()
	if err != nil || got != r.ip {
		t.Fatalf("query through node-cache: answered by %q (%v), want the responder on %s", got, err, r.ip)
	}
}

// syncBuffer is a bytes.Buffer for a process's output, read while the process writes.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	// CoreDNS also needs UDP on the port.
	pc, err := net.ListenPacket("udp", l.Addr().String())
	if err != nil {
		return freePort(t)
	}
	pc.Close()
	return port
}

// serviceAccountEvents are the audit events of the manifest's ServiceAccount made by upstreamsvc.
func serviceAccountEvents(t *testing.T, s *kubeapi.Server, objs *manifests.Objects) []kubeapi.AuditEvent {
	t.Helper()
	all, err := s.AuditEvents()
	if err != nil {
		t.Fatal(err)
	}
	sa := objs.ServiceAccounts[0]
	user := "system:serviceaccount:" + sa.Namespace + ":" + sa.Name
	var out []kubeapi.AuditEvent
	for _, e := range all {
		if e.User.Username == user && strings.Contains(e.UserAgent, "nodelocaldns-upstreamsvc") {
			out = append(out, e)
		}
	}
	return out
}

// apiProxy is a TCP relay on loopback between upstreamsvc and kube-apiserver. Down closes its listener and
// cuts every connection, as a network partition or a crashed API server does (the client then sees its
// connections end and new ones refused); Up listens again on the same port. Tests use it to hand the
// client back only a kube-apiserver that is ready: one that has just started answers for a moment before
// its RBAC caches are filled.
type apiProxy struct {
	t      *testing.T
	target string
	addr   string

	mu    sync.Mutex
	l     net.Listener
	conns map[net.Conn]bool
}

func startAPIProxy(t *testing.T, target string) *apiProxy {
	t.Helper()
	p := &apiProxy{t: t, target: target, addr: fmt.Sprintf("127.0.0.1:%d", freePort(t)), conns: map[net.Conn]bool{}}
	p.up()
	t.Cleanup(p.down)
	return p
}

func (p *apiProxy) url() string { return "https://" + p.addr }

func (p *apiProxy) up() {
	p.t.Helper()
	l, err := net.Listen("tcp", p.addr)
	if err != nil {
		p.t.Fatalf("the API proxy cannot listen on %s again: %v", p.addr, err)
	}
	p.mu.Lock()
	p.l = l
	p.mu.Unlock()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go p.relay(c)
		}
	}()
}

func (p *apiProxy) down() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.l != nil {
		p.l.Close()
		p.l = nil
	}
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}

func (p *apiProxy) relay(client net.Conn) {
	server, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		client.Close()
		return
	}
	p.mu.Lock()
	if p.l == nil {
		p.mu.Unlock()
		client.Close()
		server.Close()
		return
	}
	p.conns[client], p.conns[server] = true, true
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(server, client); done <- struct{}{} }()
	go func() { _, _ = io.Copy(client, server); done <- struct{}{} }()
	<-done
	client.Close()
	server.Close()
	p.mu.Lock()
	delete(p.conns, client)
	delete(p.conns, server)
	p.mu.Unlock()
}
