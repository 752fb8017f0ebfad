//go:build linux

package faults

import (
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/corefile"
	"github.com/nodelocaldns/nodelocaldns/test/simnode"
)

// droppedZone is the part of the cluster domain whose queries the cluster DNS of TestDroppedLookupBudget
// reads, counts and never answers (droppingClusterDNS).
const droppedZone = "dropped.cluster.local"

// TestDroppedLookupBudget (kubernetes-sigs/node-local-dns#12): the cluster DNS drops every query for one
// name, and a Pod looks it up once. The node cache, running the shipped configuration (corefile.Render, as
// the manifests' DaemonSet runs it), sends the query to the cluster DNS exactly max_attempts times (its
// default, 2), counted where the cluster DNS reads them, and then answers the Pod SERVFAIL, with
// coredns_upstreamsvc_attempts_total up by 2 and attempts_exhausted_total by 1. Before the budget, the
// same lookup reached the cluster DNS 3 times (the pipelined copy and forward's two attempts).
func TestDroppedLookupBudget(t *testing.T) {
	const wantSent = 2 // upstreamsvc's default max_attempts
	bin := binary(t)
	n := simnode.New(t)
	r := &rig{t: t, n: n, bin: bin, dir: t.TempDir(), backend: "nft", listen: []string{simnode.LinkLocalIP, simnode.KubeDNSClusterIP}}
	clusterDNS := startDroppingClusterDNS(t, n)
	n.StartExternalResolver(bin)

	conf, err := corefile.Render(corefile.Config{
		LocalIPs:       []netip.Addr{netip.MustParseAddr(simnode.LinkLocalIP)},
		ClusterDNSIPs:  []netip.Addr{netip.MustParseAddr(simnode.KubeDNSClusterIP)},
		NodeUpstreams:  []string{simnode.ExtResolverIP},
		MetricsAddress: cacheMetrics,
		Notrack:        corefile.Notrack{Backend: r.backend, Lock: filepath.Join(r.dir, "nodelocaldns.lock")},
	})
	if err != nil {
		t.Fatal(err)
	}
	r.conf = filepath.Join(r.dir, "Corefile")
	r.writeCorefile(string(conf))
	r.cache = n.StartEnv(n.NodeNS, podEnv(r.dir), bin, "-conf", r.conf)
	r.waitLog(r.cache, "rules in place for", 1, 20*time.Second)

	// A lookup the cluster DNS answers: the pipelined connection is up, and the metrics' series exist.
	err = n.Do(n.PodNS, func() error {
		m, _, err := lookup(kubeDNS, "kubernetes.default.svc.cluster.local", dns.TypeA, clientTimeout)
		if err == nil && m.Rcode != dns.RcodeSuccess {
			err = fmt.Errorf("rcode %s", dns.RcodeToString[m.Rcode])
		}
		return err
	})
	if err != nil {
		t.Fatalf("before the dropped lookup: %v", err)
	}
	series := fmt.Sprintf(`server="dns://%s",zones="cluster.local."`, kubeDNS)
	sentBefore := r.mustScrape(cacheMetrics, "coredns_upstreamsvc_attempts_total", series)
	exhaustedBefore, err := r.scrape(cacheMetrics, "coredns_upstreamsvc_attempts_exhausted_total", series)
	if err != nil {
		exhaustedBefore = 0 // no query has spent its budget yet
	}

	name := "lost." + droppedZone + "."
	var (
		answer *dns.Msg
		took   time.Duration
	)
	err = n.Do(n.PodNS, func() (err error) {
		// One query, waited for as long as a failure bound allows: the count is the point, not the time.
		answer, took, err = lookup(kubeDNS, name, dns.TypeA, time.Minute)
		return err
	})
	if err != nil {
		t.Fatalf("the dropped lookup got no answer: %v", err)
	}
	if answer.Rcode != dns.RcodeServerFailure {
		t.Errorf("the dropped lookup: rcode %s, want SERVFAIL", dns.RcodeToString[answer.Rcode])
	}
	// Every copy was read before the cache answered (it waited for each one's answer); one counted a little
	// later would be a copy sent after the client had its answer.
	time.Sleep(time.Second)
	tcp, udp := clusterDNS.byTCP.Load(), clusterDNS.byUDP.Load()
	if tcp+udp != wantSent || udp != 0 {
		t.Errorf("the cluster DNS received the lookup %d times over TCP and %d over UDP, want %d over TCP (max_attempts)", tcp, udp, wantSent)
	}
	if v := r.mustScrape(cacheMetrics, "coredns_upstreamsvc_attempts_total", series) - sentBefore; v != wantSent {
		t.Errorf("attempts_total grew by %v, want %d", v, wantSent)
	}
	if v := r.mustScrape(cacheMetrics, "coredns_upstreamsvc_attempts_exhausted_total", series) - exhaustedBefore; v != 1 {
		t.Errorf("attempts_exhausted_total grew by %v, want 1", v)
	}
	t.Logf("one lookup the cluster DNS drops: sent to it %d times over TCP, %d over UDP; SERVFAIL to the Pod after %v",
		tcp, udp, took.Round(10*time.Millisecond))
}

// droppingClusterDNS is the cluster-DNS Pod as a DNS server of the test's own on simnode.ClusterDNSPodIP:53:
// it reads the queries for names in droppedZone, counts them by transport and never answers them, and
// answers every other query with an A record of 10.96.0.1 (the node cache's health checks, ". NS", get an
// empty answer and pass).
type droppingClusterDNS struct {
	byTCP, byUDP atomic.Int64
}

func (d *droppingClusterDNS) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	if len(r.Question) == 1 && dns.IsSubDomain(droppedZone+".", r.Question[0].Name) {
		if _, ok := w.RemoteAddr().(*net.TCPAddr); ok {
			d.byTCP.Add(1)
		} else {
			d.byUDP.Add(1)
		}
		return // dropped: on TCP the connection stays open, and the next query on it is read
	}
	m := new(dns.Msg)
	m.SetReply(r)
	if len(r.Question) == 1 && r.Question[0].Qtype == dns.TypeA {
		m.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: r.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 30},
			A: net.IPv4(10, 96, 0, 1)}}
	}
	_ = w.WriteMsg(m)
}

// startDroppingClusterDNS starts a droppingClusterDNS in the cluster DNS's namespace and stops it at the end
// of the test.
func startDroppingClusterDNS(t *testing.T, n *simnode.Node) *droppingClusterDNS {
	t.Helper()
	addr := net.JoinHostPort(simnode.ClusterDNSPodIP, "53")
	var (
		ln net.Listener
		pc net.PacketConn
	)
	err := n.Do(n.DNSNS, func() (err error) {
		if ln, err = net.Listen("tcp", addr); err != nil {
			return err
		}
		pc, err = net.ListenPacket("udp", addr)
		return err
	})
	if err != nil {
		t.Fatalf("the cluster DNS: %v", err)
	}
	d := &droppingClusterDNS{}
	for _, srv := range []*dns.Server{{Listener: ln, Handler: d}, {PacketConn: pc, Handler: d}} {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		go func() { _ = srv.ActivateAndServe() }()
		<-started
		t.Cleanup(func() { _ = srv.Shutdown() })
	}
	return d
}
