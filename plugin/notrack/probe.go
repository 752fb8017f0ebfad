package notrack

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/nodelocaldns/nodelocaldns/nodelocal"
	"github.com/nodelocaldns/nodelocaldns/nodelocal/rules"
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

// probeMark is the firewall mark of probe packets; the probe rule exempts exactly this mark from
// connection tracking. It avoids the bits kube-proxy (0x4000, 0x8000), Calico (0xffff0000), Cilium
// (0x0f00) and the AWS VPC CNI (0x80) test.
const probeMark = 0x53

// probeTimeout bounds one probe; the handler answers at once, so only a server that is not there waits.
const probeTimeout = time.Second

// Backoff between probes of an address that did not answer yet, and how often that is logged.
const (
	probeBackoffMin = 5 * time.Millisecond
	probeBackoffMax = 500 * time.Millisecond
	probeLogEvery   = 10 * time.Second
)

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
	r, _, err := c.ExchangeContext(ctx, m, t.endpoint.String())
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
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, probeMark)
	}); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("set SO_MARK %#x on the probe socket: %w", probeMark, serr)
	}
	return nil
}

// probeAll probes every target until each has answered, with a growing pause between failed probes. It
// returns ctx's error if ctx ends first.
func probeAll(ctx context.Context, targets []probeTarget) error {
	errc := make(chan error, len(targets))
	for _, t := range targets {
		go func() { errc <- probeUntilAnswered(ctx, t) }()
	}
	var first error
	for range targets {
		if err := <-errc; err != nil && first == nil {
			first = err
		}
	}
	return first
}

func probeUntilAnswered(ctx context.Context, t probeTarget) error {
	start := time.Now()
	nextLog := start.Add(probeLogEvery)
	wait := probeBackoffMin
	for {
		err := probeOnce(ctx, t)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if now := time.Now(); now.After(nextLog) {
			log.Warningf("no answer from this server on %s after %v, rules for it wait: %v", t.endpoint, now.Sub(start).Round(time.Second), err)
			nextLog = now.Add(probeLogEvery)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, probeBackoffMax)
	}
}

// probeRules keeps one rule per address family in place while probes run: in the raw table's OUTPUT chain,
// packets with probeMark skip connection tracking, so kube-proxy's nat rules never see them and a probe of
// the kube-dns ClusterIP reaches this server before the NOTRACK rules do that for everyone. The rule is
// appended, not inserted, so that it never takes position 1 from the NOTRACK chain's jump.
//
// With the nftables backend the exemption is a table of its own (rules.NFTablesManager.AddProbeExemption),
// which also exempts the answers of the probed servers: kube-proxy's nftables mode rejects new connections
// to a ClusterIP's other ports, which a tracked answer from the kube-dns ClusterIP to the prober is.
type probeRules struct {
	mu      sync.Mutex
	users   int
	backend *rules.Backend
	// families where this process added the rule.
	installed map[rules.Family]bool
	// nftServers are the servers the nftables probe table exempts answers from; nil when it is not there.
	nftServers []netip.AddrPort
}

var probeRuleSpec = []string{
	"-t", "raw", "OUTPUT",
	"-m", "mark", "--mark", "0x" + strconv.FormatUint(probeMark, 16),
	"-m", "comment", "--comment", rules.DefaultComment + ": probe of the node-local DNS cache",
	"-j", "NOTRACK",
}

