//go:build linux

package notrack

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nodelocaldns/nodelocaldns/nodelocal"
	"github.com/nodelocaldns/nodelocaldns/nodelocal/drain"
	"github.com/nodelocaldns/nodelocaldns/nodelocal/nodelock"
)

// A node changes hands without a moment in which nobody answers (see nodelocal's Queue and HandOver):
//
//   - Started while another process owns the node, this process queues as its successor instead of
//     failing: it touches nothing on the node, serves beside the owner on the same addresses
//     (SO_REUSEPORT), and once it answers there it says so and waits for the owner to let go. Then it
//     owns the node, steers new UDP packets to its own sockets and lets closing TCP listeners hand their
//     accept queues over, so that the old process's sockets only empty.
//   - The owner watches for a ready successor and lets go at once, leaving link, addresses and rules in
//     place. It keeps answering what reaches it; told to stop, it waits until its sockets are idle and
//     tears nothing down.
//   - Told to stop with no successor, and with `handover`, the owner hands the node to the cluster DNS
//     instead of tearing it down, waits until its sockets are idle, and leaves the rest for the next start,
//     which takes the node back once it answers.

// Bounds and pauses of a hand-off.
const (
	// successorPoll is how often the owner looks for a ready successor.
	successorPoll = 100 * time.Millisecond
	// orphanPoll is how often a process that let go checks that its successor took the node.
	orphanPoll = 500 * time.Millisecond
	// drainTimeout bounds the wait for this process's sockets to empty at exit; drainQuietChecks checks
	// drainCheckEvery apart must find them idle in a row.
	drainTimeout     = 5 * time.Second
	drainQuietChecks = 3
	drainCheckEvery  = 20 * time.Millisecond
	// steerProbes probes, each from a source port of its own, must all reach this process for the steering
	// of a UDP group to count as working.
	steerProbes = 8
	// unsteerTimeout bounds the wait for the old process's sockets to leave the groups.
	unsteerTimeout = 10 * time.Minute
)

// handoffState is the node's part in a hand-off. Its fields are guarded by node.mu, inflight aside.
type handoffState struct {
	// successor is set while this process waits to take the node over.
	successor *nodelocal.Successor
	// successorOf names the owner it waits for, or took the node from.
	successorOf string
	// handedOff is set once this process let a successor take the node.
	handedOff bool
	// stopWatch ends the watch for a successor (or, after a hand-off, for an orphaned node).
	stopWatch context.CancelFunc
	// inflight counts the queries the plugin chains are answering.
	inflight atomic.Int64
	// successorQueued is set while a successor waits to take the node: this process then reports not
	// ready, so that a readiness probe of the successor's Pod, which the shared listeners may hand to this
	// process, cannot say ready before the successor owns the node.
	successorQueued atomic.Bool
}

// startAsSuccessor starts an instance while another process owns the node (New failed with lockErr):
// it queues to take the node over, checks that the owner's link holds its addresses, and probes its own
// server in the background until it can say it is ready. n.mu is held; it is the process's first start.
func (n *node) startAsSuccessor(in *instance, lockErr error) error {
	q, err := nodelocal.Queue(in.settings.reconcilerConfig())
	if err != nil {
		countSetupError(err)
		return fmt.Errorf("set up the node: %w; and it cannot wait to take the node over: %w", lockErr, err)
	}
	if err := servesWhatTheOwnerServes(q, in.keys()); err != nil {
		q.Close()
		countSetupError(err)
		return fmt.Errorf("%w; and this instance cannot take the node over: %w", lockErr, err)
	}
	if err := addressesOnNode(in.keys()); err != nil {
		q.Close()
		countSetupError(err)
		return fmt.Errorf("cannot take the node over from %s: %w", q.Owner(), err)
	}
	// No checkListen here: a socket opened and closed in the owner's live reuseport group drops the queries
	// hashed to it meanwhile (UDP) and resets the connections (TCP). A successor has changed nothing it would
	// have to undo, and one whose listeners cannot open never answers, so it never takes the node.
	n.handoff.successor, n.handoff.successorOf = q, q.Owner()
	n.live[in] = struct{}{}
	n.settings = in.settings
	log.Infof("another instance owns this node (%s): serving beside it, and taking the node over once this server answers", q.Owner())
	go n.succeed(in, q)
	return nil
}

