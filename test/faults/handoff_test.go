//go:build linux

package faults

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nodelocaldns/nodelocaldns/test/simnode"
)

// Replacing the cache must not cost a lookup. A Pod-side client sends lookups to the kube-dns ClusterIP and
// to the link-local address, each lookup with a 1 s timeout, while the cache is replaced the way each kind
// of rolling update replaces it; every lookup must be answered.
//
//	NODELOCALDNS_REQUIRE_PRIVILEGED=1 go test -v -run 'TestReplace|TestHandoff|TestSuccessor|TestTwoQuick' ./test/faults/

// Load of the replacement tests: restartLoadRate lookups per second to each of the two addresses, 2,000
// a second in all, for at least restartLoadMin.
const (
	restartLoadRate = 1000
	restartLoadMin  = 15 * time.Second
)

// startLoad starts lookups to both addresses from the Pod and lets them run for two seconds before the
// caller replaces the cache. The function it returns ends the load (once restartLoadMin has passed) and
// returns the results per address.
func (r *rig) startLoad() (stop func() map[string]simnode.LoadResult) {
	done := make(chan struct{})
	var results map[string]simnode.LoadResult
	loaded := make(chan struct{})
	go func() {
		defer close(loaded)
		results = r.runLoad(done)
	}()
	time.Sleep(2 * time.Second) // the load is running
	return func() map[string]simnode.LoadResult {
		close(done)
		<-loaded
		return results
	}
}

// runLoad sends lookups to both addresses from the Pod until at least restartLoadMin has passed and done
// is closed, and returns the results per address.
func (r *rig) runLoad(done <-chan struct{}) map[string]simnode.LoadResult {
	r.t.Helper()
	var (
		mu      sync.Mutex
		results = map[string]simnode.LoadResult{}
		wg      sync.WaitGroup
	)
	for _, server := range r.servers() {
		wg.Go(func() {
			res, err := r.n.RunLoad(context.Background(), r.n.PodNS, simnode.Load{
				Server: server, Name: "kubernetes.default.svc.cluster.local",
				Rate: r.loadRate(), Duration: restartLoadMin, Until: done, Timeout: time.Second,
				Sockets: 32, SocketReuse: 20,
			})
			if err != nil {
				r.t.Errorf("load to %s: %v", server, err)
			}
			mu.Lock()
			results[server] = res
			mu.Unlock()
		})
	}
	wg.Wait()
	return results
}

// checkNoLookupLost fails the test unless every lookup of the load was answered.
func (r *rig) checkNoLookupLost(results map[string]simnode.LoadResult) {
	r.t.Helper()
	for _, server := range r.servers() {
		res := results[server]
		r.t.Logf("%s: %v", server, res)
		if res.Failed() != 0 {
			r.t.Errorf("%s: %d of %d lookups failed (%v)", server, res.Failed(), res.Sent, res)
		}
		if want := int(float64(r.loadRate()) * restartLoadMin.Seconds()); res.Sent < want {
			r.t.Errorf("%s: %d lookups sent, want at least %d", server, res.Sent, want)
		}
	}
}

// checkServedUntracked checks that the node is the cache's again: its jumps and addresses in place, no
// divert left, and Pod lookups to both addresses answered without a conntrack entry.
func (r *rig) checkServedUntracked() {
	r.t.Helper()
	if r.n.Mode == simnode.NFTablesMode {
		if !r.hooked() || !r.linkHoldsAll() {
			r.t.Errorf("after the replacement: hooked %v, link %v", r.hooked(), r.linkAddrs())
		}
		if out, err := r.nft("list", "table", "inet", "nodelocaldns-guard"); err == nil {
			r.t.Errorf("the divert is still there:\n%s", out)
		}
	} else {
		if !r.jumps() || !r.linkHoldsAll() {
			r.t.Errorf("after the replacement: jumps %v, link %v", r.jumps(), r.linkAddrs())
		}
		for _, ipt := range r.families() {
			if out, err := ipt("-t", "nat", "-S", "NODELOCALDNS-GUARD"); err == nil {
				r.t.Errorf("the divert is still there:\n%s", out)
			}
		}
	}
	if err := r.n.FlushConntrack(); err != nil {
		r.t.Fatal(err)
	}
	for _, server := range r.servers() {
		for range 5 {
			if err := r.podQuery(server); err != nil {
				r.t.Errorf("%s: %v", server, err)
			}
		}
		host, _, _ := net.SplitHostPort(server)
		entries, err := r.n.ConntrackEntries("udp", host)
		if err != nil {
			r.t.Fatal(err)
		}
		if len(entries) != 0 {
			r.t.Errorf("Pod lookups to %s are tracked again after the replacement:\n%s", server, strings.Join(entries, "\n"))
		}
	}
}

