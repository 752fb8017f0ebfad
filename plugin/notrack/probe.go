//go:build linux

package notrack

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/nodelocaldns/nodelocaldns/nodelocal"
)

// The server is probed with a real query to each of its addresses: a TXT query for a name only this process
// knows, which the notrack handler answers with a value only this process knows. Any other answer, such as
// kube-dns's through kube-proxy's DNAT, does not count.
type probeIdentity struct {
	// prefix starts every probe name: "nodelocaldns-probe-<random>.".
	prefix string
	// proof is the TXT data of the answer.
	proof string
}

var probeID = newProbeIdentity()

func newProbeIdentity() probeIdentity {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("notrack: reading random bytes: %v", err))
	}
	return probeIdentity{prefix: "nodelocaldns-probe-" + hex.EncodeToString(b[:8]) + ".", proof: hex.EncodeToString(b[8:])}
}

// probeName returns the probe name in zone, which a notrack handler of a block for zone answers.
func probeName(zone string) string {
	zone = dns.Fqdn(zone)
	if zone == "." {
		return probeID.prefix
	}
	return probeID.prefix + zone
}

// isProbe reports whether q is one of this process's probes.
func isProbe(q dns.Question) bool {
	return q.Qtype == dns.TypeTXT && q.Qclass == dns.ClassINET && strings.HasPrefix(q.Name, probeID.prefix)
}

// probeAnswer builds the handler's answer to a probe.
func probeAnswer(r *dns.Msg) *dns.Msg {
	m := new(dns.Msg)
	m.SetReply(r)
	m.Authoritative = true
	q := r.Question[0]
	m.Answer = []dns.RR{&dns.TXT{
		Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeTXT, Class: dns.ClassINET, Ttl: 0},
		Txt: []string{probeID.proof},
	}}
	return m
}

// isProofFor reports whether r is this process's answer to the probe for name.
func isProofFor(r *dns.Msg, name string) bool {
	if r == nil || r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
		return false
	}
	txt, ok := r.Answer[0].(*dns.TXT)
	return ok && txt.Hdr.Name == name && len(txt.Txt) == 1 && txt.Txt[0] == probeID.proof
}

// probeExemptionTimeout bounds removing the probe exemption once the probes are done.
const probeExemptionTimeout = time.Second

// probeTimeout bounds one probe; the handler answers at once, so only a server that is not there waits.
const probeTimeout = time.Second

type probeTarget struct {
	endpoint
	name string
}

// errNotUs is an answer from someone else: kube-dns through a DNAT, say.
var errNotUs = errors.New("answered, but not by this server")

// probeOnce sends one probe to t over UDP, with the probe mark.
func probeOnce(ctx context.Context, t probeTarget) error {
	m := new(dns.Msg)
	m.SetQuestion(t.name, dns.TypeTXT)
	m.RecursionDesired = false
	c := &dns.Client{
		Net:     "udp",
		Timeout: probeTimeout,
		Dialer:  &net.Dialer{Timeout: probeTimeout, Control: markSocket},
	}
	r, _, err := c.ExchangeContext(ctx, m, t.String())
	if err != nil {
		return err
	}
	if !isProofFor(r, t.name) {
		return fmt.Errorf("%w (rcode %s, %d answers)", errNotUs, dns.RcodeToString[r.Rcode], len(r.Answer))
	}
	return nil
}

func markSocket(_, _ string, c syscall.RawConn) error {
	var serr error
	if err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, nodelocal.ProbeMark)
	}); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("set SO_MARK %#x on the probe socket: %w", nodelocal.ProbeMark, serr)
	}
	return nil
}

// probeAll probes every target until each has answered (nodelocal.AwaitAnswers). It returns ctx's error
// if ctx ends first. With keptOut, an address the fail-open guard keeps off the link counts as answered
// (unlessKeptOut).
func probeAll(ctx context.Context, targets []probeTarget, keptOut *nodelocal.Reconciler) error {
	probe := proberOf(targets)
	if keptOut != nil {
		probe = unlessKeptOut(keptOut, probe)
	}
	return nodelocal.AwaitAnswers(ctx, targetEndpoints(targets), probe, log)
}

// unlessKeptOut returns probe, except that an address the fail-open guard keeps off the link counts as
// answered without a probe. While the node is failed open the guard takes the Service addresses (the
// kube-dns ClusterIP) out again whenever a process puts them back, so a probe of one would race with the
// guard; the listeners on them are this process's, opened with those that answered, and EnableRules puts
// the addresses back as it takes the node back. reclaimIfAnswering probes only the held addresses too.
func unlessKeptOut(rec *nodelocal.Reconciler, probe nodelocal.ProbeFunc) nodelocal.ProbeFunc {
	return func(ctx context.Context, ep netip.AddrPort) error {
		if st := rec.Status(); st.GuardFailedOpen && !slices.Contains(st.Addresses, ep.Addr().Unmap()) {
			return nil
		}
		return probe(ctx, ep)
	}
}

// proberOf returns a probe of this server at the endpoint of each target, with the target's name.
func proberOf(targets []probeTarget) nodelocal.ProbeFunc {
	names := make(map[netip.AddrPort]string, len(targets))
	for _, t := range targets {
		names[netip.AddrPortFrom(t.addr.Unmap(), t.port)] = t.name
	}
	return func(ctx context.Context, ep netip.AddrPort) error {
		name, ok := names[netip.AddrPortFrom(ep.Addr().Unmap(), ep.Port())]
		if !ok {
			return fmt.Errorf("no probe of this server's for %s", ep)
		}
		return probeOnce(ctx, probeTarget{endpoint{ep.Addr(), ep.Port()}, name})
	}
}

func targetEndpoints(targets []probeTarget) []netip.AddrPort {
	eps := make([]netip.AddrPort, len(targets))
	for i, t := range targets {
		eps[i] = netip.AddrPortFrom(t.addr, t.port)
	}
	return eps
}

// releaseProbeExemption ends one use of the probe exemption (every Acquire, failed or not, has one).
func (n *node) releaseProbeExemption() {
	if err := n.probe.Release(probeExemptionTimeout); err != nil {
		countSetupError(err)
		log.Errorf("%v", err)
	}
}
