package notrack

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/plugin/pkg/reuseport"

	"github.com/nodelocaldns/nodelocaldns/nodelocal"
	"github.com/nodelocaldns/nodelocaldns/nodelocal/link"
)

// Bounds of the calls that change the node.
const (
	// acquireTimeout bounds putting a Corefile's addresses in place at its start.
	acquireTimeout = 30 * time.Second
	// enableTimeout bounds putting the rules in place once the server answers.
	enableTimeout = 30 * time.Second
	// reclaimProbeTimeout bounds one round of probes that decides whether to take the node back from the
	// fail-open guard.
	reclaimProbeTimeout = 2 * time.Second
	// releaseTimeout bounds dropping what a replaced Corefile alone claimed.
	releaseTimeout = 10 * time.Second
	// teardownTimeout bounds the final teardown of rules, addresses and link; linkTeardownTimeout is added
	// for the link alone when the rules used it all up.
	teardownTimeout     = 4 * time.Second
	linkTeardownTimeout = time.Second
)

// processStart approximates when the process started: package initialisation runs first thing.
var processStart = time.Now()

// theNode is the process's one view of the node. CoreDNS sets a plugin up once per server block and again
// on every reload, but the link, the rules and the node lock belong to the process: the server blocks and
// the successive Corefiles share one Reconciler, as CoreDNS plugins share listeners across reloads.
var theNode = &node{}

type node struct {
	mu sync.Mutex
	// settings are those of the newest live instance.
	settings nodeSettings
	rec      *nodelocal.Reconciler
	leases   map[claimKey]*sharedLease
	// live are the started instances: one, or two while a reload hands over.
	live map[*instance]struct{}
	seq  uint64
	// stopRepair ends the repair loop, which runs every repairEvery.
	stopRepair  context.CancelFunc
	repairEvery time.Duration
	rulesLogged bool

	// life is the context of everything that works on the Reconciler in the background (probes, repairs).
	// It has its own lock so that a final shutdown can end that work before it waits for mu.
	lifeMu  sync.Mutex
	life    context.Context
	endLife context.CancelFunc

	probe probeRules

	handoff handoffState
}

type sharedLease struct {
	lease *nodelocal.Lease
	// refs counts the live instances that claim it.
	refs int
	// rules is set once the lease's rules are wanted: at once, or when the server answered.
	rules bool
}

func (n *node) lifeContext() context.Context {
	n.lifeMu.Lock()
	defer n.lifeMu.Unlock()
	if n.life == nil {
		n.life, n.endLife = context.WithCancel(context.Background())
	}
	return n.life
}

func (n *node) stopLife() {
	n.lifeMu.Lock()
	defer n.lifeMu.Unlock()
	if n.endLife != nil {
		n.endLife()
	}
	n.life, n.endLife = nil, nil
}

// start puts an instance's addresses in place before CoreDNS, health or ready listen on them; the rules
// follow once the server answers (see probeAndEnable). On the first start it also checks that every listen
// address is free, since a listener that fails to open ends the process with no shutdown callback to
// remove the link.
func (n *node) start(in *instance) error {
	life := n.lifeContext()
	n.mu.Lock()
	defer n.mu.Unlock()
	first := len(n.live) == 0
	if !first {
		if err := n.settings.restartNeeded(in.settings); err != nil {
			return err
		}
	}
	if n.live == nil {
		n.live = map[*instance]struct{}{}
	}
	in.ctx, in.cancel = context.WithCancel(life)
	n.seq++
	in.seq = n.seq
	if in.settings.managesNothing() {
		n.settings = in.settings
		n.live[in] = struct{}{}
		log.Infof("no_interface and no_rules: leaving the addresses and the rules to others")
		return nil
	}
	if n.handoff.successor != nil || n.handoff.handedOff {
		// A reload while the node changes hands: the owner's leases are taken over as a whole (succeed,
		// retakeIfOrphaned), or not at all.
		n.live[in] = struct{}{}
		n.settings = in.settings
		return nil
	}
	if n.rec == nil {
		rec, err := nodelocal.New(in.settings.reconcilerConfig())
		if err != nil && first && nodelocal.KindOf(err) == nodelocal.KindNodeLock {
			return n.startAsSuccessor(in, err)
		}
		if err != nil {
			countSetupError(err)
			return fmt.Errorf("set up the node: %w", err)
		}
		n.rec = rec
		n.leases = map[claimKey]*sharedLease{}
	}

	ctx, cancel := context.WithTimeout(in.ctx, acquireTimeout)
	defer cancel()
	taken, err := n.acquire(ctx, in)
	if err == nil && first {
		err = checkListen(in.listenAddrs())
	}
	if err != nil {
		in.cancel()
		if first {
			n.abandon()
		} else {
			n.drop(taken)
		}
		return err
	}

	n.live[in] = struct{}{}
	n.settings = in.settings
	n.ensureRepairLoop(life)
	if first {
		n.watchSuccessor(life)
	}
	n.updateGauges()
	if n.settings.NoRules {
		return nil
	}
	go n.probeAndEnable(in)
	return nil
}

