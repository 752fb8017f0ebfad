//go:build linux

package nodelocal

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/nodelocal/internal/link"
	"github.com/nodelocaldns/nodelocaldns/nodelocal/internal/nodelock"
	"github.com/nodelocaldns/nodelocaldns/nodelocal/internal/rules"
)

// DefaultGuardLockPath is the guard's lock file unless configured otherwise. It is not the cache's node
// lock: the guard runs beside the cache, in another process.
const DefaultGuardLockPath = "/run/nodelocaldns-guard.lock"

// Defaults of GuardConfig.
const (
	DefaultGuardInterval     = 250 * time.Millisecond
	DefaultGuardIdleInterval = 5 * time.Second
	DefaultGuardProbeTimeout = 500 * time.Millisecond
	DefaultGuardFailAfter    = 3
	DefaultGuardRecoverAfter = 3
	DefaultGuardRecheck      = time.Second
)

// ProbeFunc asks the DNS server at server one question and returns nil when a well-formed answer came
// back, whatever its rcode.
type ProbeFunc func(ctx context.Context, server netip.AddrPort) error

// GuardConfig is what a Guard watches and what it does when the cache fails.
type GuardConfig struct {
	// Interface, Backend, BackendWait and LockWait mean what they mean in Config, and must match the
	// cache's.
	Interface   string
	Backend     string
	BackendWait time.Duration
	LockWait    time.Duration
	// LockPath is the guard's own lock file, so that a node runs one guard; DefaultGuardLockPath when empty.
	LockPath string
	// CacheLockPath is the cache's node lock (Config.LockPath; DefaultLockPath when empty). The guard watches
	// it and probes at once when a process that had it open closes it: the cache's process, however it
	// died, closes it the moment it is gone.
	CacheLockPath string

	// Addresses are the cache's local addresses, each probed on DNSPort (DefaultDNSPort when zero).
	Addresses []netip.Addr
	DNSPort   uint16
	// ServiceAddresses are those of Addresses that are Service ClusterIPs with kube-proxy behind them (the
	// kube-dns ClusterIP): failing open removes them from the link, and kube-proxy's DNAT takes over.
	ServiceAddresses []netip.Addr
	// Upstream holds the kube-dns-upstream Service's ClusterIP, one per family. Failing open diverts the
	// other addresses (the link-local one, which nothing else serves) to that Service: with a DNAT to the
	// ClusterIP where it is an address of the node (kube-proxy's IPVS mode puts it on kube-ipvs0, and IPVS
	// takes it from there), and in iptables mode with a jump into kube-proxy's own chain of the Service
	// (a DNAT to a ClusterIP would send the traffic off the node: kube-proxy's DNAT never sees traffic
	// DNATed before). An address whose family has no upstream, or whose upstream kube-proxy serves in
	// neither way, is not diverted (logged).
	Upstream []netip.Addr

	// Interval is the time between probe rounds while anything is in doubt: a round failed, the node has
	// failed open, the cache's lock file was closed (or cannot be watched) and fewer than RecoverAfter
	// rounds were answered since, or the guard has just started. IdleInterval is the time between rounds
	// otherwise, while the cache answers and its lock tells of nothing: a cache that dies is found through
	// its lock, and these rounds are for one that hangs while alive. ProbeTimeout bounds each probe.
	Interval     time.Duration
	IdleInterval time.Duration
	ProbeTimeout time.Duration
	// FailAfter is how many failed rounds in a row make the guard fail open (a round fails when any
	// address does not answer); RecoverAfter how many answered rounds in a row, once the cache has taken
	// the node back, make it watch again.
	FailAfter    int
	RecoverAfter int
	// Recheck is how often the guard reads the rules while failed open, or while the probes fail but the
	// cache's jumps are not in place.
	Recheck time.Duration
	// ProbeName and ProbeType are the question (SOA when ProbeType is zero). With no ProbeName the probe
	// is an EDNS version 1 query, which a server answers with BADVERS before any plugin runs (RFC 6891;
	// CoreDNS does so in its server loop): it shows that the process serves DNS on the address without
	// depending on the cluster DNS behind it, so an upstream outage or a cache miss cannot fail the node
	// open. A name sends the probe through the plugin chain, and so through the upstreams on a miss.
	ProbeName string
	ProbeType uint16
	// Probe replaces the DNS probe, in tests.
	Probe ProbeFunc
	// Logger receives what the guard did; nothing is logged when nil.
	Logger Logger
}

