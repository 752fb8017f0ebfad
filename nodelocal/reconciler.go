//go:build linux

package nodelocal

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/nodelocaldns/nodelocaldns/nodelocal/internal/link"
	"github.com/nodelocaldns/nodelocaldns/nodelocal/internal/nodelock"
)

// Reconciler owns a node's link, addresses and rules for a node-local DNS cache. It serves the union of
// the claims of its leases, and it is safe for concurrent use: syncs are serialised.
type Reconciler struct {
	cfg  Config
	log  Logger
	lock *nodelock.Lock
	link linkOps // nil with NoInterface

	mu     sync.Mutex // serialises syncs; guards the fields below
	closed bool
	leases map[*Lease]struct{}
	// fw chooses the rules backend on the first rules sync and keeps it.
	fw *firewallChoice
	// nodeAddrs lists the node's addresses and forgetFlows its tracked flows of the cache: netlink, or a
	// test's fake.
	nodeAddrs      func(ctx context.Context) ([]netip.Addr, error)
	forgetFlows    func(endpoints []netip.AddrPort) (uint, error)
	fallbackLogged bool
	foreignLogged  string
	guardLogged    bool
	// unchanged is what the last repair that found the rules in place, with nothing changing meanwhile,
	// left behind; see syncLocked.
	unchanged rulesUnchanged

	statusMu sync.Mutex
	status   Status
}

// Status is a snapshot of what a Reconciler last found and did, for metrics and readiness.
type Status struct {
	// Interface is the link's name; LinkKind its kind ("dummy", or "bridge" where the kernel has no dummy
	// type); LinkOwned whether the link was created by this package (so that Teardown removes it).
	Interface string
	LinkKind  string
	LinkOwned bool
	// Addresses are the claimed addresses the link held after the last link sync.
	Addresses []netip.Addr
	// ForeignAddresses are addresses on the link that no claim asked for and we did not add. They stay.
	ForeignAddresses []netip.Prefix
	// RulesPresent is true when the last rules sync put every rule of every rule-enabled lease in place.
	RulesPresent bool
	// RuleAddresses are the addresses covered by rules after the last rules sync; Rules counts the rules,
	// jumps included, of both families.
	RuleAddresses []netip.Addr
	Rules         int
	// Ahead are the rules of other components the last rules sync found ahead of the cache's jumps (in the
	// hook chains of the raw and filter tables, iptables only): until the sync put the jumps back in front of
	// them, the traffic they matched missed the cache's rules. Empty when the jumps were first.
	Ahead []AheadRule
	// RuleSyncs counts the rules syncs so far; Ahead is what the one numbered RuleSyncs found.
	RuleSyncs int
	// Backend is the iptables mode in use ("legacy" or "nft") once rules were synced, and BackendReason
	// why it was chosen.
	Backend       string
	BackendReason string
	// Leases is the number of leases held.
	Leases int
	// LastAttempt is when the last sync ended; LastSync when the last one ended without error.
	LastAttempt time.Time
	LastSync    time.Time
	// LastError is the error of the last sync, nil when it succeeded.
	LastError error
	// GuardFailedOpen is true when the last rules sync found the fail-open guard's divert in place and
	// kept the jumps out (see Reclaim).
	GuardFailedOpen bool
}

// New checks cfg, takes the node lock and returns a Reconciler that manages nothing yet: nothing on the
// node changes before the first Acquire. A second Reconciler on the same node (with the same lock file)
// fails with an error of KindNodeLock that names the first one's process.
func New(cfg Config) (*Reconciler, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, configError("check configuration", err)
	}
	lock, err := nodelock.Acquire(cfg.LockPath)
	if err != nil {
		return nil, &Error{Kind: KindNodeLock, Op: "take the node lock", Err: err}
	}
	r, err := newReconciler(cfg, lock)
	if err != nil {
		return nil, errors.Join(err, lock.Release())
	}
	return r, nil
}

