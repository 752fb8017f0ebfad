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
	"github.com/nodelocaldns/nodelocaldns/nodelocal/nodelock"
	"github.com/nodelocaldns/nodelocaldns/nodelocal/rules"
)

// Reconciler owns a node's link, addresses and rules for a node-local DNS cache. It serves the union of
// the claims of its leases, and it is safe for concurrent use: syncs are serialised.
type Reconciler struct {
	cfg  Config
	log  Logger
	lock *nodelock.Lock
	link *link.Manager // nil with NoInterface

	mu      sync.Mutex // serialises syncs; guards the fields below
	closed  bool
	leases  map[*Lease]struct{}
	backend *rules.Backend
	rules   *rules.Manager
	// nft drives the nftables backend; nil with an iptables one.
	nft *rules.NFTablesManager
	// nftWritten holds the endpoints of the cache's nftables table as last synced, nil before.
	nftWritten []rules.Endpoint
	// backendWaitSince is when the first backend selection found no kube-proxy rules on the node.
	backendWaitSince time.Time
	// applied holds the families whose rules this Reconciler has written (or may have: a failed write).
	applied map[rules.Family]bool
	// lastRules holds the ruleset of each family as last synced, to tell repairs from changes.
	lastRules map[rules.Family]rules.Ruleset
	// leftoversChecked is set once the first rules sync looked for rules of families nobody claims.
	leftoversChecked bool
	fallbackLogged   bool
	foreignLogged    string
	guardLogged      bool

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
	r := &Reconciler{
		cfg:       cfg,
		log:       cfg.Logger,
		leases:    map[*Lease]struct{}{},
		applied:   map[rules.Family]bool{},
		lastRules: map[rules.Family]rules.Ruleset{},
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

// Config returns the configuration in effect, defaults filled in. A shared Reconciler cannot change it;
// a caller whose configuration differs should say so rather than share.
func (r *Reconciler) Config() Config { return r.cfg }

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
	err = r.syncLocked(ctx, true, false, false)
	if err == nil && l.rules {
		// Rules at once: the caller says its server answers, so it takes the node back from the guard.
		err = r.syncLocked(ctx, false, true, true)
	}
	if err != nil {
		delete(r.leases, l)
		l.released = true
		r.noteLeases()
		var undo error
		if len(r.leases) == 0 {
			undo = r.teardownLocked(ctx)
		} else {
			undo = r.syncLocked(ctx, true, true, false)
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
	return r.syncLocked(ctx, false, true, on)
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
	return r.syncLocked(ctx, true, true, false)
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
	return r.syncLocked(ctx, true, true, false)
}

// Ensure puts the link, its addresses and the rules in place as the leases claim them, repairing whatever
// was changed behind our back. With no lease it does nothing.
func (r *Reconciler) Ensure(ctx context.Context) error { return r.sync(ctx, true, true, false) }

// EnsureLink is Ensure for the link and its addresses only.
func (r *Reconciler) EnsureLink(ctx context.Context) error { return r.sync(ctx, true, false, false) }

// EnsureRules is Ensure for the rules only.
func (r *Reconciler) EnsureRules(ctx context.Context) error { return r.sync(ctx, false, true, false) }

func (r *Reconciler) sync(ctx context.Context, doLink, doRules, reclaim bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return ErrClosed
	}
	return r.syncLocked(ctx, doLink, doRules, reclaim)
}

// Reclaim is Ensure for a cache that knows it answers: if the fail-open guard has diverted the node's DNS
// (see Guard), it removes the guard's divert and marks, then puts the addresses and the jumps back. Ensure,
// and so Run, leave the jumps out and do not put back addresses the link lost (the kube-dns ClusterIP the
// guard removed) while the guard's divert is there, so that a cache whose repair loop runs but whose server
// does not answer cannot undo the guard's work; EnableRules, and Acquire with rules at once, reclaim as
// this does.
func (r *Reconciler) Reclaim(ctx context.Context) error { return r.sync(ctx, true, true, true) }

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

// wanted is the union of the leases' claims.
type wanted struct {
	addrs     []netip.Addr
	endpoints []rules.Endpoint
}

func (r *Reconciler) wantedLocked() wanted {
	var w wanted
	for l := range r.leases {
		w.addrs = append(w.addrs, l.claim.Addresses...)
		if l.rules {
			w.endpoints = append(w.endpoints, rules.Endpoints(l.claim.Addresses, l.claim.DNSPort, l.claim.ExtraTCPPorts)...)
		}
	}
	slices.SortFunc(w.addrs, netip.Addr.Compare)
	w.addrs = slices.Compact(w.addrs)
	w.endpoints = rules.SortEndpoints(w.endpoints)
	return w
}

// syncLocked puts the link and the rules in place as the leases claim them. With reclaim it also takes the
// node back from the fail-open guard: first the guard's divert and marks go, then the addresses come back,
// then the jumps, the order keepOutLocked in guard.go relies on. Without reclaim, while the guard's divert
// is there, it keeps the jumps out and does not put back addresses the link lost (the guard took the
// kube-dns ClusterIP out so that kube-proxy serves it).
func (r *Reconciler) syncLocked(ctx context.Context, doLink, doRules, reclaim bool) error {
	if len(r.leases) == 0 {
		return nil
	}
	w := r.wantedLocked()
	var errs []error
	// Taking the node back puts back the addresses the guard removed, whoever calls (EnableRules too).
	doLink = doLink || reclaim
	doRules = doRules && !r.cfg.NoRules
	failedOpen := false
	if doRules && len(w.endpoints) > 0 {
		var err error
		if failedOpen, err = r.guardLocked(ctx, w.endpoints, reclaim); err != nil {
			errs = append(errs, err)
			doRules = false
		}
	}
	if doLink && r.link != nil {
		addrs := w.addrs
		if failedOpen {
			addrs = r.heldLocked(ctx, addrs)
		}
		if err := r.syncLinkLocked(ctx, addrs); err != nil {
			errs = append(errs, err)
		}
	}
	if doRules && !failedOpen {
		errs = append(errs, r.syncRulesLocked(ctx, w.endpoints)...)
	}
	err := errors.Join(errs...)
	r.noteAttempt(err)
	return err
}

// heldLocked returns those of addrs the link holds now; all of them when the link cannot be read (the link
// sync that follows reports why).
func (r *Reconciler) heldLocked(ctx context.Context, addrs []netip.Addr) []netip.Addr {
	have, err := r.link.Addresses(ctx)
	if err != nil {
		return addrs
	}
	var held []netip.Addr
	for _, a := range addrs {
		if slices.Contains(have, a) {
			held = append(held, a)
		}
	}
	return held
}

// guardLocked looks for the fail-open guard's divert in the families of endpoints. Found, with reclaim
// it removes it; without, it reports the node failed open, so that the jumps stay out.
func (r *Reconciler) guardLocked(ctx context.Context, endpoints []rules.Endpoint, reclaim bool) (failedOpen bool, err error) {
	if err := r.ensureBackendLocked(ctx); err != nil {
		return false, err
	}
	divert, err := r.guardDivertsLocked(ctx, endpoints)
	if err != nil {
		return false, err
	}
	switch {
	case len(divert) > 0 && !reclaim:
		if !r.guardLogged {
			r.log.Warningf("nodelocal: the fail-open guard has diverted DNS (%s %v); the jumps stay out until the cache answers and reclaims the node", rules.GuardChain, divert)
			r.guardLogged = true
		}
		r.statusMu.Lock()
		r.status.GuardFailedOpen = true
		r.status.RulesPresent = false
		r.statusMu.Unlock()
		return true, nil
	case len(divert) > 0:
		// The divert goes first: until the jumps are back, the cache gets the link-local traffic
		// through conntrack and kube-proxy still serves the ClusterIP, so nothing is lost in between.
		for _, fam := range divert {
			if r.nft != nil {
				if _, err := r.nft.DeleteGuard(ctx); err != nil {
					return false, rulesError("remove the guard's divert (table inet "+rules.NFTablesGuardTable+")", err)
				}
				break
			}
			if err := r.rules.Delete(ctx, rules.Guard(fam, nil)); err != nil {
				return false, rulesError(fmt.Sprintf("remove the guard's %s divert", fam), err)
			}
		}
		r.log.Infof("nodelocal: the cache answers; removed the fail-open guard's divert (%v) and reclaimed the node", divert)
	}
	r.guardLogged = false
	r.statusMu.Lock()
	r.status.GuardFailedOpen = false
	r.statusMu.Unlock()
	return false, nil
}

func (r *Reconciler) syncLinkLocked(ctx context.Context, addrs []netip.Addr) error {
	res, err := r.link.Ensure(ctx, addrs)
	if err != nil {
		return linkError("ensure link "+r.cfg.Interface, err)
	}
	name := r.cfg.Interface
	if res.FellBack && !r.fallbackLogged {
		r.log.Warningf("nodelocal: the kernel has no dummy link type; %s is a bridge with no ports instead", name)
		r.fallbackLogged = true
	}
	if res.Created {
		r.log.Infof("nodelocal: created link %s (%s)", name, res.Kind)
	}
	if res.BroughtUp && !res.Created {
		r.log.Warningf("nodelocal: link %s was down; set it up", name)
	}
	if len(res.Added) > 0 {
		r.log.Infof("nodelocal: added %v to %s", res.Added, name)
	}
	if len(res.Removed) > 0 {
		r.log.Infof("nodelocal: removed %v from %s", res.Removed, name)
	}
	if foreign := fmt.Sprint(res.Foreign); len(res.Foreign) > 0 && foreign != r.foreignLogged {
		r.log.Warningf("nodelocal: %s also holds %s, which we did not add; leaving them", name, foreign)
		r.foreignLogged = foreign
	}
	r.statusMu.Lock()
	r.status.LinkKind, r.status.LinkOwned = res.Kind, res.Owned
	r.status.Addresses, r.status.ForeignAddresses = res.Present, res.Foreign
	r.statusMu.Unlock()
	return nil
}

func (r *Reconciler) ensureBackendLocked(ctx context.Context) error {
	if r.rules != nil {
		return nil
	}
	mode, err := rules.ParseMode(r.cfg.Backend)
	if err != nil {
		return configError("select rules backend", err)
	}
	b, err := rules.Select(ctx, mode)
	if none, ok := errors.AsType[*rules.NoKubeProxyRulesError](err); ok {
		b, err = r.noKubeProxyRulesLocked(none)
	}
	if err != nil {
		return rulesError("select rules backend", err)
	}
	r.log.Infof("nodelocal: using rules backend %s (%s)", b.Mode, b.Reason)
	r.backend = b
	r.rules = rules.NewManager(b, rules.ManagerOptions{LockWait: r.cfg.LockWait})
	if b.Mode == rules.NFTables {
		r.nft = rules.NewNFTablesManager()
	}
	r.statusMu.Lock()
	r.status.Backend, r.status.BackendReason = string(b.Mode), b.Reason
	r.statusMu.Unlock()
	return nil
}

// noKubeProxyRulesLocked decides what to do on a node that has no kube-proxy rules yet: wait up to
// Config.BackendWait from the first time (kube-proxy is likely starting beside us, and its rules tell
// where ours belong), then fall back to what the node's other rules suggest, and say so.
func (r *Reconciler) noKubeProxyRulesLocked(none *rules.NoKubeProxyRulesError) (*rules.Backend, error) {
	now := time.Now()
	if r.backendWaitSince.IsZero() {
		r.backendWaitSince = now
		r.log.Warningf("nodelocal: %v; waiting up to %v for kube-proxy's rules before falling back", none, r.cfg.BackendWait)
	}
	if waited := now.Sub(r.backendWaitSince); waited < r.cfg.BackendWait {
		return nil, fmt.Errorf("%w; waited %v of %v", none, waited.Round(time.Second), r.cfg.BackendWait)
	}
	r.log.Warningf("nodelocal: still no kube-proxy rules after %v: falling back to %s (%s); set the backend explicitly if kube-proxy uses another",
		r.cfg.BackendWait, none.Fallback, none.Reason)
	none.Backend.Reason = "no kube-proxy rules after " + r.cfg.BackendWait.String() + ": fallback, " + none.Reason
	return none.Backend, nil
}

func (r *Reconciler) syncRulesLocked(ctx context.Context, endpoints []rules.Endpoint) []error {
	if err := r.ensureBackendLocked(ctx); err != nil {
		return []error{err}
	}
	if r.nft != nil {
		return r.syncNFTablesLocked(ctx, endpoints)
	}
	byFamily := map[rules.Family][]rules.Endpoint{}
	for _, e := range endpoints {
		fam := rules.FamilyOf(e.Addr)
		byFamily[fam] = append(byFamily[fam], e)
	}
	var (
		errs    []error
		count   int
		covered []netip.Addr
	)
	for _, fam := range rules.Families {
		eps := byFamily[fam]
		rs := rules.NodeCache(fam, rules.NodeCacheSpec{Endpoints: eps})
		if len(eps) == 0 {
			if err := r.removeFamilyLocked(ctx, rs, !r.leftoversChecked); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		if _, err := r.backend.Tools(fam); err == nil {
			r.applied[fam] = true
		}
		res, err := r.rules.Sync(ctx, rs)
		if err != nil {
			errs = append(errs, rulesError(fmt.Sprintf("sync %s rules", fam), err))
			continue
		}
		if res.Changed {
			if last, ok := r.lastRules[fam]; ok && sameRuleset(last, rs) {
				r.log.Warningf("nodelocal: repaired %s rules: rewrote chains %v, jumps %v", fam, res.RewrittenChains, res.RepairedJumps)
			} else {
				r.log.Infof("nodelocal: wrote %s rules for %d endpoints", fam, len(eps))
			}
		}
		r.lastRules[fam] = rs
		count += res.Rules
		for _, e := range eps {
			covered = append(covered, e.Addr)
		}
	}
	r.leftoversChecked = true
	slices.SortFunc(covered, netip.Addr.Compare)
	r.statusMu.Lock()
	r.status.RulesPresent = len(errs) == 0 && len(endpoints) > 0
	r.status.Rules = count
	r.status.RuleAddresses = slices.Compact(covered)
	r.statusMu.Unlock()
	return errs
}

// removeFamilyLocked deletes the rules of a family nobody claims. For a family this Reconciler never wrote
// (leftovers of an earlier run, looked for once) a failure is only logged: no command for that family may
// ever have worked on this node.
func (r *Reconciler) removeFamilyLocked(ctx context.Context, layout rules.Ruleset, lookForLeftovers bool) error {
	fam := layout.Family
	if !r.applied[fam] {
		if !lookForLeftovers {
			return nil
		}
		if _, err := r.backend.Tools(fam); err != nil {
			return nil // no tools for the family: nothing of ours can be there
		}
	}
	if err := r.rules.Delete(ctx, layout); err != nil {
		if r.applied[fam] {
			return rulesError(fmt.Sprintf("delete %s rules", fam), err)
		}
		r.log.Warningf("nodelocal: could not look for leftover %s rules: %v", fam, err)
		return nil
	}
	if r.applied[fam] {
		r.log.Infof("nodelocal: deleted %s rules", fam)
	}
	r.applied[fam] = false
	delete(r.lastRules, fam)
	return nil
}

func (r *Reconciler) teardownLocked(ctx context.Context) error {
	for l := range r.leases {
		l.released = true
	}
	clear(r.leases)
	r.noteLeases()
	var errs []error
	if !r.cfg.NoRules {
		if err := r.ensureBackendLocked(ctx); err != nil {
			if !r.backendWaitSince.IsZero() && r.rules == nil {
				// Still waiting for kube-proxy's rules: this Reconciler has written none of its own.
				r.log.Infof("nodelocal: teardown: no rules backend chosen yet, so no rules of ours to remove")
			} else {
				errs = append(errs, err)
			}
		} else if r.nft != nil {
			errs = append(errs, r.syncNFTablesLocked(ctx, nil)...)
		} else {
			for _, fam := range rules.Families {
				if err := r.removeFamilyLocked(ctx, rules.NodeCache(fam, rules.NodeCacheSpec{}), true); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	if r.link != nil {
		if err := r.link.Teardown(ctx); err != nil {
			errs = append(errs, linkError("tear down link "+r.cfg.Interface, err))
		}
	}
	err := errors.Join(errs...)
	r.statusMu.Lock()
	if err == nil {
		r.status.LinkKind, r.status.LinkOwned = "", false
		r.status.Addresses, r.status.ForeignAddresses = nil, nil
		r.status.RulesPresent, r.status.Rules, r.status.RuleAddresses = false, 0, nil
	}
	r.statusMu.Unlock()
	r.noteAttempt(err)
	return err
}

// guardDivertsLocked returns the families of endpoints in which the fail-open guard's chain exists. The
// guard writes it in the families of the cache's addresses, so others are not looked at (a node may lack
// the IPv6 nat table).
func (r *Reconciler) guardDivertsLocked(ctx context.Context, endpoints []rules.Endpoint) ([]rules.Family, error) {
	var fams []rules.Family
	for _, fam := range rules.Families {
		if !slices.ContainsFunc(endpoints, func(e rules.Endpoint) bool { return rules.FamilyOf(e.Addr) == fam }) {
			continue
		}
		if r.nft != nil {
			ok, err := r.nft.TableExists(ctx, rules.NFTablesGuardTable)
			if err != nil {
				return nil, rulesError("look for the guard's divert (table inet "+rules.NFTablesGuardTable+")", err)
			}
			if ok {
				fams = append(fams, fam)
			}
			continue
		}
		if _, err := r.backend.Tools(fam); err != nil {
			continue // no tools for the family: no guard chain can be there
		}
		ok, err := r.rules.ChainExists(ctx, fam, rules.NAT, rules.GuardChain)
		if err != nil {
			return nil, rulesError(fmt.Sprintf("look for the guard's %s divert", fam), err)
		}
		if ok {
			fams = append(fams, fam)
		}
	}
	return fams, nil
}

func (r *Reconciler) noteLeases() {
	r.statusMu.Lock()
	r.status.Leases = len(r.leases)
	r.statusMu.Unlock()
}

func (r *Reconciler) noteAttempt(err error) {
	now := time.Now()
	r.statusMu.Lock()
	defer r.statusMu.Unlock()
	r.status.LastAttempt = now
	r.status.LastError = err
	if err == nil {
		r.status.LastSync = now
	}
}

func sameRuleset(a, b rules.Ruleset) bool {
	return a.Family == b.Family && slices.EqualFunc(a.Chains, b.Chains, func(x, y rules.Chain) bool {
		return x.Table == y.Table && x.Name == y.Name && slices.Equal(x.Hooks, y.Hooks) && x.JumpComment == y.JumpComment &&
			slices.EqualFunc(x.Rules, y.Rules, func(p, q rules.Rule) bool { return slices.Equal(p, q) })
	})
}
