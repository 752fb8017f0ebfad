//go:build linux

package nodelocal

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/nodelocaldns/nodelocaldns/nodelocal/internal/nodelock"
	"github.com/nodelocaldns/nodelocaldns/nodelocal/internal/rules"
)

// A node changes hands in one of two ways.
//
// With a successor (a rolling update that surges): the new cache queues at the node lock (Queue) while
// the old one serves, binds the same addresses beside it (SO_REUSEPORT), and says it is Ready once it
// answers there. The owner sees that (Reconciler.SuccessorReady) and lets go (Reconciler.HandOff), leaving
// link, addresses and rules as they are; the successor's Take returns a Reconciler that owns the node,
// whose first sync finds everything in place.
//
// Without one (a rolling update that replaces, or any restart): the cache hands the node to the cluster
// DNS instead of tearing it down (Reconciler.HandOver): its jumps go, so kube-proxy serves the kube-dns
// ClusterIP again, and the other addresses are diverted to the kube-dns-upstream Service, as the fail-open
// guard does. The next cache takes the node back as it does from the guard, once it answers.

// HandoffPoll is how often a successor tries the node lock while it waits for the owner to let go.
const HandoffPoll = 20 * time.Millisecond

// Successor is a cache waiting to take a node over from the cache that owns it.
type Successor struct {
	cfg Config
	q   *nodelock.Successor
}

// Queue checks cfg and puts the caller in line to succeed the node's owner, without waiting and without
// changing anything on the node. It fails with KindNodeLock when another successor is in line, or when
// nobody owns the node (nodelock.ErrNotHeld: call New instead).
func Queue(cfg Config) (*Successor, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, configError("check configuration", err)
	}
	q, err := nodelock.Queue(cfg.LockPath)
	if err != nil {
		return nil, &Error{Kind: KindNodeLock, Op: "queue at the node lock", Err: err}
	}
	return &Successor{cfg: cfg, q: q}, nil
}

// Owner names the owner the successor waits for, as the owner wrote it into the lock file.
func (s *Successor) Owner() string { return s.q.Owner }

// Ready tells the owner that this cache answers on the node's addresses: the owner lets go.
func (s *Successor) Ready() error {
	if err := s.q.Ready(); err != nil {
		return &Error{Kind: KindNodeLock, Op: "tell the owner that its successor answers", Err: err}
	}
	return nil
}

// Take waits until the owner lets go of the node, or dies, and returns a Reconciler that owns it. It
// changes nothing on the node: the first Acquire finds what the owner left in place.
func (s *Successor) Take(ctx context.Context) (*Reconciler, error) {
	lock, err := s.q.Take(ctx, HandoffPoll)
	if err != nil {
		return nil, &Error{Kind: KindNodeLock, Op: "take the node over", Err: err}
	}
	return s.own(lock)
}

// TryTake is Take without the wait: it returns nil while the owner holds the node. A successor that does
// not answer yet calls it every HandoffPoll, so that an owner that stops first (and hands the node to the
// cluster DNS, or tears it down) leaves it to this successor at once instead of to nobody: the successor
// then starts as any owner does, its rules following once it answers.
func (s *Successor) TryTake() (*Reconciler, error) {
	lock, err := s.q.TryTake()
	if err != nil {
		return nil, &Error{Kind: KindNodeLock, Op: "take the node over", Err: err}
	}
	if lock == nil {
		return nil, nil
	}
	return s.own(lock)
}

func (s *Successor) own(lock *nodelock.Lock) (*Reconciler, error) {
	r, err := newReconciler(s.cfg, lock)
	if err != nil {
		return nil, errors.Join(err, lock.Release())
	}
	return r, nil
}