// startSuccessor starts a second cache with the same Corefile beside the running one and waits until it
// has taken the node over.
func (r *rig) startSuccessor() *simnode.Process {
	r.t.Helper()
	p := r.n.Start(r.n.NodeNS, r.bin, "-conf", r.conf)
	r.waitLog(p, "took the node over from", 1, 30*time.Second)
	return p
}

func (r *rig) stop(p *simnode.Process) {
	r.t.Helper()
	kill(r.t, p, syscall.SIGTERM)
	if err := p.Wait(20 * time.Second); err != nil && !strings.Contains(err.Error(), "exit status") {
		r.t.Fatalf("the cache did not exit after SIGTERM: %v\n%s", err, p.Output())
	}
}

// newHandoverRig is a rig whose cache hands the node over at exit, built for load: wirecache in front of
// the cache, as in the manifests, and a cluster DNS that does not log every query.
func newHandoverRig(t *testing.T) *rig {
	r := newRigWith(t, "nft", simnode.IPTablesMode, true)
	r.handover, r.wirecache = true, true
	r.writeCorefile(r.corefile(53))
	return r
}

// TestReplaceWithAGap is a rolling update with maxUnavailable: SIGTERM, and the new cache 3 s later. The
// old one hands the node to the cluster DNS (kube-proxy serves the ClusterIP, the link-local address goes
// through kube-proxy's chain of kube-dns-upstream), the new one takes it back once it answers.
func TestReplaceWithAGap(t *testing.T) {
	r := newHandoverRig(t)
	old := r.startCache()
	stopLoad := r.startLoad()
	r.stop(old)
	if !strings.Contains(old.Output(), "handed the node to the cluster DNS") {
		t.Errorf("the old cache did not hand the node over:\n%s", old.Output())
	}
	if r.anyJump() || has(r.linkAddrs(), simnode.KubeDNSClusterIP) || !has(r.linkAddrs(), simnode.LinkLocalIP) {
		t.Errorf("after the hand-over: jumps %v, link %v; want no jumps and the link-local address only", r.anyJump(), r.linkAddrs())
	}
	if out := r.mustIpt("-t", "nat", "-S", "NODELOCALDNS-GUARD"); !strings.Contains(out, "--to-destination "+simnode.ClusterDNSPodIP+":53") || strings.Contains(out, "KUBE-SVC-") {
		t.Errorf("the link-local address is not diverted to the cluster DNS's endpoint, or refers to kube-proxy's chains:\n%s", out)
	}
	time.Sleep(3 * time.Second) // the gap of the rolling update
	r.startCache()
	results := stopLoad()
	r.checkNoLookupLost(results)
	r.checkServedUntracked()
}