// acquire takes a reference on every lease the instance claims, acquiring those nobody holds yet. A new
// lease defers its rules until the server answers, unless rules for its address and port are in place
// already: then the server answering there is this process, whose listener a reload hands over. It returns
// the keys it took a reference on.
func (n *node) acquire(ctx context.Context, in *instance) ([]claimKey, error) {
	var taken []claimKey
	for _, k := range in.keys() {
		if sl, ok := n.leases[k]; ok {
			sl.refs++
			taken = append(taken, k)
			continue
		}
		deferRules := !in.settings.NoRules && !n.rulesServe(k.endpoint)
		lease, err := n.rec.Acquire(ctx, k.claim(deferRules))
		if err != nil {
			countSetupError(err)
			return taken, fmt.Errorf("put %s in place: %w", k, err)
		}
		n.leases[k] = &sharedLease{lease: lease, refs: 1, rules: !deferRules}
		taken = append(taken, k)
	}
	return taken, nil
}

func (n *node) rulesServe(e endpoint) bool {
	for k, sl := range n.leases {
		if k.endpoint == e && sl.rules {
			return true
		}
	}
	return false
}

// drop gives up references and releases the leases nobody references any more.
func (n *node) drop(keys []claimKey) {
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	for _, k := range keys {
		sl := n.leases[k]
		if sl == nil {
			continue
		}
		if sl.refs--; sl.refs > 0 {
			continue
		}
		delete(n.leases, k)
		if err := sl.lease.Release(ctx); err != nil {
			countSetupError(err)
			log.Errorf("release %s: %v", k, err)
		}
	}
	n.updateGauges()
}

// abandon undoes a first start that failed: everything goes, whatever skip_teardown says, since nothing
// ever served on it.
func (n *node) abandon() {
	ctx, cancel := context.WithTimeout(context.Background(), teardownTimeout)
	defer cancel()
	if err := n.rec.Teardown(ctx); err != nil {
		log.Errorf("undo the failed start: %v", err)
	}
	n.closeLocked()
}

// closeLocked drops the Reconciler (and with it the node lock) and resets the node for a later start.
func (n *node) closeLocked() {
	if n.stopRepair != nil {
		n.stopRepair()
		n.stopRepair = nil
	}
	if err := n.rec.Close(); err != nil {
		log.Errorf("release the node lock: %v", err)
	}
	n.rec = nil
	n.leases = nil
	rulesInPlace.Set(0)
	addressesInPlace.Set(0)
}

// stop ends an instance. During a reload, with the new instance started, it drops what only the old
// instance claimed. When no instance is left, it is the final shutdown.
func (n *node) stop(in *instance) error {
	n.mu.Lock()
	if _, ok := n.live[in]; !ok {
		n.mu.Unlock()
		return nil
	}
	delete(n.live, in)
	if len(n.live) == 0 {
		n.mu.Unlock()
		return n.finalShutdown("shutdown")
	}
	defer n.mu.Unlock()
	if n.rec != nil {
		n.drop(in.keys())
	}
	return nil
}

// restartFailed runs in the old instance when a reload failed: instances started after it never served,
// so what only they claimed goes, and the old instance's settings apply again.
func (n *node) restartFailed(in *instance) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	for other := range n.live {
		if other.seq <= in.seq {
			continue
		}
		other.cancel()
		delete(n.live, other)
		if n.rec != nil {
			n.drop(other.keys())
		}
	}
	if _, ok := n.live[in]; ok {
		n.settings = in.settings
		if n.rec != nil {
			n.ensureRepairLoop(n.lifeContext())
		}
	}
	return nil
}