// servesWhatTheOwnerServes checks that the instance serves every address and DNS port the owner's rules
// cover: an instance that does not (a stray copy on another port, say) must not take the node.
func servesWhatTheOwnerServes(q *nodelocal.Successor, keys []claimKey) error {
	ctx, cancel := context.WithTimeout(context.Background(), acquireTimeout)
	defer cancel()
	owner, err := q.OwnerEndpoints(ctx)
	if err != nil {
		return err
	}
	var missing []string
	for _, e := range owner {
		if !slices.ContainsFunc(keys, func(k claimKey) bool { return k.addr == e.Addr() && k.port == e.Port() }) {
			missing = append(missing, e.String())
		}
	}
	if len(missing) > 0 {
		return &nodelocal.Error{Kind: nodelocal.KindConfig, Op: "compare with the owner",
			Err: fmt.Errorf("the owner serves %s, which this instance does not: a successor serves at least what its owner serves", strings.Join(missing, ", "))}
	}
	return nil
}

// addressesOnNode checks that every claimed address is an address of the node already: a successor
// changes nothing before it owns the node, and its listeners need them.
func addressesOnNode(keys []claimKey) error {
	ctx, cancel := context.WithTimeout(context.Background(), acquireTimeout)
	defer cancel()
	have, err := nodelocal.NodeAddresses(ctx)
	if err != nil {
		return err
	}
	var missing []string
	for _, k := range keys {
		if !slices.Contains(have, k.addr) {
			missing = append(missing, k.addr.String())
		}
	}
	if len(missing) > 0 {
		return &nodelocal.Error{Kind: nodelocal.KindConfig, Op: "check the owner's addresses",
			Err: fmt.Errorf("%s not on the node (the owner serves other addresses, or has failed open)", strings.Join(slices.Compact(missing), ", "))}
	}
	return nil
}

// succeed waits until this server answers on every address, tells the owner, takes the node over and
// steers new traffic to this process. While it waits it tries the node lock every HandoffPoll: an owner
// that stops before this server answers (a SIGTERM, an eviction, the DaemonSet controller deleting a Pod
// that said it was not ready) hands the node to the cluster DNS on its way out, and this process's
// probes, which a successor sends without the probe exemption, would then be answered through the divert
// forever. So the lock it finds free makes it the owner at once, which starts as any owner does (see
// ownBeforeAnswering). It ends with the instance.
func (n *node) succeed(in *instance, q *nodelocal.Successor) {
	targets := in.probeTargets()
	probeCtx, stopProbes := context.WithCancel(in.ctx)
	defer stopProbes()
	answered := make(chan error, 1)
	go func() { answered <- probeAll(probeCtx, targets) }()
	poll := time.NewTicker(nodelocal.HandoffPoll)
	defer poll.Stop()
	ready := false
	for {
		select {
		case <-in.ctx.Done():
			return // shutdown leaves the queue
		case err := <-answered:
			if err != nil {
				return // the instance ended
			}
			if err := q.Ready(); err != nil {
				countSetupError(err)
				log.Errorf("this server answers on %s, but it could not tell the owner: %v", targetList(targets), err)
				return
			}
			ready = true
			log.Infof("this server answers on %s: waiting for %s to hand the node over", targetList(targets), q.Owner())
		case <-poll.C:
		}
		rec, err := q.TryTake()
		if err != nil {
			countSetupError(err)
			log.Errorf("waiting to take the node over from %s: %v", q.Owner(), err)
			continue
		}
		if rec == nil {
			continue
		}
		stopProbes()
		if ready {
			n.takeOver(in, q, rec)
		} else {
			n.ownBeforeAnswering(q, rec)
		}
		return
	}
}

// takeOver makes this process, whose server answers, the owner of the node its owner handed over: new UDP
// packets are steered to this process first, then the leases of every live instance are acquired with
// their rules at once. Readiness follows the leases, so a rollout stops the old process only once nothing
// new reaches it any more; stopped earlier, it would close sockets that the kernel still hashes new packets
// to.
func (n *node) takeOver(in *instance, q *nodelocal.Successor, rec *nodelocal.Reconciler) {
	life := n.lifeContext()
	n.mu.Lock()
	if !n.adoptLocked(q, rec) {
		n.mu.Unlock()
		return
	}
	migrateState := n.settings.Lock + ".tcp_migrate_req"
	n.mu.Unlock()
	n.steerToThisProcess(life, in, migrateState)
	n.mu.Lock()
	if n.rec != rec {
		n.mu.Unlock()
		return // shut down meanwhile
	}
	err := n.acquireAnswering(in.ctx)
	n.runOwnerLoopsLocked(life)
	n.updateGauges()
	n.mu.Unlock()
	if err != nil {
		log.Errorf("took the node over from %s, but not everything is in place yet (retrying every %v): %v", n.handoff.successorOf, n.settings.Sync, err)
	} else {
		log.Infof("took the node over from %s", n.handoff.successorOf)
	}
}