// TestNFTablesReplaceWithAGap is TestReplaceWithAGap on a node whose kube-proxy runs in nftables mode: the
// old cache unhooks its table and DNATs the link-local address to kube-dns-upstream's endpoints in the
// divert's table, the new one takes the node back, and no lookup is lost.
func TestNFTablesReplaceWithAGap(t *testing.T) {
	r := newRigWith(t, "auto", simnode.NFTablesMode, true)
	r.handover, r.wirecache = true, true
	r.writeCorefile(r.corefile(53))
	old := r.startCache()
	stopLoad := r.startLoad()
	r.stop(old)
	if !strings.Contains(old.Output(), "handed the node to the cluster DNS") {
		t.Errorf("the old cache did not hand the node over:\n%s", old.Output())
	}
	if r.hooked() || has(r.linkAddrs(), simnode.KubeDNSClusterIP) || !has(r.linkAddrs(), simnode.LinkLocalIP) {
		t.Errorf("after the hand-over: hooked %v, link %v; want the table unhooked and the link-local address only", r.hooked(), r.linkAddrs())
	}
	if out, err := r.nft("list", "table", "inet", "nodelocaldns-guard"); err != nil || !strings.Contains(out, "dnat ip to "+simnode.ClusterDNSPodIP+":53") {
		t.Errorf("the link-local address is not diverted to the cluster DNS's endpoint: %v\n%s", err, out)
	}
	time.Sleep(3 * time.Second) // the gap of the rolling update
	r.startCache()
	results := stopLoad()
	r.checkNoLookupLost(results)
	r.checkServedUntracked()
}

// TestKubeProxyDeletesTheUpstreamWhileDiverted: a cache that stopped without a successor left the divert
// (a rolling update's gap, an uninstall's); kube-dns-upstream is then deleted, and kube-proxy deletes its
// chains. Its sync goes through (simnode fails the test otherwise), since nothing of ours refers to its
// chains, and both addresses still answer: the link-local one through the divert's DNAT to the endpoint,
// the kube-dns ClusterIP through kube-proxy. (Left without endpoints instead: kubeproxy_test.go.)
func TestKubeProxyDeletesTheUpstreamWhileDiverted(t *testing.T) {
	r := newHandoverRig(t)
	old := r.startCache()
	r.stop(old)
	if !strings.Contains(old.Output(), "handed the node to the cluster DNS") {
		t.Fatalf("the cache did not hand the node over:\n%s", old.Output())
	}
	r.n.KubeProxy.DeleteService(simnode.UpstreamService)
	for _, server := range []string{kubeDNS, linkLocal} {
		if err := r.podQuery(server); err != nil {
			t.Errorf("%s once kube-proxy deleted kube-dns-upstream's chains: %v", server, err)
		}
	}
}

// TestReplaceWithASuccessor is a rolling update with maxSurge: the new cache starts beside the old one,
// takes the node over once it answers, and the old one is SIGTERMed: it drains and leaves everything to
// its successor.
func TestReplaceWithASuccessor(t *testing.T) {
	r := newHandoverRig(t)
	old := r.startCache()
	stopLoad := r.startLoad()
	next := r.startSuccessor()
	r.waitLog(old, "handed the node over", 1, 10*time.Second)
	r.stop(old)
	if !strings.Contains(old.Output(), "left the link, the addresses and the rules to the successor") {
		t.Errorf("the old cache did not leave the node to its successor:\n%s", old.Output())
	}
	results := stopLoad()
	r.checkNoLookupLost(results)
	r.checkServedUntracked()
	if next.Exited() {
		t.Fatalf("the successor exited: %v", next.Wait(0))
	}
	r.cache = next
}

// surgeReplacements is how many surge replacements in a row TestSurgeReplacementsLoseNothing makes.
const surgeReplacements = 20

