//go:build linux

package nodelocal

import (
	"context"
	"net/netip"
	"sync"
	"time"

	"github.com/nodelocaldns/nodelocaldns/nodelocal/internal/link"
	"github.com/nodelocaldns/nodelocaldns/nodelocal/internal/rules"
)

// ProbeMark is the firewall mark of a cache's probes of its own addresses; the probe exemption exempts
// exactly this mark from connection tracking. It avoids the bits kube-proxy (0x4000, 0x8000), Calico
// (0xffff0000), Cilium (0x0f00) and the AWS VPC CNI (0x80) test.
const ProbeMark = 0x53

// ProbeExemption keeps rules.ProbeExemption(ProbeMark) in place while a cache probes its own addresses:
// kube-proxy DNATs the host's traffic for the kube-dns ClusterIP as it does Pods', so without it a probe
// of that address, sent before the NOTRACK rules are in place (or while the fail-open guard keeps them
// out), would reach kube-dns instead. It is reference counted: the rule goes when the last user is done.
// It is safe for concurrent use.
//
// With the nftables backend the exemption is a table of its own (rules.NFTablesManager.AddProbeExemption),
// which also exempts UDP from the probed addresses: kube-proxy's nftables mode rejects new connections to
// a ClusterIP's other ports, and a tracked answer from the kube-dns ClusterIP to the prober, which has that
// address too, is one.
type ProbeExemption struct {
	lockWait time.Duration

	mu      sync.Mutex
	users   int
	backend string
	fw      *firewallChoice
	// active is set while the exemption is, or may be, in place: an add that failed may have taken effect
	// (an iptables-restore killed because its context ended can have committed just before), so removal
	// looks wherever an add was tried.
	active bool
}

// NewProbeExemption returns a ProbeExemption whose iptables commands wait up to lockWait for the xtables
// lock (rules.DefaultLockWait when zero). It changes nothing yet.
func NewProbeExemption(lockWait time.Duration) *ProbeExemption {
	return &ProbeExemption{lockWait: lockWait}
}

// Acquire puts the rule in place for the families of addrs, with the rules backend backend ("auto",
// "legacy", "nft" or "nftables", as in Config, chosen as the Reconciler chooses it). On a node without
// kube-proxy rules, where the choice still waits for them, it adds nothing: nothing DNATs the probes
// there. Every Acquire, failed or not, must be followed by one Release. Errors are of KindIPTables or
// KindIPTablesLock.
func (p *ProbeExemption) Acquire(ctx context.Context, backend string, addrs []netip.Addr) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.users++
	if p.fw == nil || (p.backend != backend && !p.active) {
		fw, err := newFirewallChoice(backend, DefaultBackendWait, p.lockWait, nil, "nodelocal probe exemption")
		if err != nil {
			return configError("select rules backend for the probe exemption", err)
		}
		p.fw, p.backend = fw, backend
	}
	fw, err := p.fw.get(ctx)
	if backendPending(err) {
		return nil
	}
	if err != nil {
		return err
	}
	p.active = true
	return fw.AddProbeExemption(ctx, ProbeMark, addrs)
}

// Release ends a use; the last one removes the rule, within timeout. A failure is returned, and the next
// Acquire or RemoveAll tries again.
func (p *ProbeExemption) Release(timeout time.Duration) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.users--
	if p.users > 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return p.removeLocked(ctx)
}

// Active reports whether the rule is, or may be, in place in some family.
func (p *ProbeExemption) Active() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.active
}

// RemoveAll removes the rule whoever uses it: the process is shutting down.
func (p *ProbeExemption) RemoveAll(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.removeLocked(ctx)
}

func (p *ProbeExemption) removeLocked(ctx context.Context) error {
	if !p.active {
		return nil
	}
	if err := p.fw.current().RemoveProbeExemption(ctx, ProbeMark); err != nil {
		return err
	}
	p.active = false
	return nil
}

// ValidInterfaceName checks a link name the way the kernel does.
func ValidInterfaceName(name string) error { return link.ValidName(name) }

// ParseBackend checks a rules backend name ("auto", "legacy", "nft" or "nftables"; empty is "auto") and returns
// it in its canonical form.
func ParseBackend(s string) (string, error) {
	m, err := rules.ParseMode(s)
	return string(m), err
}
