package nodelocal

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/nodelocaldns/nodelocaldns/nodelocal/link"
	"github.com/nodelocaldns/nodelocaldns/nodelocal/rules"
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
	rules   *rules.Manager
	// installed holds the families where the rule was put in place; uncertain those where putting it in
	// place failed, yet may have taken effect: an iptables-restore killed because its context ended can
	// have committed just before. Removal looks in both; Acquire still adds where the rule is uncertain.
	installed map[rules.Family]bool
	uncertain map[rules.Family]bool
	// nft is set with the nftables backend; nftAddrs are the addresses its table exempts answers from,
	// nil while there is no table.
	nft      *rules.NFTablesManager
	nftAddrs []netip.Addr
}

// NewProbeExemption returns a ProbeExemption whose iptables commands wait up to lockWait for the xtables
// lock (rules.DefaultLockWait when zero). It changes nothing yet.
func NewProbeExemption(lockWait time.Duration) *ProbeExemption {
	return &ProbeExemption{lockWait: lockWait, installed: map[rules.Family]bool{}, uncertain: map[rules.Family]bool{}}
}

// Acquire puts the rule in place for the families of addrs, with the rules backend backend ("auto",
// "legacy", "nft" or "nftables", as in Config; with auto on a node without kube-proxy rules, the fallback,
// since nothing DNATs the probes there anyway). Every Acquire, failed or not, must be followed by one
// Release. Errors are of KindIPTables or KindIPTablesLock.
func (p *ProbeExemption) Acquire(ctx context.Context, backend string, addrs []netip.Addr) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.users++
	if p.rules == nil || (p.backend != backend && len(p.installed) == 0 && len(p.uncertain) == 0 && p.nftAddrs == nil) {
		mode, err := rules.ParseMode(backend)
		if err != nil {
			return configError("select rules backend for the probe exemption", err)
		}
		b, err := rules.Select(ctx, mode)
		if none, ok := errors.AsType[*rules.NoKubeProxyRulesError](err); ok {
			b, err = none.Backend, nil
		}
		if err != nil {
			return rulesError("select rules backend for the probe exemption", err)
		}
		p.rules = rules.NewManager(b, rules.ManagerOptions{LockWait: p.lockWait})
		p.backend = backend
		p.nft = nil
		if b.Mode == rules.NFTables {
			p.nft = rules.NewNFTablesManager()
		}
	}
	if p.nft != nil {
		all := append(slices.Clone(p.nftAddrs), addrs...)
		for i := range all {
			all[i] = all[i].Unmap()
		}
		slices.SortFunc(all, netip.Addr.Compare)
		all = slices.Compact(all)
		if p.nftAddrs != nil && slices.Equal(all, p.nftAddrs) {
			return nil
		}
		if err := p.nft.AddProbeExemption(ctx, ProbeMark, all); err != nil {
			return rulesError("add the probe exemption (table inet "+rules.NFTablesProbeTable+")", err)
		}
		p.nftAddrs = all
		return nil
	}
	var errs []error
	for _, fam := range familiesOf(addrs) {
		if p.installed[fam] {
			continue
		}
		if err := p.rules.AddProbeExemption(ctx, fam, ProbeMark); err != nil {
			errs = append(errs, rulesError(fmt.Sprintf("add the %s probe exemption", fam), err))
			p.uncertain[fam] = true
			continue
		}
		p.installed[fam] = true
		delete(p.uncertain, fam)
	}
	return errors.Join(errs...)
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
	return len(p.installed) > 0 || len(p.uncertain) > 0 || p.nftAddrs != nil
}

// RemoveAll removes the rule whoever uses it: the process is shutting down.
func (p *ProbeExemption) RemoveAll(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.removeLocked(ctx)
}

func (p *ProbeExemption) removeLocked(ctx context.Context) error {
	var errs []error
	if p.nftAddrs != nil {
		if _, err := p.nft.RemoveProbeExemption(ctx); err != nil {
			errs = append(errs, rulesError("remove the probe exemption (table inet "+rules.NFTablesProbeTable+")", err))
		} else {
			p.nftAddrs = nil
		}
	}
	for _, fam := range []rules.Family{rules.IPv4, rules.IPv6} {
		if !p.installed[fam] && !p.uncertain[fam] {
			continue
		}
		// Removing a rule that is not there is not an error.
		if err := p.rules.RemoveProbeExemption(ctx, fam, ProbeMark); err != nil {
			errs = append(errs, rulesError(fmt.Sprintf("remove the %s probe exemption", fam), err))
			continue
		}
		delete(p.installed, fam)
		delete(p.uncertain, fam)
	}
	return errors.Join(errs...)
}

func familiesOf(addrs []netip.Addr) []rules.Family {
	fams := make([]rules.Family, 0, len(addrs))
	for _, a := range addrs {
		fams = append(fams, rules.FamilyOf(a))
	}
	slices.Sort(fams)
	return slices.Compact(fams)
}

// ValidInterfaceName checks a link name the way the kernel does.
func ValidInterfaceName(name string) error { return link.ValidName(name) }

// ParseBackend checks a rules backend name ("auto", "legacy", "nft" or "nftables"; empty is "auto") and returns
// it in its canonical form.
func ParseBackend(s string) (string, error) {
	m, err := rules.ParseMode(s)
	return string(m), err
}