// newReconciler returns a Reconciler for cfg (with defaults, checked) that owns the node through lock.
func newReconciler(cfg Config, lock *nodelock.Lock) (*Reconciler, error) {
	fw, err := newFirewallChoice(cfg.Backend, cfg.BackendWait, cfg.LockWait, cfg.Logger, "nodelocal")
	if err != nil {
		return nil, configError("check configuration", err)
	}
	r := &Reconciler{
		cfg:         cfg,
		log:         cfg.Logger,
		leases:      map[*Lease]struct{}{},
		fw:          fw,
		nodeAddrs:   nodeAddresses,
		forgetFlows: forgetLocalFlows,
	}
	if !cfg.NoInterface {
		m, err := link.New(link.Options{Name: cfg.Interface, Add: cfg.AddLink})
		if err != nil {
			return nil, configError("check configuration", err)
		}
		r.link = m
	}
	r.lock = lock
	r.status.Interface = cfg.Interface
	return r, nil
}

// Lease is one holder's claim on a Reconciler. The Reconciler tears everything down when the last lease is
// released.
type Lease struct {
	r        *Reconciler
	claim    Claim
	rules    bool
	released bool
}

// Acquire adds a lease for c and puts its addresses on the link before it returns, so that a server can
// bind them next. Its rules follow at once, or with EnableRules when c.DeferRules is set. When the link or
// the rules cannot be put in place, Acquire fails and leaves the node as the other leases need it.
func (r *Reconciler) Acquire(ctx context.Context, c Claim) (*Lease, error) {
	c, err := c.normalize()
	if err != nil {
		return nil, configError("check claim", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, ErrClosed
	}
	l := &Lease{r: r, claim: c, rules: !c.DeferRules}
	r.leases[l] = struct{}{}
	r.noteLeases()
	err = r.syncLocked(ctx, syncLink)
	if err == nil && l.rules {
		// Rules at once: the caller says its server answers, so it takes the node back from the guard.
		err = r.syncLocked(ctx, syncRules|syncReclaim)
	}
	if err != nil {
		delete(r.leases, l)
		l.released = true
		r.noteLeases()
		var undo error
		if len(r.leases) == 0 {
			undo = r.teardownLocked(ctx)
		} else {
			undo = r.syncLocked(ctx, syncLink|syncRules)
		}
		err = errors.Join(err, undo)
		r.noteAttempt(err)
		return nil, err
	}
	return l, nil
}

// Claim returns the lease's claim, defaults filled in.
func (l *Lease) Claim() Claim {
	l.r.mu.Lock()
	defer l.r.mu.Unlock()
	return l.claim
}

// EnableRules puts the lease's rules in place. When that fails the rules stay wanted, and Run keeps trying.
func (l *Lease) EnableRules(ctx context.Context) error {
	return l.setRules(ctx, true)
}

// DisableRules takes the lease's rules out, unless another lease needs the same ones.
func (l *Lease) DisableRules(ctx context.Context) error {
	return l.setRules(ctx, false)
}

func (l *Lease) setRules(ctx context.Context, on bool) error {
	r := l.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if l.released {
		return ErrReleased
	}
	if r.closed {
		return ErrClosed
	}
	l.rules = on
	// EnableRules is the caller's word that its server answers: it takes the node back from the guard.
	scope := syncRules
	if on {
		scope |= syncReclaim
	}
	return r.syncLocked(ctx, scope)
}

// Update replaces the lease's claim (DeferRules aside: whether its rules are enabled does not change) and
// syncs. Addresses no lease claims any more leave the link, if we added them; rules follow the claims.
func (l *Lease) Update(ctx context.Context, c Claim) error {
	c, err := c.normalize()
	if err != nil {
		return configError("check claim", err)
	}
	r := l.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if l.released {
		return ErrReleased
	}
	if r.closed {
		return ErrClosed
	}
	c.DeferRules = l.claim.DeferRules
	l.claim = c
	return r.syncLocked(ctx, syncLink|syncRules)
}

// Release gives the lease up. The last release tears the link and rules down (see Teardown); earlier ones
// drop what only this lease needed. Releasing twice is not an error.
func (l *Lease) Release(ctx context.Context) error {
	r := l.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if l.released {
		return nil
	}
	l.released = true
	delete(r.leases, l)
	r.noteLeases()
	if r.closed {
		return nil
	}
	if len(r.leases) == 0 {
		return r.teardownLocked(ctx)
	}
	return r.syncLocked(ctx, syncLink|syncRules)
}

// Ensure puts the link, its addresses and the rules in place as the leases claim them, repairing whatever
// was changed behind our back. With no lease it does nothing.
func (r *Reconciler) Ensure(ctx context.Context) error { return r.sync(ctx, syncLink|syncRules) }

func (r *Reconciler) sync(ctx context.Context, scope syncScope) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return ErrClosed
	}
	return r.syncLocked(ctx, scope)
}