// finalShutdown removes the rules, then the addresses and the link (unless skip_teardown), within
// teardownTimeout plus linkTeardownTimeout whatever else is shutting down. It runs from the first of: the
// shutdown event (emitted before any shutdown callback), the last instance's OnShutdown, OnFinalShutdown.
func (n *node) finalShutdown(reason string) error {
	n.stopLife() // ends probes and repairs, killing any iptables they run, so that mu is free soon
	n.mu.Lock()
	defer n.mu.Unlock()
	for in := range n.live {
		in.cancel()
	}
	endpoints := n.liveEndpoints()
	clear(n.live)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), teardownTimeout)
	defer cancel()
	var errs []error
	if n.probe.active() {
		errs = append(errs, n.probe.removeAll(ctx))
	}
	if n.leaveToSuccessor(ctx, reason, endpoints) {
		return errors.Join(errs...)
	}
	if n.rec == nil {
		return errors.Join(errs...)
	}
	name := n.settings.Interface
	if h, ok := n.settings.handoverConfig(); ok && !n.settings.NoRules && n.handOverAtExit(reason, h, endpoints) {
		n.closeLocked()
		n.rulesLogged = false
		return errors.Join(errs...)
	}
	if n.settings.SkipTeardown {
		log.Infof("%s: skip_teardown: leaving the rules and the addresses on %s in place", reason, name)
		if err := errors.Join(errs...); err != nil {
			log.Errorf("%s: %v", reason, err)
		}
	} else {
		err := n.rec.Teardown(ctx)
		if err != nil {
			countSetupError(err)
			errs = append(errs, err)
			if !n.settings.NoInterface && ctx.Err() != nil {
				// The rules took the whole deadline; the link still goes, so that it does not attract
				// traffic nobody serves.
				lctx, lcancel := context.WithTimeout(context.Background(), linkTeardownTimeout)
				if m, lerr := link.New(link.Options{Name: name}); lerr == nil {
					errs = append(errs, m.Teardown(lctx))
				}
				lcancel()
			}
		}
		if err := errors.Join(errs...); err != nil {
			log.Errorf("%s: teardown incomplete after %v: %v", reason, time.Since(start).Round(time.Millisecond), err)
		} else {
			log.Infof("%s: removed the rules and the addresses on %s in %v", reason, name, time.Since(start).Round(time.Millisecond))
		}
	}
	n.closeLocked()
	n.rulesLogged = false
	return errors.Join(errs...)
}

// ensureRepairLoop runs the periodic repair, once per process, at the interval of the newest Corefile.
func (n *node) ensureRepairLoop(life context.Context) {
	if n.stopRepair != nil && n.repairEvery == n.settings.Sync {
		return
	}
	if n.stopRepair != nil {
		n.stopRepair()
	}
	ctx, stop := context.WithCancel(life)
	n.stopRepair, n.repairEvery = stop, n.settings.Sync
	go n.repair(ctx, n.rec, n.settings.Sync)
}

// repair calls Ensure every interval, measures it, counts and logs failures (when they change) and
// recovery. It is the Reconciler's Run plus metrics.
func (n *node) repair(ctx context.Context, rec *nodelocal.Reconciler, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	last := ""
	var answering time.Time // since when the server has answered its probes while the guard had failed it open
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		start := time.Now()
		err := rec.Ensure(ctx)
		if ctx.Err() != nil || errors.Is(err, nodelocal.ErrClosed) {
			return
		}
		syncDuration.Observe(time.Since(start).Seconds())
		countSetupError(err)
		switch {
		case err != nil && err.Error() != last:
			log.Errorf("sync failed, retrying every %v: %v", every, err)
			last = err.Error()
		case err == nil && last != "":
			log.Infof("sync succeeded again")
			last = ""
		}
		if err == nil && rec.Status().GuardFailedOpen {
			answering = n.reclaimIfAnswering(ctx, rec, every, answering)
		} else {
			answering = time.Time{}
		}
		n.mu.Lock()
		if n.rec == rec {
			n.updateGauges()
		}
		n.mu.Unlock()
	}
}