func (c GuardConfig) withDefaults() GuardConfig {
	if c.Interface == "" {
		c.Interface = DefaultInterface
	}
	if c.Backend == "" {
		c.Backend = string(rules.Auto)
	}
	if c.LockWait == 0 {
		c.LockWait = rules.DefaultLockWait
	}
	if c.BackendWait == 0 {
		c.BackendWait = DefaultBackendWait
	}
	if c.LockPath == "" {
		c.LockPath = DefaultGuardLockPath
	}
	if c.DNSPort == 0 {
		c.DNSPort = DefaultDNSPort
	}
	if c.CacheLockPath == "" {
		c.CacheLockPath = DefaultLockPath
	}
	if c.Interval == 0 {
		c.Interval = DefaultGuardInterval
	}
	if c.IdleInterval == 0 {
		c.IdleInterval = DefaultGuardIdleInterval
	}
	if c.ProbeTimeout == 0 {
		c.ProbeTimeout = DefaultGuardProbeTimeout
	}
	if c.FailAfter == 0 {
		c.FailAfter = DefaultGuardFailAfter
	}
	if c.RecoverAfter == 0 {
		c.RecoverAfter = DefaultGuardRecoverAfter
	}
	if c.Recheck == 0 {
		c.Recheck = DefaultGuardRecheck
	}
	if c.ProbeType == 0 {
		c.ProbeType = dns.TypeSOA
	}
	if c.Logger == nil {
		c.Logger = discard{}
	}
	return c
}

// diverts checks the addresses and pairs each one that is not a Service address with the upstream of its
// family; it also returns those that have no upstream of their family.
func (c GuardConfig) diverts() (ds []rules.Divert, undiverted []netip.Addr, err error) {
	if len(c.Addresses) == 0 {
		return nil, nil, errors.New("the guard needs the cache's addresses")
	}
	if err := link.ValidName(c.Interface); err != nil {
		return nil, nil, err
	}
	if _, err := rules.ParseMode(c.Backend); err != nil {
		return nil, nil, err
	}
	if c.Interval < 0 || c.IdleInterval < 0 || c.ProbeTimeout < 0 || c.Recheck < 0 || c.FailAfter < 0 || c.RecoverAfter < 0 || c.LockWait < 0 || c.BackendWait < 0 {
		return nil, nil, errors.New("negative interval, timeout or count")
	}
	for _, s := range c.ServiceAddresses {
		if !slices.Contains(c.Addresses, s.Unmap()) {
			return nil, nil, fmt.Errorf("service address %s is not one of the cache's addresses %v", s, c.Addresses)
		}
	}
	for _, a := range c.Addresses {
		if err := checkLocalAddress(a); err != nil {
			return nil, nil, err
		}
		if slices.Contains(c.ServiceAddresses, a) {
			continue
		}
		i := slices.IndexFunc(c.Upstream, func(u netip.Addr) bool { return rules.FamilyOf(u) == rules.FamilyOf(a) })
		if i < 0 {
			undiverted = append(undiverted, a)
			continue
		}
		ds = append(ds, rules.Divert{From: a, To: c.Upstream[i].Unmap(), Port: c.DNSPort})
	}
	for _, u := range c.Upstream {
		if !u.IsValid() || u.IsUnspecified() || slices.Contains(c.Addresses, u.Unmap()) {
			return nil, nil, fmt.Errorf("upstream %q cannot be the kube-dns-upstream ClusterIP", u)
		}
	}
	return ds, undiverted, nil
}

// GuardState is what a Guard is doing.
type GuardState int32

// The states, with the values of the state metric.
const (
	// GuardWatching: the cache's rules and addresses are its own; the guard probes it.
	GuardWatching GuardState = 0
	// GuardFailedOpen: the guard took the cache's jumps and Service addresses out and diverted the other
	// addresses, and waits for the cache to take the node back.
	GuardFailedOpen GuardState = 1
)

func (s GuardState) String() string {
	if s == GuardFailedOpen {
		return "failed open"
	}
	return "watching"
}