// Reclaim is Ensure for a cache that knows it answers: if the fail-open guard has diverted the node's DNS
// (see Guard), it removes the guard's divert and marks, then puts the addresses and the jumps back. Ensure,
// and so Run, leave the jumps out and do not put back addresses the link lost (the kube-dns ClusterIP the
// guard removed) while the guard's divert is there, so that a cache whose repair loop runs but whose server
// does not answer cannot undo the guard's work; EnableRules, and Acquire with rules at once, reclaim as
// this does.
func (r *Reconciler) Reclaim(ctx context.Context) error {
	return r.sync(ctx, syncLink|syncRules|syncReclaim)
}

// Teardown removes the jumps, then our chains (both families), then the addresses we added or, if we
// created it, the link, and releases every lease. It honours ctx, so a deadline bounds it. Tearing down
// twice is not an error; a later Acquire starts afresh.
func (r *Reconciler) Teardown(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return ErrClosed
	}
	return r.teardownLocked(ctx)
}

// TeardownLink removes the link if this package created it, or else the addresses this Reconciler added,
// and touches no rule: for a caller whose Teardown ran out of time on the rules (the xtables lock held),
// so that the addresses do not attract traffic nobody serves once the process is gone.
func (r *Reconciler) TeardownLink(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return ErrClosed
	}
	if r.link == nil {
		return nil
	}
	if err := r.link.Teardown(ctx); err != nil {
		return linkError("tear down link "+r.cfg.Interface, err)
	}
	return nil
}

// Run calls Ensure every interval until ctx ends, logging failures when they change and recovery when
// it comes. It returns nil when ctx ends, and ErrClosed when the Reconciler is closed.
func (r *Reconciler) Run(ctx context.Context, interval time.Duration) error {
	if interval <= 0 {
		return configError("run", fmt.Errorf("interval %v is not positive", interval))
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	last := ""
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		err := r.Ensure(ctx)
		switch {
		case errors.Is(err, ErrClosed):
			return err
		case ctx.Err() != nil:
			return nil
		case err != nil && err.Error() != last:
			r.log.Errorf("nodelocal: sync failed, will retry every %v: %v", interval, err)
			last = err.Error()
		case err == nil && last != "":
			r.log.Infof("nodelocal: sync succeeded again")
			last = ""
		}
	}
}

// Status returns a snapshot of the last sync. It does not wait for a sync in progress.
func (r *Reconciler) Status() Status {
	r.statusMu.Lock()
	defer r.statusMu.Unlock()
	s := r.status
	s.Addresses = slices.Clone(s.Addresses)
	s.ForeignAddresses = slices.Clone(s.ForeignAddresses)
	s.RuleAddresses = slices.Clone(s.RuleAddresses)
	s.Ahead = slices.Clone(s.Ahead)
	return s
}

// Close releases every lease and the node lock, leaving link and rules as they are (call Teardown first
// to remove them). Closing twice is not an error.
func (r *Reconciler) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil
	}
	r.closed = true
	for l := range r.leases {
		l.released = true
	}
	clear(r.leases)
	r.noteLeases()
	return r.lock.Release()
}