// acquire puts the exemption in place for servers, in the backend rec writes its rules with. Every
// acquire, failed or not, is followed by one release.
func (p *probeRules) acquire(ctx context.Context, rec *nodelocal.Reconciler, servers []netip.AddrPort) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.users++
	if p.backend == nil || (len(p.installed) == 0 && p.nftServers == nil) {
		b, err := rec.RulesBackend(ctx)
		if err != nil {
			return fmt.Errorf("select the rules backend for the probe exemption: %w", err)
		}
		p.backend = b
		p.installed = map[rules.Family]bool{}
	}
	if p.backend.Mode == rules.NFTables {
		all := append(slices.Clone(p.nftServers), servers...)
		slices.SortFunc(all, netip.AddrPort.Compare)
		all = slices.Compact(all)
		if p.nftServers != nil && slices.Equal(all, p.nftServers) {
			return nil
		}
		if err := rules.NewNFTablesManager().AddProbeExemption(ctx, probeMark, all); err != nil {
			return fmt.Errorf("add the probe exemption: %w", err)
		}
		p.nftServers = all
		return nil
	}
	var addrs []netip.Addr
	for _, s := range servers {
		addrs = append(addrs, s.Addr())
	}
	var errs []error
	for _, fam := range families(addrs) {
		if p.installed[fam] {
			continue
		}
		present, err := p.check(ctx, fam)
		if err == nil && !present {
			err = p.run(ctx, fam, "-A")
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("add the %s probe rule: %w", fam, err))
			continue
		}
		p.installed[fam] = true
	}
	return errors.Join(errs...)
}

// release removes the rules when the last user is done.
func (p *probeRules) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.users--
	if p.users > 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), linkTeardownTimeout)
	defer cancel()
	if err := p.removeLocked(ctx); err != nil {
		log.Errorf("%v", err)
	}
}

func (p *probeRules) active() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.installed) > 0 || p.nftServers != nil
}

// removeAll removes the rules whoever uses them: the process is shutting down.
func (p *probeRules) removeAll(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.removeLocked(ctx)
}

func (p *probeRules) removeLocked(ctx context.Context) error {
	var errs []error
	if p.nftServers != nil {
		if _, err := rules.NewNFTablesManager().RemoveProbeExemption(ctx); err != nil {
			errs = append(errs, fmt.Errorf("remove the probe exemption: %w", err))
		} else {
			p.nftServers = nil
		}
	}
	for fam := range p.installed {
		// Delete every copy: one left behind by a process that was killed while probing is ours too.
		for range 8 {
			present, err := p.check(ctx, fam)
			if err == nil && present {
				err = p.run(ctx, fam, "-D")
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("remove the %s probe rule: %w", fam, err))
				break
			}
			if !present {
				delete(p.installed, fam)
				break
			}
		}
	}
	return errors.Join(errs...)
}

// check reports whether the rule is in place; iptables -C exits 1 when it is not.
func (p *probeRules) check(ctx context.Context, fam rules.Family) (bool, error) {
	err := p.run(ctx, fam, "-C")
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() == 1 {
		return false, nil
	}
	return err == nil, err
}

func (p *probeRules) run(ctx context.Context, fam rules.Family, op string) error {
	tools, err := p.backend.Tools(fam)
	if err != nil {
		return err
	}
	wait := 2
	if d, ok := ctx.Deadline(); ok {
		wait = max(1, int(time.Until(d).Seconds()))
	}
	args := append([]string{"-w", strconv.Itoa(wait)}, probeRuleSpec[:2]...)
	args = append(append(args, op), probeRuleSpec[2:]...)
	cmd := exec.CommandContext(ctx, tools.IPTables, args...)
	cmd.WaitDelay = time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("%s %s: %w", tools.IPTables, strings.Join(args, " "), ctx.Err())
		}
		return &iptablesError{cmd: tools.IPTables + " " + strings.Join(args, " "), out: strings.TrimSpace(string(out)), err: err}
	}
	return nil
}

type iptablesError struct {
	cmd, out string
	err      error
}

func (e *iptablesError) Error() string { return e.cmd + ": " + e.err.Error() + ": " + e.out }
func (e *iptablesError) Unwrap() error { return e.err }

func families(addrs []netip.Addr) []rules.Family {
	var fams []rules.Family
	for _, a := range addrs {
		fams = append(fams, rules.FamilyOf(a))
	}
	slices.Sort(fams)
	return slices.Compact(fams)
}