// Guard keeps a node's DNS working when its cache dies. It runs in a process of its own beside the cache
// and probes the cache with DNS queries on each of its addresses: every IdleInterval while all is well, and
// every Interval from the moment the cache's lock file is closed (its process died, or let go) until the
// cache has answered again, so that an idle node is not woken four times a second to learn nothing. After
// FailAfter failed rounds in a row,
// and only when the cache's jumps are in place (the cache puts them in once it answers, so a cache that is
// still starting, or that stopped cleanly, is left alone), it fails open:
//
//   - it writes its nat chain (rules.Guard), which DNATs each address that is not a Service address (the
//     link-local one) to the kube-dns-upstream ClusterIP of its family where that ClusterIP is an address
//     of the node (IPVS mode), and its marks in raw and filter; they tell the cache's Reconciler to keep
//     its jumps out (see Reconciler.Reclaim);
//   - it removes the cache's jumps, in transactions that check the marks (rules.Manager.RemoveJumpsWhileMarked;
//     the chains stay), so that kube-proxy's DNAT sees the traffic for the kube-dns ClusterIP again;
//   - it removes the Service addresses (the kube-dns ClusterIP) from the link.
//
// It does not undo any of it: the cache does, when it answers again (Lease.EnableRules, Reconciler.Reclaim),
// by removing the guard's chain and marks, then putting its addresses and jumps back; a fail-open that
// finds the marks gone leaves the node to the cache. A Reconciler's periodic Ensure leaves the jumps out
// and the lost addresses off while the guard's chain exists, so a cache whose repair loop runs while its
// server hangs does not fight the guard; while failed open the guard also takes out jumps and Service
// addresses that were put back (by such a loop before it saw the chain, by a cache process starting, or
// before the guard itself restarted). Once the marks are gone and RecoverAfter rounds in a row were
// answered, it watches again.
type Guard struct {
	cfg     GuardConfig
	log     Logger
	diverts []rules.Divert
	fams    []rules.Family
	link    linkOps
	lock    *nodelock.Lock
	probe   ProbeFunc
	// nodeAddrs lists the node's addresses and forgetFlows its tracked flows of the cache: netlink, or a
	// test's fake.
	nodeAddrs   func(ctx context.Context) ([]netip.Addr, error)
	forgetFlows func(endpoints []netip.AddrPort) (uint, error)

	state     atomic.Int32
	failovers atomic.Uint64

	mu sync.Mutex // serialises Run and FailOpen
	// fw chooses the rules backend once the cache's rules or kube-proxy's are on the node.
	fw *firewallChoice
	// routes are the divert's routes as this guard last wrote them; nil when it wrote none (it found the
	// node failed open at its start, or by a cache's hand-over).
	routes []rules.DivertRoute

	// beforeJumpRemoval, when set, runs right before the guard takes the cache's jumps out: tests use it
	// to run a reclaim at the worst moment.
	beforeJumpRemoval func()
}

// NewGuard checks cfg and takes the guard lock; a second guard on the node fails with an error of
// KindNodeLock naming the first.
func NewGuard(cfg GuardConfig) (*Guard, error) {
	cfg = cfg.withDefaults()
	cfg.Addresses = unmapAll(cfg.Addresses)
	cfg.ServiceAddresses = unmapAll(cfg.ServiceAddresses)
	ds, undiverted, err := cfg.diverts()
	if err != nil {
		return nil, configError("check guard configuration", err)
	}
	if len(undiverted) > 0 {
		cfg.Logger.Warningf("nodelocal guard: no kube-dns-upstream address of the family of %v: failing open leaves them undiverted, "+
			"so Pods that ask them get no answer until the cache is back (Pods that ask the kube-dns ClusterIP are served)", undiverted)
	}
	m, err := link.New(link.Options{Name: cfg.Interface})
	if err != nil {
		return nil, configError("check guard configuration", err)
	}
	fw, err := newFirewallChoice(cfg.Backend, cfg.BackendWait, cfg.LockWait, cfg.Logger, "nodelocal guard")
	if err != nil {
		return nil, configError("check guard configuration", err)
	}
	g := &Guard{cfg: cfg, log: cfg.Logger, diverts: ds, fams: familiesOf(cfg.Addresses), link: m, probe: cfg.Probe,
		nodeAddrs: nodeAddresses, forgetFlows: forgetLocalFlows, fw: fw}
	if g.probe == nil {
		g.probe = DNSProbe(cfg.ProbeName, cfg.ProbeType, cfg.ProbeTimeout)
	}
	lock, err := nodelock.Acquire(cfg.LockPath)
	if err != nil {
		return nil, &Error{Kind: KindNodeLock, Op: "take the guard lock", Err: err}
	}
	g.lock = lock
	return g, nil
}

