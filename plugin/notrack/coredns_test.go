//go:build linux

package notrack

import (
	"bytes"
	"context"
	"fmt"
	stdlog "log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin/pkg/dnstest"
	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"

	// The plugins the Corefiles of these tests use.
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/whoami"

	"github.com/nodelocaldns/nodelocaldns/internal/netnstest"
	"github.com/nodelocaldns/nodelocaldns/internal/privtest"
	"github.com/nodelocaldns/nodelocaldns/nodelocal"
	_ "github.com/nodelocaldns/nodelocaldns/plugin/health"
)

func TestMain(m *testing.M) {
	// notrack is an external plugin: run it where plugin.cfg puts it, right after bind.
	dirs := slices.Clone(dnsserver.Directives)
	dirs = slices.Insert(dirs, slices.Index(dirs, "bind")+1, pluginName)
	if err := dnsserver.SetDirectives(dirs); err != nil {
		panic(err)
	}
	os.Exit(m.Run())
}

// logBuffer records what CoreDNS and the plugin log.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// since returns what was logged after mark, a length of String.
func (l *logBuffer) since(mark int) string { return l.String()[mark:] }

// nsEnv is a test running in a network namespace of its own, with kube-proxy's DNAT of the kube-dns
// ClusterIP pointing at a stand-in kube-dns on loopback.
type nsEnv struct {
	t       *testing.T
	mode    nodelocal.Backend
	lock    string
	log     *logBuffer
	kubeDNS atomic.Int64 // queries the stand-in kube-dns got
}

func inNamespace(t *testing.T, mode nodelocal.Backend) *nsEnv {
	t.Helper()
	privtest.RequirePrivileged(t, append([]string{"ip"}, privtest.IptablesCommands(string(mode))...)...)
	if !netnstest.Run(t) {
		return nil
	}
	e := &nsEnv{t: t, mode: mode, lock: filepath.Join(t.TempDir(), "nodelocaldns.lock"), log: &logBuffer{}}
	stdlog.SetOutput(e.log)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("log:\n%s", e.log)
		}
		stdlog.SetOutput(os.Stderr)
	})
	kubeDNS := dnstest.NewMultipleServer(func(w dns.ResponseWriter, r *dns.Msg) {
		e.kubeDNS.Add(1)
		m := new(dns.Msg)
		m.SetReply(r)
		m.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: r.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 5}, A: net.ParseIP("192.0.2.99")}}
		w.WriteMsg(m)
	})
	t.Cleanup(kubeDNS.Close)
	_, port, _ := net.SplitHostPort(kubeDNS.Addr)
	for _, proto := range []string{"udp", "tcp"} {
		e.iptables("-t", "nat", "-A", "OUTPUT", "-d", "10.96.0.10/32", "-p", proto, "-m", proto, "--dport", "53",
			"-m", "comment", "--comment", "kube-proxy stand-in", "-j", "DNAT", "--to-destination", "127.0.0.1:"+port)
	}
	return e
}

func (e *nsEnv) tool(name string) string {
	return strings.Replace(name, "tables", "tables-"+string(e.mode), 1)
}

func (e *nsEnv) iptables(args ...string) {
	e.t.Helper()
	if out, err := exec.Command(e.tool("iptables"), append([]string{"-w", "5"}, args...)...).CombinedOutput(); err != nil {
		e.t.Fatalf("iptables %v: %v: %s", args, err, out)
	}
}

// ours returns our rules in raw and filter, chain declarations included, without counters.
func (e *nsEnv) ours() []string {
	e.t.Helper()
	var lines []string
	for _, save := range []string{"iptables-save", "ip6tables-save"} {
		for _, table := range []string{"raw", "filter"} {
			out, err := exec.Command(e.tool(save), "-t", table).CombinedOutput()
			if err != nil {
				e.t.Fatalf("%s: %v: %s", save, err, out)
			}
			for l := range strings.SplitSeq(string(out), "\n") {
				if strings.Contains(l, "nodelocaldns") || strings.Contains(l, nodelocal.RulesChain) {
					if i := strings.Index(l, " ["); strings.HasPrefix(l, ":") && i > 0 {
						l = l[:i]
					}
					lines = append(lines, save[:len(save)-5]+" "+table+" "+l)
				}
			}
		}
	}
	slices.Sort(lines)
	return lines
}