// adoptLocked makes rec, which the successor q took, this process's Reconciler, with no leases yet, and
// ends the wait in line. It returns false, closing rec, when q is no longer the process's successor (the
// instance stopped meanwhile). n.mu is held.
func (n *node) adoptLocked(q *nodelocal.Successor, rec *nodelocal.Reconciler) bool {
	if n.handoff.successor != q {
		rec.Close()
		return false
	}
	n.handoff.successor = nil
	q.Close()
	n.rec, n.leases = rec, map[claimKey]*sharedLease{}
	return true
}

// runOwnerLoopsLocked starts what an owner runs for as long as it owns the node: the repair loop and the
// watch for a ready successor. n.mu is held.
func (n *node) runOwnerLoopsLocked(life context.Context) {
	n.ensureRepairLoop(life)
	n.watchSuccessor(life)
}

// ownBeforeAnswering makes this process the owner of a node its owner let go of before this server
// answered: it starts as an owner does (the addresses of every live instance now, their rules, which
// take the node back from the cluster DNS the owner handed it to, once the server answers its probes,
// which as the owner it sends with the probe exemption). Until then the node is the cluster DNS's, and the
// probes say why the rules wait. Nothing is steered: the old owner's sockets are drained and closing.
func (n *node) ownBeforeAnswering(q *nodelocal.Successor, rec *nodelocal.Reconciler) {
	life := n.lifeContext()
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.adoptLocked(q, rec) {
		return
	}
	var errs []error
	for in := range n.live {
		ctx, cancel := context.WithTimeout(in.ctx, acquireTimeout)
		_, err := n.acquire(ctx, in)
		cancel()
		errs = append(errs, err)
	}
	n.runOwnerLoopsLocked(life)
	n.updateGauges()
	if err := errors.Join(errs...); err != nil {
		log.Errorf("%s stopped before this server answered, and taking the node over is not complete yet (retrying every %v): %v", n.handoff.successorOf, n.settings.Sync, err)
	} else {
		log.Infof("%s stopped before this server answered: took the node over; its rules follow once this server answers", n.handoff.successorOf)
	}
	if n.settings.NoRules {
		return
	}
	for in := range n.live {
		go n.probeAndEnable(in)
	}
}

// acquireAnswering acquires the leases of every live instance, with their rules, in one sync: this server
// answers on their addresses. n.mu is held.
func (n *node) acquireAnswering(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, acquireTimeout)
	defer cancel()
	var keys []claimKey
	for in := range n.live {
		keys = append(keys, in.keys()...)
	}
	claims := make([]nodelocal.Claim, 0, len(keys))
	var unique []claimKey
	for _, k := range keys {
		if sl, ok := n.leases[k]; ok {
			sl.refs++
			continue
		}
		if i := slices.Index(unique, k); i >= 0 {
			continue
		}
		unique = append(unique, k)
		claims = append(claims, k.claim(false))
	}
	leases, err := n.rec.AcquireAll(ctx, claims)
	for i, l := range leases {
		n.leases[unique[i]] = &sharedLease{lease: l, rules: true}
	}
	for _, k := range keys {
		if sl := n.leases[k]; sl != nil && slices.Contains(unique, k) {
			sl.refs++
		}
	}
	if err != nil {
		countSetupError(err)
	}
	return err
}

// probeTargets returns every endpoint of the instance with its probe name, sorted.
func (in *instance) probeTargets() []probeTarget {
	names := in.probeNames()
	keys := in.keys()
	targets := make([]probeTarget, 0, len(keys))
	for _, k := range keys {
		targets = append(targets, probeTarget{k.endpoint, names[k.endpoint]})
	}
	slices.SortFunc(targets, func(a, b probeTarget) int { return strings.Compare(a.String(), b.String()) })
	return slices.CompactFunc(targets, func(a, b probeTarget) bool { return a.endpoint == b.endpoint })
}