// TestSurgeReplacementsLoseNothing replaces the cache surgeReplacements times in a row, each the way a
// rolling update with maxSurge does (the new cache beside the old one, taking the node over once it
// answers, the old one SIGTERMed once it let go), under load over UDP and over TCP to both addresses, in
// both kube-proxy modes: not one lookup may be lost. The successor turns net.ipv4.tcp_migrate_req on for
// the old listeners' accept queues and back off once they are gone.
func TestSurgeReplacementsLoseNothing(t *testing.T) {
	for _, mode := range []simnode.KubeProxyMode{simnode.IPTablesMode, simnode.NFTablesMode} {
		t.Run(string(mode), func(t *testing.T) {
			backend := "nft"
			if mode == simnode.NFTablesMode {
				backend = "auto"
			}
			r := newRigWith(t, backend, mode, true)
			r.handover, r.wirecache = true, true
			r.writeCorefile(r.corefile(53))
			migrateReq := func() string {
				out, err := r.n.In(context.Background(), r.n.NodeNS, "sysctl", "-n", "net.ipv4.tcp_migrate_req")
				if err != nil {
					t.Fatal(err)
				}
				return strings.TrimSpace(out)
			}
			before := migrateReq()
			cache := r.startCache()
			done := make(chan struct{})
			tcpResults := map[string]simnode.LoadResult{}
			var tcpLoad sync.WaitGroup
			var tcpMu sync.Mutex
			for _, server := range []string{kubeDNS, linkLocal} {
				tcpLoad.Go(func() {
					res, err := r.n.RunTCPLoad(context.Background(), r.n.PodNS, simnode.Load{
						Server: server, Name: "kubernetes.default.svc.cluster.local",
						Rate: 100, Duration: restartLoadMin, Until: done, Timeout: time.Second, Sockets: 50,
					})
					if err != nil {
						t.Errorf("TCP load to %s: %v", server, err)
					}
					tcpMu.Lock()
					tcpResults[server] = res
					tcpMu.Unlock()
				})
			}
			stopLoad := r.startLoad()
			for i := range surgeReplacements {
				next := r.startSuccessor()
				r.waitLog(cache, "handed the node over", 1, 10*time.Second)
				r.stop(cache)
				if !strings.Contains(cache.Output(), "left the link, the addresses and the rules to the successor") {
					t.Fatalf("replacement %d: the old cache did not leave the node to its successor:\n%s", i+1, cache.Output())
				}
				cache, r.cache = next, next
			}
			results := stopLoad()
			close(done)
			tcpLoad.Wait()
			r.checkNoLookupLost(results)
			for _, server := range []string{kubeDNS, linkLocal} {
				res := tcpResults[server]
				t.Logf("%s over TCP: %v", server, res)
				if res.Failed() != 0 || res.Sent == 0 {
					t.Errorf("%s over TCP: %d of %d lookups failed (%v)", server, res.Failed(), res.Sent, res)
				}
			}
			r.checkServedUntracked()
			r.waitFor("tcp_migrate_req back to "+before, 10*time.Second, func() bool { return migrateReq() == before })
		})
	}
}

// TestTwoQuickRestarts restarts the cache twice in a row, each new one started as soon as the old one
// exited, under load.
func TestTwoQuickRestarts(t *testing.T) {
	r := newHandoverRig(t)
	first := r.startCache()
	stopLoad := r.startLoad()
	r.stop(first)
	second := r.startCache()
	r.stop(second)
	r.startCache()
	results := stopLoad()
	r.checkNoLookupLost(results)
	r.checkServedUntracked()
}

// TestHandoffOwnerKilledMidway: the owner is SIGKILLed while its successor is taking over. The successor
// takes the node and serves both addresses.
func TestHandoffOwnerKilledMidway(t *testing.T) {
	r := newHandoverRig(t)
	old := r.startCache()
	next := r.n.Start(r.n.NodeNS, r.bin, "-conf", r.conf)
	r.waitLog(next, "another instance owns this node", 1, 20*time.Second)
	kill(t, old, syscall.SIGKILL)
	// Before or after its own probes answered, the successor takes the node the dead owner let go of.
	r.waitLog(next, "took the node over", 1, 30*time.Second)
	r.cache = next
	r.waitFor("the successor's rules in place", 10*time.Second, r.jumps)
	for _, server := range []string{kubeDNS, linkLocal} {
		if err := r.podQuery(server); err != nil {
			t.Errorf("%s after the owner died mid hand-off: %v", server, err)
		}
	}
}