// covered returns the destination addresses of our raw NOTRACK rules.
func (e *nsEnv) covered() []string {
	var addrs []string
	for _, l := range e.ours() {
		f := strings.Fields(l)
		if len(f) < 4 || f[1] != "raw" || f[2] != "-A" || f[3] != nodelocal.RulesChain {
			continue
		}
		if i := slices.Index(f, "-d"); i > 0 {
			addrs = append(addrs, strings.TrimSuffix(strings.TrimSuffix(f[i+1], "/32"), "/128"))
		}
	}
	slices.Sort(addrs)
	return slices.Compact(addrs)
}

// waitLimit bounds the waits for evidence: a failure bound for a busy machine, not an expectation.
const waitLimit = time.Minute

func (e *nsEnv) waitCovered(want ...string) {
	e.t.Helper()
	slices.Sort(want)
	deadline := time.Now().Add(waitLimit)
	for !slices.Equal(e.covered(), want) {
		if time.Now().After(deadline) {
			e.t.Fatalf("rules cover %v, want %v:\n%s", e.covered(), want, strings.Join(e.ours(), "\n"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (e *nsEnv) waitLog(s string) {
	e.t.Helper()
	deadline := time.Now().Add(waitLimit)
	for !strings.Contains(e.log.String(), s) {
		if time.Now().After(deadline) {
			e.t.Fatalf("nothing logged %q", s)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func linkAddrs(t *testing.T, name string) ([]string, bool) {
	t.Helper()
	l, err := netlink.LinkByName(name)
	if err != nil {
		return nil, false
	}
	list, err := netlink.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, a := range list {
		if !a.IP.IsLinkLocalUnicast() || a.IP.To4() != nil {
			out = append(out, a.IP.String())
		}
	}
	slices.Sort(out)
	return out, true
}

func (e *nsEnv) expectLink(want ...string) {
	e.t.Helper()
	slices.Sort(want)
	got, ok := linkAddrs(e.t, "nodelocaldns")
	if !ok || !slices.Equal(got, want) {
		e.t.Fatalf("link nodelocaldns (exists %v) holds %v, want %v", ok, got, want)
	}
}

func (e *nsEnv) expectNothingLeft() {
	e.t.Helper()
	if _, ok := linkAddrs(e.t, "nodelocaldns"); ok {
		e.t.Error("link nodelocaldns still exists")
	}
	if left := e.ours(); len(left) > 0 {
		e.t.Errorf("rules left behind:\n%s", strings.Join(left, "\n"))
	}
}

func (e *nsEnv) corefile(addrs string, extra ...string) caddy.CaddyfileInput {
	body := fmt.Sprintf(`cluster.local:53 {
    bind %[1]s
    notrack {
        backend %[2]s
        lock %[3]s
        ports 8080
        %[4]s
    }
    health 169.254.20.10:8080
    ready 127.0.0.1:8181
    whoami
}
.:53 {
    bind %[1]s
    notrack
    whoami
}
`, addrs, e.mode, e.lock, strings.Join(extra, "\n        "))
	return caddy.CaddyfileInput{Contents: []byte(body), ServerTypeName: "dns"}
}

// whoami asks server over UDP and returns the answer's first record, as a string.
func whoami(t *testing.T, server string) string {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion("whoami.cluster.local.", dns.TypeA)
	r, _, err := (&dns.Client{Timeout: 2 * time.Second}).Exchange(m, server)
	if err != nil {
		t.Fatalf("query %s: %v", server, err)
	}
	if len(r.Answer) == 0 && len(r.Extra) == 0 {
		return r.String()
	}
	if len(r.Answer) > 0 {
		return r.Answer[0].String()
	}
	return r.Extra[0].String()
}

func ready(t *testing.T) bool {
	t.Helper()
	resp, err := http.Get("http://127.0.0.1:8181/ready")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func shutdown(t *testing.T, inst *caddy.Instance) time.Duration {
	t.Helper()
	start := time.Now()
	if errs := inst.ShutdownCallbacks(); len(errs) > 0 {
		t.Errorf("shutdown callbacks: %v", errs)
	}
	inst.Stop()
	inst.Wait()
	return time.Since(start)
}

// TestLifecycle runs CoreDNS with notrack on 169.254.20.10 and the kube-dns ClusterIP 10.96.0.10 through its
// start, reloads and final shutdown.
func TestLifecycle(t *testing.T) {
	for _, mode := range []nodelocal.Backend{nodelocal.BackendNFT, nodelocal.BackendLegacy} {
		t.Run(string(mode), func(t *testing.T) { testLifecycle(t, mode) })
	}
}

func testLifecycle(t *testing.T, mode nodelocal.Backend) {
	e := inNamespace(t, mode)
	if e == nil {
		return
	}
	start := time.Now()
	inst, err := caddy.Start(e.corefile("169.254.20.10 10.96.0.10 fd00::10"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { inst.ShutdownCallbacks(); inst.Stop() })
	// The addresses are there once CoreDNS has started: bind listens on them.
	e.expectLink("10.96.0.10", "169.254.20.10", "fd00::10")
	e.waitCovered("10.96.0.10", "169.254.20.10", "fd00::10")
	t.Logf("rules in place %v after caddy.Start was called", time.Since(start).Round(time.Millisecond))
	e.waitLog("rules in place for 10.96.0.10:53, 169.254.20.10:53, [fd00::10]:53")
	// The probe of 10.96.0.10 reached this server, not the stand-in kube-dns behind the DNAT.
	if n := e.kubeDNS.Load(); n != 0 {
		t.Errorf("kube-dns got %d queries while the rules went in", n)
	}
	// With the rules, host traffic to the ClusterIP skips the DNAT and reaches the cache.
	if got := whoami(t, "10.96.0.10:53"); strings.Contains(got, "192.0.2.99") {
		t.Errorf("10.96.0.10 answered by kube-dns: %s", got)
	}
	deadline := time.Now().Add(waitLimit)
	for !ready(t) {
		if time.Now().After(deadline) {
			t.Fatal("ready never reported ready")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if strings.Contains(strings.Join(e.ours(), "\n"), "probe") {
		t.Errorf("the probe rule stayed:\n%s", strings.Join(e.ours(), "\n"))
	}
	before := e.ours()

	// A reload of the same Corefile changes nothing on the node.
	mark := len(e.log.String())
	inst, err = inst.Restart(e.corefile("169.254.20.10 10.96.0.10 fd00::10"))
	if err != nil {
		t.Fatal(err)
	}
	if after := e.ours(); !slices.Equal(after, before) {
		t.Errorf("rules changed by a reload of the same Corefile:\n%s\nwant\n%s", strings.Join(after, "\n"), strings.Join(before, "\n"))
	}
	if l := e.log.since(mark); strings.Contains(l, "nodelocal:") {
		t.Errorf("the reload touched the node:\n%s", l)
	}
	e.expectLink("10.96.0.10", "169.254.20.10", "fd00::10")

	// A reload with one address more and one less applies both.
	inst, err = inst.Restart(e.corefile("169.254.20.10 169.254.20.11"))
	if err != nil {
		t.Fatal(err)
	}
	e.waitCovered("169.254.20.10", "169.254.20.11")
	e.expectLink("169.254.20.10", "169.254.20.11")
	for _, l := range e.ours() {
		if strings.Contains(l, "-A OUTPUT") || strings.Contains(l, "-A PREROUTING") || strings.Contains(l, "-A INPUT") {
			if n := slices.Index(e.ours(), l); slices.Index(e.ours()[n+1:], l) >= 0 {
				t.Errorf("duplicate jump %s", l)
			}
		}
	}
	if got := whoami(t, "169.254.20.11:53"); !strings.Contains(got, "whoami") && !strings.Contains(got, "169.254.20.11") {
		t.Errorf("169.254.20.11 answered %s", got)
	}
	before = e.ours()

	// A broken Corefile fails the reload; the old instance keeps serving with its rules.
	if _, err := inst.Restart(caddy.CaddyfileInput{Contents: []byte(".:53 {\n bind 169.254.20.10\n notrack {\n sync never\n }\n}\n"), ServerTypeName: "dns"}); err == nil {
		t.Fatal("reload of a broken Corefile succeeded")
	}
	// So does a Corefile that asks for another link: that needs a restart.
	_, err = inst.Restart(e.corefile("169.254.20.10 169.254.20.11", "interface nl1"))
	if err == nil || !strings.Contains(err.Error(), "restart CoreDNS") {
		t.Fatalf("reload to another interface: %v", err)
	}
	if _, ok := linkAddrs(t, "nl1"); ok {
		t.Error("the failed reload created nl1")
	}
	// And one that fails after notrack started it, in a later plugin: what it added goes again.
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	later := e.corefile("169.254.20.10 169.254.20.11 169.254.20.12")
	later.Contents = bytes.Replace(later.Contents, []byte("health 169.254.20.10:8080"), []byte("health "+taken.Addr().String()), 1)
	if _, err := inst.Restart(later); err == nil || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("reload with the health port taken: %v", err)
	}
	// The failed instance's probe of 169.254.20.12 ends with it, on its own goroutine, and only then drops
	// its use of the probe exemption: wait for that, then nothing else may differ.
	deadline = time.Now().Add(waitLimit)
	for after := e.ours(); !slices.Equal(after, before); after = e.ours() {
		if time.Now().After(deadline) {
			t.Errorf("rules changed by failed reloads:\n%s\nwant\n%s", strings.Join(after, "\n"), strings.Join(before, "\n"))
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	e.expectLink("169.254.20.10", "169.254.20.11")
	whoami(t, "169.254.20.11:53")

	took := shutdown(t, inst)
	t.Logf("final shutdown took %v", took.Round(time.Millisecond))
	e.expectNothingLeft()
}

// TestRulesWaitForTheServer drops the probes: the addresses go in, the rules wait, ready says not ready.
// Once the probes get through, the rules follow.
func TestRulesWaitForTheServer(t *testing.T) {
	e := inNamespace(t, nodelocal.BackendNFT)
	if e == nil {
		return
	}
	e.iptables("-A", "OUTPUT", "-m", "mark", "--mark", "0x53", "-j", "DROP")
	inst, err := caddy.Start(e.corefile("169.254.20.10 10.96.0.10"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { inst.ShutdownCallbacks(); inst.Stop() })
	e.expectLink("10.96.0.10", "169.254.20.10")
	time.Sleep(1500 * time.Millisecond)
	if got := e.covered(); len(got) > 0 {
		t.Fatalf("rules for %v went in before the server answered", got)
	}
	if ready(t) {
		t.Error("ready before the rules")
	}
	e.iptables("-D", "OUTPUT", "-m", "mark", "--mark", "0x53", "-j", "DROP")
	e.waitCovered("10.96.0.10", "169.254.20.10")
	shutdown(t, inst)
	e.expectNothingLeft()
}

// TestFailedStartLeavesNothing takes a port the start needs: a DNS port, then the extra TCP port.
func TestFailedStartLeavesNothing(t *testing.T) {
	for _, tc := range []struct{ name, network, addr string }{
		{"dns-udp", "udp", "0.0.0.0:53"},
		{"dns-tcp", "tcp", "0.0.0.0:53"},
		{"health-tcp", "tcp", "0.0.0.0:8080"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := inNamespace(t, nodelocal.BackendNFT)
			if e == nil {
				return
			}
			var closer interface{ Close() error }
			var err error
			if tc.network == "udp" {
				closer, err = net.ListenPacket("udp", tc.addr)
			} else {
				closer, err = net.Listen("tcp", tc.addr)
			}
			if err != nil {
				t.Fatal(err)
			}
			defer closer.Close()
			inst, err := caddy.Start(e.corefile("169.254.20.10 10.96.0.10"))
			if err == nil {
				shutdown(t, inst)
				t.Fatal("started with a port taken")
			}
			if !strings.Contains(err.Error(), "cannot listen on") {
				t.Errorf("error %v, want notrack's", err)
			}
			e.expectNothingLeft()
			// Nothing holds the node lock either: a start with the port free works.
			closer.Close()
			inst, err = caddy.Start(e.corefile("169.254.20.10 10.96.0.10"))
			if err != nil {
				t.Fatal(err)
			}
			e.waitCovered("10.96.0.10", "169.254.20.10")
			shutdown(t, inst)
			e.expectNothingLeft()
		})
	}
}

// TestSkipTeardown leaves the link and the rules at shutdown; the next start takes them over.
func TestSkipTeardown(t *testing.T) {
	e := inNamespace(t, nodelocal.BackendNFT)
	if e == nil {
		return
	}
	inst, err := caddy.Start(e.corefile("169.254.20.10", "skip_teardown"))
	if err != nil {
		t.Fatal(err)
	}
	e.waitCovered("169.254.20.10")
	rulesBefore := e.ours()
	shutdown(t, inst)
	e.expectLink("169.254.20.10")
	if got := e.ours(); !slices.Equal(got, rulesBefore) {
		t.Fatalf("skip_teardown: rules\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(rulesBefore, "\n"))
	}
	inst, err = caddy.Start(e.corefile("169.254.20.10"))
	if err != nil {
		t.Fatal(err)
	}
	e.waitCovered("169.254.20.10")
	shutdown(t, inst)
	e.expectNothingLeft()
}

// TestShutdownIsBounded holds the xtables lock, so that iptables-legacy cannot remove the rules: the
// shutdown event still returns while the lock is held, cut short by the teardown's deadline, and the link goes.
func TestShutdownIsBounded(t *testing.T) {
	e := inNamespace(t, nodelocal.BackendLegacy)
	if e == nil {
		return
	}
	inst, err := caddy.Start(e.corefile("169.254.20.10"))
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Stop()
	e.waitCovered("169.254.20.10")

	f, err := os.OpenFile(os.Getenv(netnstest.EnvXtablesLock), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	mark := len(e.log.String())
	start := time.Now()
	returned := make(chan struct{})
	go func() {
		defer close(returned)
		// What SIGTERM does first, before any shutdown callback.
		caddy.EmitEvent(caddy.ShutdownEvent, "SIGTERM")
	}()
	// The lock stays held until the event returns: an unbounded teardown would wait for it forever. The
	// limit only turns such a hang into a failure; the bound itself is the teardown's deadline, and the log
	// must show the deadline ended it.
	select {
	case <-returned:
	case <-time.After(2 * time.Minute):
		syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		<-returned
		t.Fatalf("the shutdown event did not return while the xtables lock was held; log:\n%s", e.log.since(mark))
	}
	t.Logf("shutdown with the xtables lock held took %v", time.Since(start).Round(time.Millisecond))
	if logged := e.log.since(mark); !strings.Contains(logged, "teardown incomplete") || !strings.Contains(logged, context.DeadlineExceeded.Error()) {
		t.Errorf("the log does not show the teardown cut short by its deadline:\n%s", logged)
	}
	if _, ok := linkAddrs(t, "nodelocaldns"); ok {
		t.Error("the link stayed")
	}
	syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	// The callbacks that follow find nothing left to do.
	if errs := inst.ShutdownCallbacks(); len(errs) > 0 {
		t.Errorf("shutdown callbacks: %v", errs)
	}
}

// TestLeaveEverythingToOthers needs no privilege: with no_interface and no_rules notrack changes nothing on
// the node and takes no node lock.
func TestLeaveEverythingToOthers(t *testing.T) {
	lock := filepath.Join(t.TempDir(), "nodelocaldns.lock")
	port := freeDNSPort(t)
	corefile := fmt.Sprintf(".:%s {\n bind 127.0.0.1\n notrack {\n  no_interface\n  no_rules\n  lock %s\n }\n whoami\n}\n", port, lock)
	inst, err := caddy.Start(caddy.CaddyfileInput{Contents: []byte(corefile), ServerTypeName: "dns"})
	if err != nil {
		t.Fatal(err)
	}
	whoami(t, "127.0.0.1:"+port)
	if _, err := os.Stat(lock); !os.IsNotExist(err) {
		t.Errorf("lock file: %v", err)
	}
	h := theNode
	if !(&Notrack{block: &block{}}).Ready() {
		t.Error("not ready")
	}
	shutdown(t, inst)
	if h.rec != nil {
		t.Error("a Reconciler was made")
	}
}

// TestReloadWithoutNotrackNeverFails: a reload to a Corefile without notrack tears the node down from the
// old instance's shutdown callback, after the new instance already serves. When that teardown fails (the
// xtables lock held, so iptables-legacy cannot remove the rules), the reload must still succeed: caddy
// takes an error from a shutdown callback for a failed reload. The failure is logged instead.
func TestReloadWithoutNotrackNeverFails(t *testing.T) {
	e := inNamespace(t, nodelocal.BackendLegacy)
	if e == nil {
		return
	}
	inst, err := caddy.Start(e.corefile("169.254.20.10"))
	if err != nil {
		t.Fatal(err)
	}
	e.waitCovered("169.254.20.10")

	f, err := os.OpenFile(os.Getenv(netnstest.EnvXtablesLock), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	next, err := inst.Restart(caddy.CaddyfileInput{Contents: []byte(".:1053 {\n    bind 127.0.0.1\n    whoami\n}\n"), ServerTypeName: "dns"})
	syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	if err != nil {
		inst.Stop()
		t.Fatalf("the reload failed: %v", err)
	}
	defer shutdown(t, next)
	e.waitLog("teardown incomplete")
	if got := whoami(t, "127.0.0.1:1053"); !strings.Contains(got, "127.0.0.1") {
		t.Errorf("the new instance answers %q", got)
	}
}

// freeDNSPort returns a port of 127.0.0.1 that is free over TCP and UDP alike, as CoreDNS binds both: a
// port found free for one only may be taken for the other (the machine's outgoing connections use the
// same range), and a CoreDNS whose listener fails ends its first start without shutdown callbacks.
func freeDNSPort(t *testing.T) string {
	t.Helper()
	for range 100 {
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
	t.Fatal("no port of 127.0.0.1 free over both TCP and UDP in 100 tries")
	return ""
}