// OwnerEndpoints returns the addresses and DNS ports the owner's rules cover (their UDP endpoints), read
// from the node; none while the owner has no rules. A successor must serve all of them, or it would take
// over a node it cannot serve: a stray instance on another port is not a successor.
func (s *Successor) OwnerEndpoints(ctx context.Context) ([]netip.AddrPort, error) {
	if s.cfg.NoRules {
		return nil, nil
	}
	choice, err := newFirewallChoice(s.cfg.Backend, s.cfg.BackendWait, s.cfg.LockWait, nil, "nodelocal successor")
	if err != nil {
		return nil, configError("select rules backend", err)
	}
	fw, err := choice.get(ctx)
	if backendPending(err) {
		return nil, nil // no rules of the owner's, nor kube-proxy's, anywhere
	}
	if err != nil {
		return nil, err
	}
	eps, err := fw.CacheEndpoints(ctx)
	if err != nil {
		return nil, err
	}
	var out []netip.AddrPort
	for _, e := range eps {
		if e.Protocol == rules.UDP {
			out = append(out, netip.AddrPortFrom(e.Addr, e.Port))
		}
	}
	return out, nil
}

// Close leaves the line without taking the node over.
func (s *Successor) Close() error { return s.q.Close() }

// AcquireAll acquires a lease for each claim, with its rules (DeferRules is ignored), in one sync: for a
// cache that answers on all of them already and takes over a node that holds them (a successor, or an
// owner taking its node back). Unlike Acquire it keeps the leases when the sync fails, and never tears
// anything down: what is on the node is the previous owner's work, and Run retries. It takes the node
// back from the fail-open guard as EnableRules does.
func (r *Reconciler) AcquireAll(ctx context.Context, claims []Claim) ([]*Lease, error) {
	normalized := make([]Claim, 0, len(claims))
	for _, c := range claims {
		c, err := c.normalize()
		if err != nil {
			return nil, configError("check claim", err)
		}
		normalized = append(normalized, c)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, ErrClosed
	}
	leases := make([]*Lease, 0, len(normalized))
	for _, c := range normalized {
		l := &Lease{r: r, claim: c, rules: true}
		r.leases[l] = struct{}{}
		leases = append(leases, l)
	}
	r.noteLeases()
	return leases, r.syncLocked(ctx, syncLink|syncRules|syncReclaim)
}

// SuccessorReady reports whether a successor waits in line (queued) and whether it answers on the node's
// addresses (ready).
func (r *Reconciler) SuccessorReady() (queued, ready bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false, false, ErrClosed
	}
	if queued, err = r.lock.SuccessorQueued(); err == nil && queued {
		ready, err = r.lock.SuccessorReady()
	}
	if err != nil {
		return false, false, &Error{Kind: KindNodeLock, Op: "look for a successor", Err: err}
	}
	return queued, ready, nil
}

// HandOff lets a successor take the node: it releases every lease and the node lock and leaves the link,
// the addresses and the rules in place. It is Close, named for what it is for.
func (r *Reconciler) HandOff() error { return r.Close() }

// Handover says how a cache hands its node to the cluster DNS.
type Handover struct {
	// ServiceAddresses are those of the cache's addresses that are kube-proxy Service ClusterIPs (the
	// kube-dns ClusterIP): once the jumps are out kube-proxy's DNAT serves them, and RemoveAddresses takes
	// them off the link.
	ServiceAddresses []netip.Addr
	// Upstream holds the kube-dns-upstream ClusterIP, one per family. The cache's other addresses (the
	// link-local one) are diverted to that Service, as GuardConfig.Upstream says.
	Upstream []netip.Addr
}