// TestSuccessorWithABrokenCorefile: a new cache whose Corefile does not parse exits with an error; the old
// one keeps serving and keeps the node.
func TestSuccessorWithABrokenCorefile(t *testing.T) {
	r := newHandoverRig(t)
	old := r.startCache()
	broken := filepath.Join(r.dir, "Corefile.broken")
	if err := os.WriteFile(broken, []byte(".:53 {\n    bind "+simnode.LinkLocalIP+"\n    notrack {\n        no_such_option\n    }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p := r.n.Start(r.n.NodeNS, r.bin, "-conf", broken)
	if err := p.Wait(20 * time.Second); err == nil || !p.Exited() {
		t.Fatalf("the broken cache: %v\n%s", err, p.Output())
	}
	if !strings.Contains(p.Output(), "no_such_option") {
		t.Errorf("the error does not name the bad property:\n%s", p.Output())
	}
	if strings.Contains(old.Output(), "handed the node over") || !r.jumps() {
		t.Errorf("the old cache gave the node up:\n%s", old.Output())
	}
	for _, server := range []string{kubeDNS, linkLocal} {
		if err := r.podQuery(server); err != nil {
			t.Errorf("%s: %v", server, err)
		}
	}
}

// steerToTheOwner joins a socket of the test to the reuseport group of each of the cache's addresses and
// attaches a program to the group that sends every packet to the socket that joined first, the owner's:
// a successor started next never sees its own probes. Once the owner's socket is gone the packets go to
// the test's socket, which answers nothing, until the caller closes it.
func (r *rig) steerToTheOwner() []net.PacketConn {
	r.t.Helper()
	var socks []net.PacketConn
	for _, addr := range []string{linkLocal, kubeDNS} {
		err := r.n.Do(r.n.NodeNS, func() error {
			lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
				var serr error
				err := c.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1) })
				if err != nil {
					return err
				}
				return serr
			}}
			pc, err := lc.ListenPacket(context.Background(), "udp", addr)
			if err != nil {
				return err
			}
			socks = append(socks, pc)
			raw, err := pc.(*net.UDPConn).SyscallConn()
			if err != nil {
				return err
			}
			var serr error
			err = raw.Control(func(fd uintptr) {
				// Index 0: the owner's socket, the first in the group.
				ret := unix.SockFilter{Code: unix.BPF_RET | unix.BPF_K, K: 0}
				serr = unix.SetsockoptSockFprog(int(fd), unix.SOL_SOCKET, unix.SO_ATTACH_REUSEPORT_CBPF, &unix.SockFprog{Len: 1, Filter: &ret})
			})
			if err != nil {
				return err
			}
			return serr
		})
		if err != nil {
			r.t.Fatal(err)
		}
	}
	return socks
}

// TestOwnerStoppedBeforeItsSuccessorAnswers: the owner is stopped (SIGTERM: a surge rollout's controller
// deleting the old Pod that reports not ready while its successor is queued, an eviction) before its
// successor answers. The owner hands the node to the cluster DNS; the successor, whose probes the divert
// would answer forever, takes the free lock within HandoffPoll, owns the node as any owner does and takes
// it back once it answers. Not one lookup of the load is lost on the way.
func TestOwnerStoppedBeforeItsSuccessorAnswers(t *testing.T) {
	r := newHandoverRig(t)
	old := r.startCache()
	steer := r.steerToTheOwner()
	next := r.n.Start(r.n.NodeNS, r.bin, "-conf", r.conf)
	r.waitLog(next, "another instance owns this node", 1, 20*time.Second)
	stopLoad := r.startLoad()
	r.stop(old)
	if !strings.Contains(old.Output(), "handed the node to the cluster DNS") {
		t.Fatalf("the owner did not hand the node to the cluster DNS:\n%s", old.Output())
	}
	// The owner's sockets are gone; the test's stop taking the successor's packets.
	for _, s := range steer {
		s.Close()
	}
	r.cache = next
	r.waitFor("the successor's rules in place", 20*time.Second, r.jumps)
	r.waitLog(next, "stopped before this server answered: took the node over", 1, time.Second)
	r.checkNoLookupLost(stopLoad())
	r.checkServedUntracked()
	if strings.Contains(next.Output(), "answered, but not by this server") {
		t.Logf("the successor's probes met the cluster DNS on the way (expected before it owned the node):\n%s", next.Output())
	}
}