// steerToThisProcess sends every new UDP packet for the instance's endpoints to this process's sockets
// (drain.TakeOver, which wirecache's fast path then leaves alone), checks that it works, and lets the old
// process's TCP listeners hand their accept queues over when they close. Once the old sockets have left
// the groups it ends the takeover and puts net.ipv4.tcp_migrate_req back as the node had it (the value
// before is kept in migrateState, for the successor that ends a chain of them).
func (n *node) steerToThisProcess(life context.Context, in *instance, migrateState string) {
	restore, err := drain.MigrateListeners(migrateState)
	if err != nil {
		log.Warningf("TCP connections that wait in the old instance's accept queue will be reset when it stops: %v", err)
	} else if restore != nil {
		log.Infof("set net.ipv4.tcp_migrate_req to 1 until the old instance has stopped: a closing TCP listener hands its waiting connections to this one")
	}
	var steered []probeTarget
	for _, t := range in.probeTargets() {
		local := netip.AddrPortFrom(t.addr, t.port)
		size, err := drain.TakeOver(local)
		if err != nil {
			log.Warningf("lookups queued at the old instance on %s may be lost when it stops: %v", local, err)
			continue
		}
		if !drain.TakingOver(local) || size < 2 {
			_ = drain.EndTakeOver(local) // nobody else is there any more
			continue
		}
		if err := probeEach(life, t, steerProbes); err != nil {
			_ = drain.EndTakeOver(local)
			log.Warningf("could not steer new lookups on %s to this instance (%v); lookups queued at the old instance may be lost when it stops", local, err)
			continue
		}
		steered = append(steered, t)
	}
	if len(steered) > 0 {
		log.Infof("steering new lookups on %s to this instance until the old one has stopped", targetList(steered))
	}
	if len(steered) > 0 || restore != nil {
		go n.endTakeOverWhenAlone(life, in.probeTargets(), steered, restore)
	}
}

// probeEach sends count probes to t, each from a source port of its own, and fails unless this server
// answered every one: with the group steered, none may land at another process.
func probeEach(ctx context.Context, t probeTarget, count int) error {
	for i := range count {
		pctx, cancel := context.WithTimeout(ctx, probeTimeout)
		err := probeOnce(pctx, t)
		cancel()
		if err != nil {
			return fmt.Errorf("probe %d of %d: %w", i+1, count, err)
		}
	}
	return nil
}

// endTakeOverWhenAlone ends the takeover of each steered group once only this process's sockets are in it,
// giving it back to the kernel's hash, so that the next successor starts from the usual spreading; and once
// the old process's TCP listeners on every endpoint are gone too, it turns tcp_migrate_req back to what it
// was (restore, when it changed it).
func (n *node) endTakeOverWhenAlone(life context.Context, all, steered []probeTarget, restore func() error) {
	deadline := time.Now().Add(unsteerTimeout)
	t := time.NewTicker(orphanPoll)
	defer t.Stop()
	alone := func(network drain.Network, pt probeTarget) bool {
		group, err := drain.Group(network, netip.AddrPortFrom(pt.addr, pt.port))
		return err == nil && drain.Others(group) == 0
	}
	listeners := slices.Clone(all)
	for len(steered) > 0 || len(listeners) > 0 {
		select {
		case <-life.Done():
			return
		case <-t.C:
		}
		steered = slices.DeleteFunc(steered, func(pt probeTarget) bool {
			if !alone(drain.UDP, pt) {
				return false
			}
			if err := drain.EndTakeOver(netip.AddrPortFrom(pt.addr, pt.port)); err != nil {
				log.Warningf("%v", err)
			}
			return true
		})
		listeners = slices.DeleteFunc(listeners, func(pt probeTarget) bool { return alone(drain.TCP, pt) })
		if len(listeners) == 0 && restore != nil {
			if err := restore(); err != nil {
				log.Warningf("turning net.ipv4.tcp_migrate_req back off: %v", err)
			}
			restore = nil
		}
		if time.Now().After(deadline) {
			log.Warningf("the old instance still listens on %s after %v; new lookups stay steered to this one", targetList(append(steered, listeners...)), unsteerTimeout)
			return
		}
	}
}

