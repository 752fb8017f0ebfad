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
	"github.com/vishvananda/netlink"

	"github.com/nodelocaldns/nodelocaldns/nodelocal/link"
	"github.com/nodelocaldns/nodelocaldns/nodelocal/nodelock"
	"github.com/nodelocaldns/nodelocaldns/nodelocal/rules"
)

// DefaultGuardLockPath is the guard's lock file unless configured otherwise. It is not the cache's node
// lock: the guard runs beside the cache, in another process.
const DefaultGuardLockPath = "/run/nodelocaldns-guard.lock"

// Defaults of GuardConfig.
const (
	DefaultGuardInterval     = 250 * time.Millisecond
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
	// Interface, Backend and LockWait mean what they mean in Config, and must match the cache's.
	Interface string
	Backend   string
	LockWait  time.Duration
	// LockPath is the guard's own lock file, so that a node runs one guard; DefaultGuardLockPath when empty.
	LockPath string

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

	// Interval is the time between probe rounds; ProbeTimeout bounds each probe.
	Interval     time.Duration
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
	if c.LockPath == "" {
		c.LockPath = DefaultGuardLockPath
	}
	if c.DNSPort == 0 {
		c.DNSPort = DefaultDNSPort
	}
	if c.Interval == 0 {
		c.Interval = DefaultGuardInterval
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
	if c.Interval < 0 || c.ProbeTimeout < 0 || c.Recheck < 0 || c.FailAfter < 0 || c.RecoverAfter < 0 || c.LockWait < 0 {
		return nil, nil, errors.New("negative interval, timeout or count")
	}
	for _, s := range c.ServiceAddresses {
		if !slices.Contains(c.Addresses, s.Unmap()) {
			return nil, nil, fmt.Errorf("service address %s is not one of the cache's addresses %v", s, c.Addresses)
		}
	}
	for _, a := range c.Addresses {
		if !a.IsValid() || a.IsUnspecified() {
			return nil, nil, fmt.Errorf("address %q cannot be a local DNS address", a)
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
// and probes the cache with DNS queries on each of its addresses. After FailAfter failed rounds in a row,
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
	link    *link.Manager
	lock    *nodelock.Lock
	probe   ProbeFunc

	state     atomic.Int32
	failovers atomic.Uint64

	mu    sync.Mutex // serialises Run and FailOpen
	rules *rules.Manager
	// nft drives the nftables backend; nil with an iptables one.
	nft *rules.NFTablesManager

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
	g := &Guard{cfg: cfg, log: cfg.Logger, diverts: ds, link: m, probe: cfg.Probe}
	for _, fam := range rules.Families {
		if slices.ContainsFunc(cfg.Addresses, func(a netip.Addr) bool { return rules.FamilyOf(a) == fam }) {
			g.fams = append(g.fams, fam)
		}
	}
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

// DNSProbe returns a ProbeFunc that asks name and qtype over UDP and waits up to timeout. Any well-formed
// answer with the query's ID counts, whatever its rcode: the server is alive. With an empty name it asks
// ". SOA" with EDNS version 1, which a server answers with BADVERS without looking at the question.
func DNSProbe(name string, qtype uint16, timeout time.Duration) ProbeFunc {
	return func(ctx context.Context, server netip.AddrPort) error {
		m := new(dns.Msg)
		if name == "" {
			m.SetQuestion(".", qtype)
			m.SetEdns0(dns.MinMsgSize, false)
			m.IsEdns0().SetVersion(1)
		} else {
			m.SetQuestion(dns.Fqdn(name), qtype)
			m.RecursionDesired = true
		}
		c := &dns.Client{Net: "udp", Timeout: timeout}
		r, _, err := c.ExchangeContext(ctx, m, server.String())
		if err != nil {
			return fmt.Errorf("probe %s: %w", server, err)
		}
		return CheckProbeResponse(m, r)
	}
}

// CheckProbeResponse reports whether r is an answer to q: a response with q's ID and question.
func CheckProbeResponse(q, r *dns.Msg) error {
	switch {
	case r == nil:
		return errors.New("no response")
	case !r.Response:
		return errors.New("a query came back, not a response")
	case r.Id != q.Id:
		return fmt.Errorf("response ID %d, query ID %d", r.Id, q.Id)
	case len(r.Question) > 0 && len(q.Question) > 0 && !sameQuestion(r.Question[0], q.Question[0]):
		return fmt.Errorf("response for %s, query for %s", r.Question[0].String(), q.Question[0].String())
	}
	return nil
}

func sameQuestion(a, b dns.Question) bool {
	return a.Qtype == b.Qtype && a.Qclass == b.Qclass && dns.CanonicalName(a.Name) == dns.CanonicalName(b.Name)
}

// Run watches the cache until ctx ends, failing open when it stops answering. It returns nil when ctx
// ends. Started on a node that has already failed open (the guard's chain exists), it waits for the cache
// to take the node back.
func (g *Guard) Run(ctx context.Context) error {
	g.mu.Lock()
	err := g.ensureBackendLocked(ctx)
	var present bool
	if err == nil {
		present, err = g.divertPresentLocked(ctx)
	}
	g.mu.Unlock()
	if errors.Is(err, errNoBackend) {
		return err
	}
	w := &guardWatch{}
	if errors.Is(err, errBackendPending) {
		g.log.Infof("nodelocal guard: %v; the backend is chosen once the cache's rules are there", err)
	} else if err != nil {
		g.log.Warningf("nodelocal guard: could not look for an earlier fail-open: %v", err)
	} else if present {
		g.state.Store(int32(GuardFailedOpen))
		g.log.Warningf("nodelocal guard: the node has failed open already; waiting for the cache to take it back")
	}
	g.log.Infof("nodelocal guard: watching %v on port %d every %v (fail open after %d failed rounds)",
		g.cfg.Addresses, g.cfg.DNSPort, g.cfg.Interval, g.cfg.FailAfter)
	t := time.NewTicker(g.cfg.Interval)
	defer t.Stop()
	for {
		g.mu.Lock()
		g.tickLocked(ctx, w, time.Now())
		g.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
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
	lastErr    string
}

func (g *Guard) tickLocked(ctx context.Context, w *guardWatch, now time.Time) {
	if g.State() == GuardFailedOpen && !w.reclaimed {
		if now.Before(w.nextCheck) {
			return
		}
		w.nextCheck = now.Add(g.cfg.Recheck)
		// A cache's repair loop may have put jumps back before it saw our marks, and a cache process (or an
		// earlier guard's restart) the Service addresses: take them out again while the node is ours.
		k, err := g.keepOutLocked(ctx)
		switch {
		case err != nil:
			g.log.Errorf("nodelocal guard: could not keep the cache's jumps and Service addresses out: %v", err)
			return
		case k.marked:
			if k.jumps > 0 || len(k.addresses) > 0 {
				g.log.Warningf("nodelocal guard: took out the cache's jumps (%d families) and %v again: the node stays failed open until the cache answers",
					k.jumps, k.addresses)
			}
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

// FailOpen fails open at once, whatever the probes say: for an operator, or a test. It fails, leaving the
// node to the cache, when the cache took the node back while it was under way.
func (g *Guard) FailOpen(ctx context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.ensureBackendLocked(ctx); err != nil {
		return err
	}
	if err := g.failOpenLocked(ctx); err != nil {
		return err
	}
	g.failovers.Add(1)
	g.state.Store(int32(GuardFailedOpen))
	return nil
}

// errTakenBack is a fail-open that found the cache taking the node back while it was under way: the
// node is the cache's, as it should be.
var errTakenBack = errors.New("the cache took the node back")

func (g *Guard) failOpenLocked(ctx context.Context) error {
	var diverts, skipped []rules.Divert
	var err error
	if g.nft != nil {
		// The nftables backend reads kube-proxy's endpoints for what is not local (nftablesDivertsLocked).
		diverts, skipped, err = localDiverts(g.diverts)
		if err != nil {
			return linkError("list the node's addresses", err)
		}
	} else if diverts, skipped, err = resolveDiverts(ctx, g.rules, g.diverts); err != nil {
		return err
	}
	if len(skipped) > 0 && g.nft == nil {
		g.log.Warningf("nodelocal guard: not diverting %v: the upstream is neither an address of this node (IPVS) nor a "+
			"ClusterIP in kube-proxy's KUBE-SERVICES chain (iptables mode); Pods that ask the kube-dns ClusterIP are served", skipped)
	}
	// The divert and its marks go first: they are also the word to the cache's repair loop to keep its
	// jumps out, and the condition of their removal.
	if g.nft != nil {
		nftDiverts, err := g.nftablesDivertsLocked(ctx, skipped)
		if err != nil {
			return err
		}
		if err := g.nft.WriteGuard(ctx, nftDiverts); err != nil {
			return rulesError("write the divert (table inet "+rules.NFTablesGuardTable+")", err)
		}
	}
	for _, fam := range g.fams {
		if g.nft != nil {
			break
		}
		if _, err := g.rules.Sync(ctx, rules.Guard(fam, diverts)); err != nil {
			return rulesError(fmt.Sprintf("write the %s divert", fam), err)
		}
	}
	k, err := g.keepOutLocked(ctx)
	if err != nil {
		return err
	}
	if !k.marked {
		return errTakenBack
	}
	if _, err := ForgetLocalFlows(DivertEndpoints(diverts)); err != nil {
		g.log.Warningf("nodelocal guard: %v", err)
	}
	g.log.Warningf("nodelocal guard: failed open: removed the cache's jumps and %v from %s; diverting %v",
		k.addresses, g.cfg.Interface, diverts)
	return nil
}

// keptOut is what keepOutLocked found and did.
type keptOut struct {
	// marked is true when the guard's marks were in place in some family: the node is failed open.
	marked bool
	// jumps counts the families whose jumps it took out; addresses are the Service addresses it removed.
	jumps     int
	addresses []netip.Addr
}

// keepOutLocked takes the cache's jumps and the Service addresses out, as long as the guard's marks are in
// place. The cache takes the node back in the opposite order (marks, then addresses, then jumps), so:
// jumps go only in a transaction that finds the marks (rules.Manager.RemoveJumpsWhileMarked), and Service
// addresses removed while the marks went away are given back.
func (g *Guard) keepOutLocked(ctx context.Context) (keptOut, error) {
	if g.beforeJumpRemoval != nil {
		g.beforeJumpRemoval()
	}
	var k keptOut
	if g.nft != nil {
		marked, removed, err := g.nft.UnhookCacheWhileMarked(ctx)
		if err != nil {
			return k, rulesError("unhook the cache's table inet "+rules.NFTablesTable, err)
		}
		k.marked = marked
		if removed {
			k.jumps = len(g.fams)
		}
	}
	for _, fam := range g.fams {
		if g.nft != nil {
			break
		}
		marked, removed, err := g.rules.RemoveJumpsWhileMarked(ctx, rules.NodeCache(fam, rules.NodeCacheSpec{}), rules.GuardChain)
		if err != nil {
			return k, rulesError(fmt.Sprintf("remove the cache's %s jumps", fam), err)
		}
		k.marked = k.marked || marked
		if removed {
			k.jumps++
		}
	}
	if !k.marked || len(g.cfg.ServiceAddresses) == 0 {
		return k, nil
	}
	removed, err := g.link.RemoveAddresses(ctx, g.cfg.ServiceAddresses)
	if err != nil {
		return k, linkError("remove the Service addresses from "+g.cfg.Interface, err)
	}
	if len(removed) == 0 {
		return k, nil
	}
	still, err := g.markedLocked(ctx)
	if err == nil && !still {
		// Taken back meanwhile: the cache put its addresses back before it removed our marks, and may have
		// done so before we removed them.
		if _, err := g.link.AddAddresses(ctx, removed); err != nil {
			return k, linkError("give "+g.cfg.Interface+" its Service addresses back", err)
		}
		return keptOut{}, nil
	}
	if err != nil {
		return k, err
	}
	k.addresses = removed
	return k, nil
}

// markedLocked reports whether the guard's marks are in place in some family.
func (g *Guard) markedLocked(ctx context.Context) (bool, error) {
	if g.nft != nil {
		return g.divertPresentLocked(ctx)
	}
	for _, fam := range g.fams {
		for _, t := range rules.GuardMarks {
			ok, err := g.rules.ChainExists(ctx, fam, t, rules.GuardChain)
			if err != nil {
				return false, rulesError(fmt.Sprintf("look for the %s marks", fam), err)
			}
			if ok {
				return true, nil
			}
		}
	}
	return false, nil
}

// localDiverts keeps the diverts whose upstream is an address of this node. A DNAT ends the nat table's
// walk for a packet, so kube-proxy's own DNAT never sees traffic the guard DNATed: the upstream ClusterIP
// answers only where it is local (kube-ipvs0 in IPVS mode, where IPVS takes it from there). Elsewhere the
// packets would be routed off the node, and a lookup that gets a port unreachable at once is better than one
// that times out.
func localDiverts(ds []rules.Divert) (kept, skipped []rules.Divert, err error) {
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, nil, err
	}
	local := map[netip.Addr]bool{}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			local[ip.Unmap()] = true
		}
	}
	for _, d := range ds {
		if local[d.To] {
			kept = append(kept, d)
		} else {
			skipped = append(skipped, d)
		}
	}
	return kept, skipped, nil
}

func (g *Guard) cacheJumpsPresentLocked(ctx context.Context) (bool, error) {
	if err := g.ensureBackendLocked(ctx); err != nil {
		if errors.Is(err, errBackendPending) {
			return false, nil // the cache has no rules anywhere yet
		}
		return false, err
	}
	if g.nft != nil {
		ok, err := g.nft.CacheHooked(ctx)
		if err != nil {
			return false, rulesError("read the cache's table inet "+rules.NFTablesTable, err)
		}
		return ok, nil
	}
	for _, fam := range g.fams {
		has, err := g.rules.HasJumps(ctx, rules.NodeCache(fam, rules.NodeCacheSpec{}))
		if err != nil {
			return false, rulesError(fmt.Sprintf("read the cache's %s jumps", fam), err)
		}
		if has {
			return true, nil
		}
	}
	return false, nil
}

func (g *Guard) divertPresentLocked(ctx context.Context) (bool, error) {
	if err := g.ensureBackendLocked(ctx); err != nil {
		if errors.Is(err, errBackendPending) {
			return false, nil
		}
		return false, err
	}
	if g.nft != nil {
		ok, err := g.nft.TableExists(ctx, rules.NFTablesGuardTable)
		if err != nil {
			return false, rulesError("look for the divert (table inet "+rules.NFTablesGuardTable+")", err)
		}
		return ok, nil
	}
	for _, fam := range g.fams {
		ok, err := g.rules.ChainExists(ctx, fam, rules.NAT, rules.GuardChain)
		if err != nil {
			return false, rulesError(fmt.Sprintf("look for the %s divert", fam), err)
		}
		if ok {
			return true, nil
		}
	}
	return false, nil
}

// errNoBackend marks a backend that cannot be selected: the guard cannot work at all.
var errNoBackend = errors.New("no rules backend")

// errBackendPending marks an automatic selection that found neither the cache's rules nor kube-proxy's:
// the guard looks again next time, and until then the cache has nothing to fail open.
var errBackendPending = errors.New("no rules of the cache or of kube-proxy on the node yet")

// ensureBackendLocked picks the backend. Configured, it is that one. With auto it is where the cache's
// rules are, which is what matters to the guard: the nftables tables, then the iptables chains of the
// backend kube-proxy's rules point to; with neither there yet, it decides later.
func (g *Guard) ensureBackendLocked(ctx context.Context) error {
	if g.rules != nil {
		return nil
	}
	mode, err := rules.ParseMode(g.cfg.Backend)
	if err != nil {
		return configError("select rules backend", fmt.Errorf("%w: %w", errNoBackend, err))
	}
	var b *rules.Backend
	if mode == rules.Auto {
		b, err = g.locateCacheLocked(ctx)
	} else {
		b, err = rules.Select(ctx, mode)
	}
	if errors.Is(err, errBackendPending) {
		return err
	}
	if err != nil {
		return rulesError("select rules backend", fmt.Errorf("%w: %w", errNoBackend, err))
	}
	g.log.Infof("nodelocal guard: using rules backend %s (%s)", b.Mode, b.Reason)
	g.rules = rules.NewManager(b, rules.ManagerOptions{LockWait: g.cfg.LockWait})
	if b.Mode == rules.NFTables {
		g.nft = rules.NewNFTablesManager()
	}
	return nil
}

// locateCacheLocked finds the backend that holds the cache's rules: the cache and the guard each select
// one, and they must agree even when they start at different times.
func (g *Guard) locateCacheLocked(ctx context.Context) (*rules.Backend, error) {
	nft := rules.NewNFTablesManager()
	for _, table := range []string{rules.NFTablesTable, rules.NFTablesGuardTable} {
		ok, err := nft.TableExists(ctx, table)
		if err != nil && !rules.NFTablesUnsupported(err) {
			return nil, err
		}
		if ok {
			return rules.NewBackend(rules.NFTables, "the cache's table inet "+table+" is there")
		}
	}
	b, err := rules.Select(ctx, rules.Auto)
	var none *rules.NoKubeProxyRulesError
	if !errors.As(err, &none) {
		return b, err
	}
	if none.Fallback == rules.NFTables {
		return nil, fmt.Errorf("%w (%v)", errBackendPending, none)
	}
	// No kube-proxy rules, but the cache may have fallen back to the iptables flavour the node suggests.
	m := rules.NewManager(none.Backend, rules.ManagerOptions{LockWait: g.cfg.LockWait})
	for _, fam := range g.fams {
		if _, terr := none.Backend.Tools(fam); terr != nil {
			continue
		}
		ok, err := m.ChainExists(ctx, fam, rules.Raw, rules.DefaultChain)
		if err != nil {
			return nil, err
		}
		if ok {
			none.Backend.Reason = "the cache's chains are there; " + none.Reason
			return none.Backend, nil
		}
	}
	return nil, fmt.Errorf("%w (%v)", errBackendPending, none)
}