// TestSuccessorThatNeverAnswersDoesNotTakeTheNode: the successor's probes never reach it (a test socket
// in the listeners' reuseport group steers every packet to the owner's socket), so it never says it is
// ready, and the owner keeps the node. A third instance is refused meanwhile.
func TestSuccessorThatNeverAnswersDoesNotTakeTheNode(t *testing.T) {
	r := newHandoverRig(t)
	old := r.startCache()
	for _, steer := range r.steerToTheOwner() {
		defer steer.Close()
	}
	next := r.n.Start(r.n.NodeNS, r.bin, "-conf", r.conf)
	r.waitLog(next, "another instance owns this node", 1, 20*time.Second)
	third := r.n.Start(r.n.NodeNS, r.bin, "-conf", r.conf)
	if err := third.Wait(20 * time.Second); err == nil || !strings.Contains(third.Output(), "already waiting to take this node over") {
		t.Errorf("a third instance: %v\n%s", err, third.Output())
	}
	// Ten seconds of probes that never reach the successor: with a backoff of at most 500 ms between
	// them, twenty rounds.
	time.Sleep(10 * time.Second)
	if strings.Contains(next.Output(), "this server answers on") || strings.Contains(old.Output(), "handed the node over") {
		t.Fatalf("a successor that never answered took the node:\nowner:\n%s\nsuccessor:\n%s", old.Output(), next.Output())
	}
	if !r.jumps() {
		t.Error("the owner's rules are gone")
	}
	// The successor stops: the owner keeps the node, untouched.
	r.stop(next)
	if !r.jumps() || !has(r.linkAddrs(), simnode.KubeDNSClusterIP) {
		t.Errorf("the successor's exit touched the node: jumps %v, link %v", r.jumps(), r.linkAddrs())
	}
	if old.Exited() {
		t.Fatalf("the owner exited: %v", old.Wait(0))
	}
}

// TestGuardFailsOpenForLinkLocalClientsInIPTablesMode: on an iptables-mode node (the kube-dns-upstream
// ClusterIP is not an address of the node), Pods that ask the link-local address keep resolving after the
// cache is SIGKILLed: the guard diverts the address through kube-proxy's chain of kube-dns-upstream.
func TestGuardFailsOpenForLinkLocalClientsInIPTablesMode(t *testing.T) {
	r := newRig(t, "nft")
	r.startCache()
	r.startGuard()
	samples := r.killCacheWhileQuerying(linkLocal)
	span, failed := failureSpan(samples)
	if !recoveredAfterFailure(samples) {
		t.Fatalf("lookups to the link-local address did not recover (%d of %d failed)\nguard:\n%s", failed, len(samples), r.guard.Output())
	}
	t.Logf("link-local address, iptables mode: %d lookups failed over %v after SIGKILL", failed, span.Round(time.Millisecond))
	// Pods that ask the ClusterIP resolve too, and the restarted cache takes both back.
	if err := r.podQuery(kubeDNS); err != nil {
		t.Errorf("kube-dns ClusterIP while failed open: %v", err)
	}
	r.startCache()
	r.waitFor("guard watches again", 10*time.Second, func() bool {
		v, err := r.scrape(guardMetrics, "coredns_nodecache_guard_state", "")
		return err == nil && v == 0
	})
	r.checkServedUntracked()
}