// watchSuccessor starts looking for a ready successor, every successorPoll, for as long as this process
// owns the node. n.mu is held.
func (n *node) watchSuccessor(life context.Context) {
	if n.handoff.stopWatch != nil {
		n.handoff.stopWatch()
	}
	ctx, stop := context.WithCancel(life)
	n.handoff.stopWatch = stop
	rec := n.rec
	go func() {
		t := time.NewTicker(successorPoll)
		defer t.Stop()
		var failed string // the last error, logged once until it changes or a look succeeds
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			queued, ready, err := rec.SuccessorReady()
			if errors.Is(err, nodelocal.ErrClosed) {
				return
			}
			if err != nil {
				// A read lock posing as a successor (nodelock.ForgedLockError) ends here too: never a hand-off.
				if msg := err.Error(); msg != failed {
					log.Warningf("keeping the node: %v", err)
					failed = msg
				}
				continue
			}
			failed = ""
			n.handoff.successorQueued.Store(queued)
			if !ready {
				continue
			}
			n.handOff(ctx, rec)
			return
		}
	}()
}

// handOff lets the ready successor take the node: the repair loop stops, and link, addresses and rules
// stay as they are. This process keeps answering what reaches it until it stops.
func (n *node) handOff(ctx context.Context, rec *nodelocal.Reconciler) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.rec != rec || ctx.Err() != nil {
		return
	}
	if n.stopRepair != nil {
		n.stopRepair()
		n.stopRepair = nil
	}
	if err := rec.HandOff(); err != nil {
		log.Errorf("hand the node over: %v", err)
	}
	n.rec, n.leases = nil, nil
	n.handoff.handedOff = true
	rulesInPlace.Set(0)
	addressesInPlace.Set(0)
	log.Infof("a successor answers on this node's addresses: handed the node over, leaving the link, the addresses and the rules in place; answering what still reaches this instance until it stops")
	watch, stop := context.WithCancel(n.lifeContext())
	n.handoff.stopWatch = stop
	go n.watchOrphan(watch)
}

// watchOrphan takes the node back when the successor died before it took the node.
func (n *node) watchOrphan(ctx context.Context) {
	t := time.NewTicker(orphanPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n.mu.Lock()
		if !n.handoff.handedOff || len(n.live) == 0 {
			n.mu.Unlock()
			return
		}
		if err := n.retakeIfOrphaned(ctx, true); err != nil {
			log.Errorf("%v", err)
		}
		taken := !n.handoff.handedOff
		n.mu.Unlock()
		if taken {
			return
		}
	}
}

// retakeIfOrphaned takes the node back when neither an owner nor a successor holds it. n.mu is held.
func (n *node) retakeIfOrphaned(ctx context.Context, repair bool) error {
	orphaned, err := nodelock.Orphaned(n.settings.Lock)
	if err != nil || !orphaned {
		return err
	}
	rec, err := nodelocal.New(n.settings.reconcilerConfig())
	if err != nil {
		return fmt.Errorf("the node has no owner any more, but taking it back failed: %w", err)
	}
	n.rec, n.leases = rec, map[claimKey]*sharedLease{}
	n.handoff.handedOff = false
	n.handoff.successorQueued.Store(false)
	err = n.acquireAnswering(ctx)
	if repair {
		n.runOwnerLoopsLocked(n.lifeContext())
	}
	n.updateGauges()
	log.Warningf("the successor left before it took the node over: took the node back")
	return err
}

// handoverConfig returns the settings' hand-over to the cluster DNS, and whether there is one.
func (s nodeSettings) handoverConfig() (nodelocal.Handover, bool) {
	if !s.Handover {
		return nodelocal.Handover{}, false
	}
	return nodelocal.Handover{ServiceAddresses: parseAddrList(s.ServiceAddresses), Upstream: parseAddrList(s.HandoverUpstream)}, true
}

func parseAddrList(s string) []netip.Addr {
	var out []netip.Addr
	for f := range strings.FieldsSeq(s) {
		if a, err := netip.ParseAddr(f); err == nil {
			out = append(out, a.Unmap())
		}
	}
	return out
}