func unmapAll(addrs []netip.Addr) []netip.Addr {
	out := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		out = append(out, a.Unmap())
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// Close releases the guard lock. It leaves the node as it is.
func (g *Guard) Close() error { return g.lock.Release() }

// State returns what the guard is doing.
func (g *Guard) State() GuardState { return GuardState(g.state.Load()) }

// Failovers returns how many times the guard failed open.
func (g *Guard) Failovers() uint64 { return g.failovers.Load() }

// Run watches the cache until ctx ends, failing open when it stops answering. It returns nil when ctx
// ends. Started on a node that has already failed open (the guard's chain exists), it waits for the cache
// to take the node back.
func (g *Guard) Run(ctx context.Context) error {
	g.mu.Lock()
	present, err := g.divertPresentLocked(ctx)
	g.mu.Unlock()
	w := &guardWatch{}
	switch {
	case err != nil:
		g.log.Warningf("nodelocal guard: could not look for an earlier fail-open: %v", err)
	case present:
		g.state.Store(int32(GuardFailedOpen))
		g.log.Warningf("nodelocal guard: the node has failed open already; waiting for the cache to take it back")
	}
	g.log.Infof("nodelocal guard: watching %v on port %d every %v, every %v while the cache answers and its lock %s tells of nothing "+
		"(fail open after %d failed rounds)", g.cfg.Addresses, g.cfg.DNSPort, g.cfg.Interval, g.cfg.IdleInterval, g.cfg.CacheLockPath, g.cfg.FailAfter)
	lock := g.watchCacheLock(ctx, w)
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case _, ok := <-lock:
			if !ok && ctx.Err() != nil {
				return nil
			}
			if !ok {
				g.log.Warningf("nodelocal guard: the watch of the cache's lock %s ended; probing every %v until it can be watched again",
					g.cfg.CacheLockPath, g.cfg.Interval)
				lock = nil
			}
			// The cache's process may have died: look now, and closely until it has answered again.
			w.successes = 0
		}
		if lock == nil {
			lock = g.watchCacheLock(ctx, w)
		}
		g.mu.Lock()
		g.tickLocked(ctx, w, time.Now())
		g.mu.Unlock()
		t.Reset(g.roundWait(w, lock != nil)) // go 1.23 timers: a Reset drops a value not yet received
	}
}

// watchCacheLock watches the cache's lock file (nodelock.Closed). Where it cannot, it returns nil and logs
// why once, until a watch succeeds again: the guard then probes every Interval.
func (g *Guard) watchCacheLock(ctx context.Context, w *guardWatch) <-chan struct{} {
	lock, err := nodelock.Closed(ctx, g.cfg.CacheLockPath)
	if err != nil {
		if !w.unwatchedLogged {
			g.log.Warningf("nodelocal guard: probing every %v: %v", g.cfg.Interval, err)
			w.unwatchedLogged = true
		}
		return nil
	}
	if w.unwatchedLogged {
		g.log.Infof("nodelocal guard: watching the cache's lock %s again", g.cfg.CacheLockPath)
		w.unwatchedLogged = false
	}
	return lock
}

// roundWait is the time to the next probe round: IdleInterval while the node is the cache's, the last
// RecoverAfter rounds were answered and the cache's lock is watched, Interval otherwise (see GuardConfig).
func (g *Guard) roundWait(w *guardWatch, watched bool) time.Duration {
	if watched && g.State() == GuardWatching && w.fails == 0 && w.successes >= g.cfg.RecoverAfter {
		return g.cfg.IdleInterval
	}
	return g.cfg.Interval
}

// guardWatch is Run's memory between rounds.
type guardWatch struct {
	fails, successes int
	// reclaimed is set, while failed open, once the guard's chain is gone.
	reclaimed bool
	// nextCheck is when the rules may be read next.
	nextCheck time.Time
	// idleLogged is set once a failure without the cache's jumps was logged.
	idleLogged bool
	// unwatchedLogged is set once it was logged that the cache's lock cannot be watched.
	unwatchedLogged bool
	lastErr         string
}