// TestCleanupMode: `node-cache -cleanup` refuses to run while a cache owns the node, and after the cache
// handed the node over (an uninstall) it leaves nothing behind.
func TestCleanupMode(t *testing.T) {
	r := newHandoverRig(t)
	cache := r.startCache()
	args := []string{"-cleanup", "-lockfile", filepath.Join(r.dir, "nodelocaldns.lock"), "-guard.backend", r.backend}
	if out, err := r.n.In(context.Background(), r.n.NodeNS, r.bin, args...); err == nil || !strings.Contains(out, "another instance owns this node") {
		t.Fatalf("-cleanup while the cache runs: %v\n%s", err, out)
	}
	r.stop(cache)
	if _, err := r.ipt("-t", "nat", "-S", "NODELOCALDNS-GUARD"); err != nil || r.linkAddrs() == nil {
		t.Fatalf("the cache did not hand the node over: %v, link %v", err, r.linkAddrs())
	}
	out, err := r.n.In(context.Background(), r.n.NodeNS, r.bin, args...)
	if err != nil {
		t.Fatalf("-cleanup: %v\n%s", err, out)
	}
	if _, err := r.ipt("-t", "nat", "-S", "NODELOCALDNS-GUARD"); err == nil {
		t.Error("the divert is left")
	}
	if r.anyJump() || r.chainRules("raw", "NODELOCALDNS") != -1 || r.chainRules("filter", "NODELOCALDNS") != -1 {
		t.Error("rules left behind")
	}
	if r.linkAddrs() != nil {
		t.Errorf("link left behind with %v", r.linkAddrs())
	}
	if err := r.podQuery(kubeDNS); err != nil {
		t.Errorf("Pods do not resolve through kube-proxy after the clean-up: %v", err)
	}
}

// TestGuardWaitsForTheGuardItReplaces: with -guard.wait a second guard (a surge Pod's) waits while the
// first runs, and takes over when it exits.
func TestGuardWaitsForTheGuardItReplaces(t *testing.T) {
	r := newRig(t, "nft")
	r.startCache()
	first := r.startGuard()
	second := r.n.Start(r.n.NodeNS, r.bin, "-guard", "-guard.wait", "-localip", strings.Join(r.listen, ","),
		"-guard.serviceips", simnode.KubeDNSClusterIP, "-guard.upstreamips", simnode.UpstreamClusterIP,
		"-guard.backend", r.backend, "-guard.lockpath", filepath.Join(r.dir, "guard.lock"))
	r.waitLog(second, "waiting for the guard that runs on this node to exit", 1, 10*time.Second)
	r.stop(first)
	r.waitLog(second, "nodelocal guard: watching", 1, 10*time.Second)
}

// TestRestartFigures measures the lookups a restart with a 3 s gap loses, with the hand-over to the
// cluster DNS (node-cache's default) and without it (notrack's teardown at exit, as before the hand-over
// existed), for the README. It runs only with FAULTS_RESTART_FIGURES=1:
//
//	FAULTS_RESTART_FIGURES=1 NODELOCALDNS_REQUIRE_PRIVILEGED=1 go test -v -run TestRestartFigures ./test/faults/
func TestRestartFigures(t *testing.T) {
	if os.Getenv("FAULTS_RESTART_FIGURES") != "1" {
		t.Skip("measures for the README; set FAULTS_RESTART_FIGURES=1")
	}
	for _, handover := range []bool{false, true} {
		t.Run(map[bool]string{false: "teardown", true: "handover"}[handover], func(t *testing.T) {
			r := newHandoverRig(t)
			r.handover = handover
			r.writeCorefile(r.corefile(53))
			old := r.startCache()
			stopLoad := r.startLoad()
			r.stop(old)
			time.Sleep(3 * time.Second)
			r.startCache()
			results := stopLoad()
			for _, server := range []string{kubeDNS, linkLocal} {
				t.Logf("handover %v, %s: %v", handover, server, results[server])
			}
			if handover {
				r.checkNoLookupLost(results)
			}
		})
	}
}