// HandOver starts handing the node's DNS to the cluster DNS instead of tearing it down. In this order, so
// that no lookup finds nobody: it writes the fail-open guard's divert, which sends the addresses that are
// not Service addresses to the kube-dns-upstream Service (rules.Guard); it narrows the cache's raw chain
// to its answers (rules.NodeCacheSpec.RepliesOnly), so that new queries meet kube-proxy's DNAT and the
// divert while the cache's answers to what it already has still leave untracked; and it forgets the
// tracked flows that would still bring queries to the cache (forgetLocalFlows). The cache then drains its
// sockets and calls CompleteHandOver. The divert is also the word to the next cache (Reconciler.Reclaim,
// Lease.EnableRules) that the node waits for it to answer.
func (r *Reconciler) HandOver(ctx context.Context, h Handover) (diverted []rules.Divert, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, ErrClosed
	}
	if r.cfg.NoRules {
		return nil, configError("hand the node over", errors.New("the rules are someone else's (NoRules)"))
	}
	w := r.wantedLocked()
	if len(w.addrs) == 0 {
		return nil, nil
	}
	gc := GuardConfig{Addresses: w.addrs, ServiceAddresses: unmapAll(h.ServiceAddresses), Upstream: h.Upstream}.withDefaults()
	gc.ServiceAddresses = slices.DeleteFunc(gc.ServiceAddresses, func(a netip.Addr) bool { return !slices.Contains(w.addrs, a) })
	ds, undiverted, err := gc.diverts()
	if err != nil {
		return nil, configError("hand the node over", err)
	}
	for i := range ds {
		ds[i].Port = r.dnsPortLocked(ds[i].From)
	}
	fw, err := r.fw.get(ctx)
	if err != nil {
		return nil, err
	}
	plan, err := writeDivert(ctx, fw, r.nodeAddrs, familiesOf(w.addrs), ds)
	if err != nil {
		return nil, err
	}
	for _, d := range plan.Skipped {
		undiverted = append(undiverted, d.From)
	}
	if len(undiverted) > 0 {
		r.log.Warningf("nodelocal: handing over without a divert for %v: no kube-dns-upstream address of their family, or kube-proxy serves it neither on this node (IPVS) nor in its own rules", undiverted)
	}
	if err := fw.NarrowCache(ctx, w.endpoints); err != nil {
		return plan.Diverts, err
	}
	r.setStatus(func(s *Status) { s.GuardFailedOpen, s.RulesPresent = true, false })
	if _, err := r.forgetFlows(r.dnsEndpointsLocked()); err != nil {
		r.log.Warningf("nodelocal: Pods that send from the same source port again may still reach the cache while it drains: %v", err)
	}
	return plan.Diverts, nil
}

// CompleteHandOver ends a hand-over once the cache's sockets are idle: it takes the cache's jumps out,
// forgets the flows its last answers opened, and takes the Service addresses off the link, so that
// kube-proxy serves them. It returns the addresses removed. Close follows.
func (r *Reconciler) CompleteHandOver(ctx context.Context, h Handover) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, ErrClosed
	}
	w := r.wantedLocked()
	var errs []error
	if !r.cfg.NoRules {
		fw, err := r.fw.get(ctx)
		if err != nil {
			return nil, err
		}
		if err := fw.UnhookCache(ctx, familiesOf(w.addrs)); err != nil {
			errs = append(errs, err)
		}
		if _, err := r.forgetFlows(r.dnsEndpointsLocked()); err != nil {
			errs = append(errs, err)
		}
	}
	var removed []netip.Addr
	if r.link != nil && len(h.ServiceAddresses) > 0 {
		var err error
		removed, err = r.link.RemoveAddresses(ctx, unmapAll(h.ServiceAddresses))
		if err != nil {
			errs = append(errs, linkError("remove "+fmt.Sprint(h.ServiceAddresses)+" from "+r.cfg.Interface, err))
		}
	}
	return removed, errors.Join(errs...)
}

// dnsEndpointsLocked returns every claimed address with its DNS port.
func (r *Reconciler) dnsEndpointsLocked() []netip.AddrPort {
	var out []netip.AddrPort
	for l := range r.leases {
		for _, a := range l.claim.Addresses {
			out = append(out, netip.AddrPortFrom(a, l.claim.DNSPort))
		}
	}
	slices.SortFunc(out, netip.AddrPort.Compare)
	return slices.Compact(out)
}

// dnsPortLocked returns the DNS port a lease claims for a; the default when none does.
func (r *Reconciler) dnsPortLocked(a netip.Addr) uint16 {
	for l := range r.leases {
		if slices.Contains(l.claim.Addresses, a) {
			return l.claim.DNSPort
		}
	}
	return DefaultDNSPort
}