func (g *Guard) tickLocked(ctx context.Context, w *guardWatch, now time.Time) {
	if g.State() == GuardFailedOpen && !w.reclaimed {
		if now.Before(w.nextCheck) {
			return
		}
		w.nextCheck = now.Add(g.cfg.Recheck)
		// A cache's repair loop may have put jumps back before it saw our marks, and a cache process (or an
		// earlier guard's restart) the Service addresses: take them out again while the node is ours.
		fw, err := g.fw.get(ctx)
		var k keptOut
		if err == nil {
			k, err = g.keepOutLocked(ctx, fw)
		}
		switch {
		case err != nil:
			g.log.Errorf("nodelocal guard: could not keep the cache's jumps and Service addresses out: %v", err)
			return
		case k.marked:
			if k.unhooked || len(k.addresses) > 0 {
				g.log.Warningf("nodelocal guard: took out the cache's jumps (%v) and %v again: the node stays failed open until the cache answers",
					k.unhooked, k.addresses)
			}
			g.followEndpointsLocked(ctx, fw)
			return
		}
		w.reclaimed, w.fails, w.successes = true, 0, 0
		w.nextCheck = time.Time{}
		g.log.Infof("nodelocal guard: the cache took the node back")
	}
	err := g.probeAll(ctx)
	if ctx.Err() != nil {
		return
	}
	if err == nil {
		if w.fails > 0 && w.lastErr != "" {
			g.log.Infof("nodelocal guard: the cache answers again after %d failed rounds", w.fails)
		}
		w.fails, w.lastErr, w.idleLogged = 0, "", false
		w.successes++
		w.nextCheck = time.Time{}
		if g.State() == GuardFailedOpen && w.successes >= g.cfg.RecoverAfter {
			g.state.Store(int32(GuardWatching))
			w.reclaimed = false
			g.log.Infof("nodelocal guard: the cache answered %d rounds in a row; watching", w.successes)
		}
		return
	}
	w.successes = 0
	w.fails++
	if w.fails == 1 {
		// Once per streak: a cache that is gone fails every round, each time from another port.
		g.log.Warningf("nodelocal guard: a probe round failed: %v", err)
		w.lastErr = err.Error()
	}
	if w.fails < g.cfg.FailAfter || now.Before(w.nextCheck) {
		return
	}
	w.nextCheck = now.Add(g.cfg.Recheck)
	armed, err := g.cacheJumpsPresentLocked(ctx)
	if err != nil {
		g.log.Errorf("nodelocal guard: could not read the cache's jumps: %v", err)
		return
	}
	if !armed {
		if !w.idleLogged {
			g.log.Infof("nodelocal guard: the cache does not answer, but its jumps are not in place (starting, or stopped): nothing to fail open")
			w.idleLogged = true
		}
		return
	}
	start := time.Now()
	if err := g.failOpenLocked(ctx); errors.Is(err, errTakenBack) {
		g.log.Infof("nodelocal guard: the cache took the node back while the guard was failing it open; watching")
		w.fails, w.lastErr = 0, ""
		return
	} else if err != nil {
		g.log.Errorf("nodelocal guard: failing open: %v (retrying)", err)
		w.nextCheck = time.Time{}
		return
	}
	g.failovers.Add(1)
	g.state.Store(int32(GuardFailedOpen))
	w.reclaimed, w.fails, w.successes, w.lastErr = false, 0, 0, ""
	w.nextCheck = now.Add(g.cfg.Recheck)
	g.log.Warningf("nodelocal guard: the cache failed %d probe rounds in a row; failed open in %v",
		g.cfg.FailAfter, time.Since(start).Round(time.Millisecond))
}

// probeAll probes every address at once and returns the errors of those that did not answer.
func (g *Guard) probeAll(ctx context.Context) error {
	errs := make([]error, len(g.cfg.Addresses))
	var wg sync.WaitGroup
	for i, a := range g.cfg.Addresses {
		wg.Go(func() {
			pctx, cancel := context.WithTimeout(ctx, g.cfg.ProbeTimeout)
			defer cancel()
			errs[i] = g.probe(pctx, netip.AddrPortFrom(a, g.cfg.DNSPort))
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}