// reclaimIfAnswering takes the node back from the fail-open guard once this server has answered its own
// probe on every address whose rules are wanted, in every repair round for at least one repair interval: a
// cache that hung and recovered without a restart. One answer after a hang is not yet a cache worth sending
// Pods to, and a ticker that was frozen with the process fires twice at once, so the rounds alone do not
// measure time. Ensure alone leaves the guard's divert in place, since a repair loop can run while the
// server does not answer. It takes and returns since when the server has answered (zero: it does not).
func (n *node) reclaimIfAnswering(ctx context.Context, rec *nodelocal.Reconciler, every time.Duration, answering time.Time) time.Time {
	n.mu.Lock()
	var targets []probeTarget
	for in := range n.live {
		names := in.probeNames()
		for _, k := range in.keys() {
			if sl := n.leases[k]; sl != nil && sl.rules {
				targets = append(targets, probeTarget{k.endpoint, names[k.endpoint]})
			}
		}
	}
	mode := n.settings.Backend
	n.mu.Unlock()
	if len(targets) == 0 {
		return time.Time{}
	}
	slices.SortFunc(targets, func(a, b probeTarget) int { return strings.Compare(a.String(), b.String()) })
	targets = slices.CompactFunc(targets, func(a, b probeTarget) bool { return a.endpoint == b.endpoint })

	probeCtx, cancel := context.WithTimeout(ctx, min(every, reclaimProbeTimeout))
	defer cancel()
	if err := n.probe.acquire(probeCtx, mode, targetFamilies(targets)); err != nil {
		log.Warningf("could not exempt probes from connection tracking to check whether to take the node back from the fail-open guard: %v", err)
		return time.Time{}
	}
	err := probeAll(probeCtx, targets)
	n.probe.release()
	if err != nil {
		return time.Time{}
	}
	if answering.IsZero() {
		return time.Now()
	}
	if time.Since(answering) < every {
		return answering
	}
	if err := rec.Reclaim(ctx); err != nil {
		countSetupError(err)
		log.Errorf("this server answers again on %s, but taking the node back from the fail-open guard failed: %v", targetList(targets), err)
		return time.Time{}
	}
	log.Infof("this server answers again on %s: took the node back from the fail-open guard", targetList(targets))
	return time.Time{}
}

func (n *node) updateGauges() {
	if n.rec == nil {
		return
	}
	st := n.rec.Status()
	rulesInPlace.Set(boolValue(!n.settings.NoRules && st.RulesPresent && n.allRulesWanted()))
	if n.settings.NoInterface {
		return
	}
	have := true
	for k := range n.leases {
		have = have && slices.Contains(st.Addresses, k.addr)
	}
	addressesInPlace.Set(boolValue(have && len(n.leases) > 0))
}