// handOverAtExit hands the node to the cluster DNS (see nodelocal.Reconciler.HandOver), waits until this
// process's sockets are idle, takes the Service addresses off the link and lets go of the node. n.mu is
// held; the caller closes the Reconciler. It returns false when the hand-over failed and the caller should
// tear down instead.
func (n *node) handOverAtExit(reason string, h nodelocal.Handover, endpoints []netip.AddrPort) bool {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), teardownTimeout)
	defer cancel()
	diverted, err := n.rec.HandOver(ctx, h)
	if err != nil {
		countSetupError(err)
		log.Errorf("%s: handing the node to the cluster DNS failed, tearing down instead: %v", reason, err)
		return false
	}
	n.drainSockets(reason, endpoints)
	lctx, lcancel := context.WithTimeout(context.Background(), teardownTimeout)
	defer lcancel()
	removed, err := n.rec.CompleteHandOver(lctx, h)
	if err != nil {
		countSetupError(err)
		log.Errorf("%s: %v", reason, err)
	}
	var via []string
	for _, d := range diverted {
		via = append(via, fmt.Sprintf("%s to %s", d.From, d.To))
	}
	log.Infof("%s: handed the node to the cluster DNS in %v: jumps out, %v off %s, diverting %s; the next start takes it back once it answers",
		reason, time.Since(start).Round(time.Millisecond), removed, n.settings.Interface, strings.Join(via, ", "))
	return true
}

// drainSockets waits, up to drainTimeout, until this process's sockets on endpoints have nothing queued
// and no query is being answered, drainQuietChecks times in a row: what was queued when new traffic went
// elsewhere gets its answer before the listeners close.
func (n *node) drainSockets(reason string, endpoints []netip.AddrPort) {
	start := time.Now()
	deadline := start.Add(drainTimeout)
	quiet := 0
	for quiet < drainQuietChecks {
		udpIdle, err := drain.Idle(drain.UDP, endpoints)
		if err != nil {
			log.Warningf("%s: cannot tell whether the sockets are idle: %v", reason, err)
			return
		}
		tcpIdle, err := drain.Idle(drain.TCP, endpoints)
		if err != nil {
			log.Warningf("%s: cannot tell whether the listeners are idle: %v", reason, err)
			return
		}
		if udpIdle && tcpIdle && n.handoff.inflight.Load() == 0 {
			quiet++
		} else {
			quiet = 0
		}
		if time.Now().After(deadline) {
			log.Warningf("%s: lookups still reach this instance after %v; closing its sockets anyway", reason, drainTimeout)
			return
		}
		time.Sleep(drainCheckEvery)
	}
	log.Infof("%s: drained the sockets in %v", reason, time.Since(start).Round(time.Millisecond))
}

// liveEndpoints returns the DNS endpoints of every live instance. n.mu is held.
func (n *node) liveEndpoints() []netip.AddrPort {
	var eps []netip.AddrPort
	for in := range n.live {
		for _, k := range in.keys() {
			eps = append(eps, netip.AddrPortFrom(k.addr, k.port))
		}
	}
	slices.SortFunc(eps, netip.AddrPort.Compare)
	return slices.Compact(eps)
}

// leaveToSuccessor ends a process that does not own the node at exit: one still waiting to take it over
// leaves the queue; one that handed it over drains its sockets and leaves everything to the successor,
// unless the successor died before it took the node, which this process then takes back to hand it over
// or tear it down as usual. It reports whether the process is done with the node. n.mu is held.
func (n *node) leaveToSuccessor(ctx context.Context, reason string, endpoints []netip.AddrPort) bool {
	if q := n.handoff.successor; q != nil {
		n.handoff.successor = nil
		q.Close()
		log.Infof("%s: stopping before taking the node over; %s keeps it", reason, n.handoff.successorOf)
		return true
	}
	if !n.handoff.handedOff {
		return false
	}
	if err := n.retakeIfOrphaned(ctx, false); err != nil {
		log.Errorf("%s: %v", reason, err)
	}
	if !n.handoff.handedOff {
		return false // taken back: the usual exit
	}
	// New UDP packets go to the successor already (it steered the groups); new TCP connections, and
	// those waiting to be accepted here, go to it once these listeners stop taking them.
	if stopped, err := drain.HandListenersOver(endpoints); err != nil {
		log.Warningf("%s: TCP connections may still reach this instance while it stops: %v", reason, err)
	} else if stopped > 0 {
		log.Infof("%s: handed %d TCP listeners' connections over to the successor", reason, stopped)
	}
	n.drainSockets(reason, endpoints)
	n.handoff.handedOff = false // done: a later shutdown callback finds nothing to do
	log.Infof("%s: left the link, the addresses and the rules to the successor", reason)
	return true
}
