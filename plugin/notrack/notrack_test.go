//go:build linux

package notrack

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/coredns/coredns/plugin/pkg/dnstest"
	"github.com/coredns/coredns/plugin/test"
	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/privtest"
)

// next answers every query it gets with NXDOMAIN, as a cache in front of kube-dns would for a probe name.
var next = test.HandlerFunc(func(_ context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
	m := new(dns.Msg)
	m.SetRcode(r, dns.RcodeNameError)
	w.WriteMsg(m)
	return dns.RcodeNameError, nil
})

func TestServeDNSAnswersProbes(t *testing.T) {
	h := &Notrack{Next: next, block: &block{}}
	for _, zone := range []string{".", "cluster.local.", "10.in-addr.arpa."} {
		name := probeName(zone)
		if !strings.HasSuffix(name, zone) || !strings.HasPrefix(name, "nodelocaldns-probe-") {
			t.Errorf("probe name %q for zone %q", name, zone)
		}
		m := new(dns.Msg)
		m.SetQuestion(name, dns.TypeTXT)
		rec := dnstest.NewRecorder(&test.ResponseWriter{})
		if _, err := h.ServeDNS(context.Background(), rec, m); err != nil {
			t.Fatal(err)
		}
		if !isProofFor(rec.Msg, name) {
			t.Errorf("zone %q: answer %v is not the proof", zone, rec.Msg)
		}
		if isProofFor(rec.Msg, "other."+name) {
			t.Errorf("zone %q: the answer proves a probe of another name", zone)
		}
	}
}

func TestServeDNSPassesEverythingElseOn(t *testing.T) {
	h := &Notrack{Next: next, block: &block{}}
	for _, q := range []dns.Question{
		{Name: "kubernetes.default.svc.cluster.local.", Qtype: dns.TypeA, Qclass: dns.ClassINET},
		{Name: probeName("cluster.local."), Qtype: dns.TypeA, Qclass: dns.ClassINET},
		{Name: probeName("cluster.local."), Qtype: dns.TypeTXT, Qclass: dns.ClassCHAOS},
		// Another process's probe: same shape, different random label.
		{Name: "nodelocaldns-probe-0000000000000000.cluster.local.", Qtype: dns.TypeTXT, Qclass: dns.ClassINET},
	} {
		m := new(dns.Msg)
		m.Question = []dns.Question{q}
		rec := dnstest.NewRecorder(&test.ResponseWriter{})
		code, err := h.ServeDNS(context.Background(), rec, m)
		if err != nil || code != dns.RcodeNameError || rec.Msg.Rcode != dns.RcodeNameError {
			t.Errorf("%v: code %d, err %v, answer %v; want the next plugin's NXDOMAIN", q, code, err, rec.Msg)
		}
	}
}

func TestIsProofFor(t *testing.T) {
	name := probeName("cluster.local.")
	q := new(dns.Msg)
	q.SetQuestion(name, dns.TypeTXT)
	good := probeAnswer(q)
	if !isProofFor(good, name) {
		t.Fatal("the handler's answer is not a proof")
	}
	wrongData := good.Copy()
	wrongData.Answer[0].(*dns.TXT).Txt = []string{"0123456789abcdef"}
	servfail := good.Copy()
	servfail.Rcode = dns.RcodeServerFailure
	empty := good.Copy()
	empty.Answer = nil
	a := good.Copy()
	a.Answer = []dns.RR{test.A(name + " 0 IN A 192.0.2.1")}
	for what, m := range map[string]*dns.Msg{"wrong data": wrongData, "SERVFAIL": servfail, "no answer": empty, "an A record": a, "nothing": nil} {
		if isProofFor(m, name) {
			t.Errorf("%s counts as proof", what)
		}
	}
}

func TestReadyBeforeStart(t *testing.T) {
	if (&Notrack{block: &block{}}).Ready() {
		t.Error("ready with nothing started")
	}
}

// TestProbeOnce probes servers on loopback: one with the notrack handler, one that answers NXDOMAIN as
// kube-dns would through a DNAT, and none. Setting the probe mark needs CAP_NET_ADMIN.
func TestProbeOnce(t *testing.T) {
	privtest.RequirePrivileged(t)
	ours := dnstest.NewMultipleServer(func(w dns.ResponseWriter, r *dns.Msg) {
		(&Notrack{Next: next, block: &block{}}).ServeDNS(context.Background(), w, r)
	})
	defer ours.Close()
	theirs := dnstest.NewMultipleServer(func(w dns.ResponseWriter, r *dns.Msg) { next.ServeDNS(context.Background(), w, r) })
	defer theirs.Close()

	target := func(addr string) probeTarget {
		ap := mustAddrPort(t, addr)
		return probeTarget{endpoint{ap.Addr(), ap.Port()}, probeName("cluster.local.")}
	}
	if err := probeOnce(context.Background(), target(ours.Addr)); err != nil {
		t.Errorf("probe of our handler: %v", err)
	}
	if err := probeOnce(context.Background(), target(theirs.Addr)); !errors.Is(err, errNotUs) {
		t.Errorf("probe of another server: %v, want errNotUs", err)
	}
	addr := theirs.Addr
	theirs.Close()
	if err := probeOnce(context.Background(), target(addr)); err == nil {
		t.Error("probe of a closed port succeeded")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := probeAll(ctx, []probeTarget{target(addr)}, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("probeAll with an ended context: %v", err)
	}
}

func mustAddrPort(t *testing.T, s string) netip.AddrPort {
	t.Helper()
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		t.Fatal(err)
	}
	return ap
}

func TestServeDNSWithoutNext(t *testing.T) {
	m := new(dns.Msg)
	m.SetQuestion("example.org.", dns.TypeA)
	code, err := (&Notrack{block: &block{}}).ServeDNS(context.Background(), dnstest.NewRecorder(&test.ResponseWriter{}), m)
	if code != dns.RcodeServerFailure || err == nil {
		t.Errorf("code %d, err %v; want SERVFAIL and an error", code, err)
	}
}