func (n *node) allRulesWanted() bool {
	for _, sl := range n.leases {
		if !sl.rules {
			return false
		}
	}
	return len(n.leases) > 0
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// ready reports whether the block's rules are in place (or left to others) and the last sync succeeded.
func (n *node) ready(b *block) bool {
	if n.handoff.successorQueued.Load() {
		return false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.live) == 0 {
		return false
	}
	if n.settings.managesNothing() {
		return true
	}
	if n.rec == nil {
		return false
	}
	for _, a := range b.addrs {
		found := false
		for k, sl := range n.leases {
			if k.endpoint == (endpoint{a, b.port}) {
				found = true
				if !sl.rules {
					return false
				}
			}
		}
		if !found {
			return false
		}
	}
	st := n.rec.Status()
	return st.LastError == nil && (n.settings.NoRules || st.RulesPresent)
}

// probeAndEnable waits until the server answers on every address of the instance whose rules wait for
// it, then puts the rules in place. It ends with the instance.
func (n *node) probeAndEnable(in *instance) {
	names := in.probeNames()
	n.mu.Lock()
	var targets []probeTarget
	for _, k := range in.keys() {
		if sl := n.leases[k]; sl != nil && !sl.rules {
			targets = append(targets, probeTarget{k.endpoint, names[k.endpoint]})
		}
	}
	mode := n.settings.Backend
	n.mu.Unlock()
	if len(targets) == 0 {
		return
	}
	slices.SortFunc(targets, func(a, b probeTarget) int { return strings.Compare(a.String(), b.String()) })
	targets = slices.CompactFunc(targets, func(a, b probeTarget) bool { return a.endpoint == b.endpoint })

	start := time.Now()
	// kube-proxy DNATs host traffic to the kube-dns ClusterIP as it does Pod traffic; without the probe
	// rule the probe of that address would reach kube-dns, not us.
	if err := n.probe.acquire(in.ctx, mode, targetFamilies(targets)); err != nil {
		if in.ctx.Err() != nil {
			return
		}
		SetupErrors.WithLabelValues(string(nodelocal.KindIPTables)).Inc()
		log.Warningf("could not exempt probes from connection tracking; addresses that kube-proxy DNATs will not answer them: %v", err)
	}
	err := probeAll(in.ctx, targets)
	n.probe.release()
	if err != nil {
		return // the instance ended
	}
	answered := time.Since(start)

	n.mu.Lock()
	var todo []*sharedLease
	for _, k := range in.keys() {
		if sl := n.leases[k]; sl != nil && !sl.rules {
			todo = append(todo, sl)
		}
	}
	n.mu.Unlock()
	ctx, cancel := context.WithTimeout(in.ctx, enableTimeout)
	defer cancel()
	var errs []error
	for _, sl := range todo {
		err := sl.lease.EnableRules(ctx)
		switch {
		case errors.Is(err, nodelocal.ErrReleased), errors.Is(err, nodelocal.ErrClosed), in.ctx.Err() != nil:
			continue
		case err != nil:
			// The rules stay wanted and the repair loop retries them.
			countSetupError(err)
			errs = append(errs, err)
		}
		n.mu.Lock()
		sl.rules = true
		n.mu.Unlock()
	}
	if in.ctx.Err() != nil {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.updateGauges()
	addrs := targetList(targets)
	if err := errors.Join(errs...); err != nil {
		log.Errorf("server answers on %s, but the rules are not in place yet (retrying every %v): %v", addrs, n.settings.Sync, err)
		return
	}
	if !n.rulesLogged {
		n.rulesLogged = true
		log.Infof("rules in place for %s %v after process start (the server answered after %v)",
			addrs, time.Since(processStart).Round(time.Millisecond), answered.Round(time.Microsecond))
		return
	}
	log.Infof("rules in place for %s (the server answered after %v)", addrs, answered.Round(time.Microsecond))
}

func targetFamilies(targets []probeTarget) []netip.Addr {
	addrs := make([]netip.Addr, len(targets))
	for i, t := range targets {
		addrs[i] = t.addr
	}
	return addrs
}

func targetList(targets []probeTarget) string {
	s := make([]string, len(targets))
	for i, t := range targets {
		s[i] = t.endpoint.String()
	}
	return strings.Join(s, ", ")
}

// checkListen opens and closes every DNS listen address the way CoreDNS will (SO_REUSEPORT, UDP and TCP),
// and every extra TCP port on the claimed addresses (health, ready), so that a start whose listeners
// cannot open fails while notrack can still undo what it did: caddy ends a first start that fails later
// without any shutdown callback.
func checkListen(dns, tcp []string) error {
	for _, a := range tcp {
		// With SO_REUSEPORT, as health, ready and prometheus listen: a successor listens beside its owner.
		l, err := reuseport.Listen("tcp", a)
		if err != nil {
			return fmt.Errorf("cannot listen on %s/tcp: %w", a, err)
		}
		l.Close()
	}
	for _, a := range dns {
		pc, err := reuseport.ListenPacket("udp", a)
		if err != nil {
			return fmt.Errorf("cannot listen on %s/udp: %w", a, err)
		}
		pc.Close()
		l, err := reuseport.Listen("tcp", a)
		if err != nil {
			return fmt.Errorf("cannot listen on %s/tcp: %w", a, err)
		}
		l.Close()
	}
	return nil
}

// hookName names notrack's caddy event hook.
const hookName = "notrack"

// registerShutdownHook makes the shutdown event (SIGTERM, SIGINT) tear the node down before any shutdown
// callback runs, so that a plugin whose callback hangs cannot keep the rules in place. A SIGUSR1 reload
// drops every hook, so each start registers it again; caddy panics when a name is registered twice, which
// is how a hook still in place shows.
func registerShutdownHook() {
	defer func() {
		if r := recover(); r != nil {
			if s, ok := r.(string); ok && strings.Contains(s, "already registered") {
				return
			}
			panic(r)
		}
	}()
	caddy.RegisterEventHook(hookName, func(event caddy.EventName, info any) error {
		if event != caddy.ShutdownEvent {
			return nil
		}
		return theNode.finalShutdown(fmt.Sprint(info))
	})
}
