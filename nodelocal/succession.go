//go:build linux

package nodelocal

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nodelocaldns/nodelocaldns/nodelocal/internal/drain"
	"github.com/nodelocaldns/nodelocaldns/nodelocal/internal/nodelock"
)

// Pauses and bounds of a Succession.
const (
	// successorPoll is how often an owner looks for a ready successor where it cannot watch the node lock's
	// file, and how long after the file told of a change it looks once more.
	successorPoll = 100 * time.Millisecond
	// orphanPoll is how often a process that let go checks that its successor took the node, and how often
	// a takeover checks whether the old process's sockets have left the groups.
	orphanPoll = 500 * time.Millisecond
	// successionCheckTimeout bounds the checks of a successor against its owner before it queues.
	successionCheckTimeout = 30 * time.Second
)

// SuccessionState is a process's part in its node's changes of hands (see the diagram in the package
// documentation).
type SuccessionState int

// The states of a Succession.
const (
	// Alone: the process neither owns the node through the Succession nor waits for it: before Own or
	// Queue, and after Leave.
	Alone SuccessionState = iota
	// Waiting: queued behind the node's owner, serving beside it on the same addresses, changing nothing.
	Waiting
	// TakingOver: the owner let go of the node to this process, whose server answers; new UDP lookups are
	// being steered to this process before it acquires the node (SuccessionHooks.Own).
	TakingOver
	// Owning: the process owns the node and watches for a ready successor.
	Owning
	// HandedOff: the process let a ready successor take the node, leaving everything in place; it still
	// answers what reaches it, and takes the node back if the successor leaves without taking it.
	HandedOff
)

func (s SuccessionState) String() string {
	switch s {
	case Alone:
		return "alone"
	case Waiting:
		return "waiting"
	case TakingOver:
		return "taking over"
	case Owning:
		return "owning"
	case HandedOff:
		return "handed off"
	}
	return fmt.Sprintf("SuccessionState(%d)", int(s))
}

// Ownership says how a Succession made its process the node's owner, for SuccessionHooks.Own.
type Ownership int

// The ways a process comes to own its node through a Succession.
const (
	// TookOver: the owner let go to this successor, whose server answers on every endpoint and to which
	// new UDP lookups are steered already: everything goes in place with its rules at once.
	TookOver Ownership = iota
	// OwnerLeftFirst: the owner let go of the node (stopped) before this successor's server answered; the
	// owner has handed the node to the cluster DNS or torn it down, so the rules follow once the server
	// answers its probes, as at any start.
	OwnerLeftFirst
	// TookBack: the successor this process handed the node to left before it took it; this process,
	// which answers, takes it back with its rules at once.
	TookBack
	// AtExit: this process stops while it takes the node over or takes it back; it owns the node only to
	// leave it as an owner does (hand it to the cluster DNS, or tear it down).
	AtExit
)

func (o Ownership) String() string {
	switch o {
	case TookOver:
		return "took over"
	case OwnerLeftFirst:
		return "owner left first"
	case TookBack:
		return "took back"
	case AtExit:
		return "at exit"
	}
	return fmt.Sprintf("Ownership(%d)", int(o))
}

// SuccessionHooks connect a Succession to the DNS server it serves the node with.
type SuccessionHooks struct {
	// Lock is the caller's lock. The caller holds it when it calls the Succession's methods; the
	// Succession takes it whenever it changes state in the background, and calls Own and Release with it
	// held.
	Lock sync.Locker
	// Own makes rec, which owns the node now, the caller's Reconciler: it acquires the leases of
	// everything the server serves, with their rules at once or, for OwnerLeftFirst, once the server
	// answers, and starts what an owner runs (but nothing that outlives the process for AtExit). It
	// returns what failed; rec stays the caller's either way (it retries as an owner does).
	Own func(ctx context.Context, rec *Reconciler, how Ownership) error
	// Release drops the caller's Reconciler, which a ready successor has taken the node from (the
	// Succession closed it, leaving everything in place), and stops what the caller ran as its owner.
	Release func()
	// InFlight returns how many queries the server is answering now; nil means none are counted.
	InFlight func() int64
	// Failed, if set, is called with every error the Succession meets in the background, after it
	// logged it (for metrics).
	Failed func(error)
}

// A Succession is one process's part in its node's changes of hands, with no moment in which nobody
// answers: a process that finds the node owned queues as its successor (Queue), serves beside the owner,
// and takes the node once it answers; an owner (Own) lets a ready successor take the node, and takes it
// back if that successor leaves without taking it; at exit (Leave, HandOverAtExit) the sockets drain
// before they close. The server is reached only through its hooks: a probe that this process's server
// alone answers, and the count of queries in flight. See the package documentation for the states.
//
// Its methods are called with SuccessionHooks.Lock held.
type Succession struct {
	hooks   SuccessionHooks
	sockets reuseportSockets
	log     Logger

	// The fields below are guarded by hooks.Lock.
	state SuccessionState
	cfg   Config
	// rec is the Reconciler the owner's watch uses, or the one a takeover steers for.
	rec *Reconciler
	// successor is this process's place in line while it waits.
	successor *Successor
	// from names the owner this process waits for, or took the node from.
	from string
	// life is the context of the background work, from Own or Queue; stopWatch ends the watch of the
	// current state.
	life      context.Context
	stopWatch context.CancelFunc

	// queued is set while a successor waits for this owner (read without the lock, by readiness checks).
	queued atomic.Bool

	// Seams for tests without root.
	ownerEndpoints func(*Successor, context.Context) ([]netip.AddrPort, error)
	nodeAddrs      func(context.Context) ([]netip.Addr, error)
	adopt          func(*Reconciler)
}

// NewSuccession returns a Succession, Alone, that works through hooks and logs to log.
func NewSuccession(hooks SuccessionHooks, log Logger) (*Succession, error) {
	if hooks.Lock == nil || hooks.Own == nil || hooks.Release == nil {
		return nil, configError("set up the succession", errors.New("the Lock, Own and Release hooks are required"))
	}
	if log == nil {
		log = discard{}
	}
	return &Succession{
		hooks:          hooks,
		sockets:        kernelSockets{},
		log:            log,
		ownerEndpoints: (*Successor).OwnerEndpoints,
		nodeAddrs:      nodeAddresses,
		adopt:          func(*Reconciler) {},
	}, nil
}

// State returns the Succession's state.
func (s *Succession) State() SuccessionState { return s.state }

// SuccessorQueued reports whether a successor waits for this owner. A server that reports it not ready
// meanwhile keeps a readiness probe of the successor's Pod, which the shared listeners may hand to this
// process, from saying ready before the successor owns the node. It needs no lock.
func (s *Succession) SuccessorQueued() bool { return s.queued.Load() }

// Own records that this process owns the node with rec (from New) and watches for a ready successor
// until ctx ends or Leave.
func (s *Succession) Own(ctx context.Context, cfg Config, rec *Reconciler) {
	s.cfg, s.life = cfg.withDefaults(), ctx
	s.ownLocked(rec)
}

// ownLocked makes rec the owner's and starts the watch for a successor.
func (s *Succession) ownLocked(rec *Reconciler) {
	s.state, s.rec = Owning, rec
	s.setQueued(false)
	s.watch(func(ctx context.Context) { s.watchSuccessor(ctx, rec) })
}

// watch ends the watch of the previous state and starts fn as the watch of the current one, until the
// background work's context ends.
func (s *Succession) watch(fn func(context.Context)) {
	if s.stopWatch != nil {
		s.stopWatch()
	}
	ctx, stop := context.WithCancel(s.life)
	s.stopWatch = stop
	go fn(ctx)
}

// Queue puts this process in line to succeed the node's owner, after New failed with lockErr (the
// node's lock is held): it checks that the server serves every endpoint the owner's rules cover and that
// their addresses are on the node (a successor changes nothing before it owns the node), then, in the
// background until ctx ends, probes every endpoint until the server answers there, tells the owner, and
// takes the node when the owner lets go. The lock is tried every HandoffPoll meanwhile: an owner that
// stops before this server answers (a SIGTERM, an eviction, the DaemonSet controller deleting a Pod that
// said it was not ready) leaves the node to this successor at once instead of to nobody.
//
// probe must send each query from a source port of its own and succeed only on this server's answer.
func (s *Succession) Queue(ctx context.Context, cfg Config, lockErr error, endpoints []netip.AddrPort, probe ProbeFunc) error {
	q, err := Queue(cfg)
	if err != nil {
		return fmt.Errorf("set up the node: %w; and it cannot wait to take the node over: %w", lockErr, err)
	}
	cctx, cancel := context.WithTimeout(ctx, successionCheckTimeout)
	defer cancel()
	if err := s.servesWhatTheOwnerServes(cctx, q, endpoints); err != nil {
		_ = q.Close()
		return fmt.Errorf("%w; and this instance cannot take the node over: %w", lockErr, err)
	}
	if err := s.addressesOnNode(cctx, endpoints); err != nil {
		_ = q.Close()
		return fmt.Errorf("cannot take the node over from %s: %w", q.Owner(), err)
	}
	// No listen check here: a socket opened and closed in the owner's live reuseport group drops the
	// queries hashed to it meanwhile (UDP) and resets the connections (TCP). A successor has changed
	// nothing it would have to undo, and one whose listeners cannot open never answers, so it never
	// takes the node.
	s.cfg, s.life = cfg.withDefaults(), ctx
	s.state, s.successor, s.from = Waiting, q, q.Owner()
	s.log.Infof("another instance owns this node (%s): serving beside it, and taking the node over once this server answers", q.Owner())
	endpoints = sortedEndpoints(endpoints)
	s.watch(func(ctx context.Context) { s.succeed(ctx, q, endpoints, probe) })
	return nil
}

// servesWhatTheOwnerServes checks that endpoints cover every address and DNS port the owner's rules
// cover: an instance that does not (a stray copy on another port, say) must not take the node.
func (s *Succession) servesWhatTheOwnerServes(ctx context.Context, q *Successor, endpoints []netip.AddrPort) error {
	owner, err := s.ownerEndpoints(q, ctx)
	if err != nil {
		return err
	}
	var missing []string
	for _, e := range owner {
		if !slices.ContainsFunc(endpoints, func(ep netip.AddrPort) bool { return ep.Addr().Unmap() == e.Addr().Unmap() && ep.Port() == e.Port() }) {
			missing = append(missing, e.String())
		}
	}
	if len(missing) > 0 {
		return &Error{Kind: KindConfig, Op: "compare with the owner",
			Err: fmt.Errorf("the owner serves %s, which this instance does not: a successor serves at least what its owner serves", strings.Join(missing, ", "))}
	}
	return nil
}

// addressesOnNode checks that the address of every endpoint is an address of the node already: a
// successor changes nothing before it owns the node, and its listeners need them.
func (s *Succession) addressesOnNode(ctx context.Context, endpoints []netip.AddrPort) error {
	have, err := s.nodeAddrs(ctx)
	if err != nil {
		return err
	}
	var missing []string
	for _, e := range endpoints {
		if !slices.Contains(have, e.Addr().Unmap()) {
			missing = append(missing, e.Addr().String())
		}
	}
	slices.Sort(missing)
	if len(missing) > 0 {
		return &Error{Kind: KindConfig, Op: "check the owner's addresses",
			Err: fmt.Errorf("%s not on the node (the owner serves other addresses, or has failed open)", strings.Join(slices.Compact(missing), ", "))}
	}
	return nil
}

// succeed waits until the server answers on every endpoint, tells the owner, and takes the node once the
// owner lets go of it, or at once when the owner let go first. It ends with ctx, or when this process
// leaves the line.
func (s *Succession) succeed(ctx context.Context, q *Successor, endpoints []netip.AddrPort, probe ProbeFunc) {
	probeCtx, stopProbes := context.WithCancel(ctx)
	defer stopProbes()
	answered := make(chan error, 1)
	go func() { answered <- AwaitAnswers(probeCtx, endpoints, probe, s.log) }()
	poll := time.NewTicker(HandoffPoll)
	defer poll.Stop()
	ready := false
	for {
		select {
		case <-ctx.Done():
			return
		case err := <-answered:
			if err != nil {
				return // ctx ended
			}
			s.hooks.Lock.Lock()
			if s.successor != q {
				s.hooks.Lock.Unlock()
				return
			}
			err = q.Ready()
			s.hooks.Lock.Unlock()
			if err != nil {
				s.failed(err, "this server answers on %s, but it could not tell the owner: %v", endpointList(endpoints), err)
				return
			}
			ready = true
			s.log.Infof("this server answers on %s: waiting for %s to hand the node over", endpointList(endpoints), q.Owner())
		case <-poll.C:
		}
		if s.tryTake(q, ready, endpoints, probe) {
			return
		}
	}
}

// tryTake takes the node when the owner let go of it, and reports whether this process left the line
// (it took the node, or Leave took it out of line).
func (s *Succession) tryTake(q *Successor, answering bool, endpoints []netip.AddrPort, probe ProbeFunc) bool {
	s.hooks.Lock.Lock()
	if s.successor != q {
		s.hooks.Lock.Unlock()
		return true
	}
	rec, err := q.TryTake()
	if err != nil {
		s.hooks.Lock.Unlock()
		s.failed(err, "waiting to take the node over from %s: %v", q.Owner(), err)
		return false
	}
	if rec == nil {
		s.hooks.Lock.Unlock()
		return false
	}
	s.successor = nil
	_ = q.Close()
	s.adopt(rec)
	life := s.life
	if !answering {
		defer s.hooks.Lock.Unlock()
		s.ownLocked(rec)
		err := s.hooks.Own(life, rec, OwnerLeftFirst)
		if err != nil {
			s.failed(err, "%s stopped before this server answered, and taking the node over is not complete yet (retrying): %v", s.from, err)
		} else {
			s.log.Infof("%s stopped before this server answered: took the node over; its rules follow once this server answers", s.from)
		}
		return true
	}
	s.state, s.rec = TakingOver, rec
	s.hooks.Lock.Unlock()
	s.takeOver(life, rec, endpoints, probe)
	return true
}

// takeOver makes this process, whose server answers, the owner of the node its owner let go of: new UDP
// packets are steered to this process first, then the caller acquires the node with its rules at once.
// A server whose readiness follows its leases says ready only then, so a rollout stops the old process
// only once nothing new reaches it any more; stopped earlier, it would close sockets that the kernel still
// hashes new packets to.
func (s *Succession) takeOver(ctx context.Context, rec *Reconciler, endpoints []netip.AddrPort, probe ProbeFunc) {
	s.steerToThisProcess(ctx, endpoints, probe)
	s.hooks.Lock.Lock()
	defer s.hooks.Lock.Unlock()
	if s.state != TakingOver || s.rec != rec {
		return // Leave gave rec to the caller meanwhile
	}
	s.ownLocked(rec)
	if err := s.hooks.Own(ctx, rec, TookOver); err != nil {
		s.failed(err, "took the node over from %s, but not everything is in place yet (retrying): %v", s.from, err)
		return
	}
	s.log.Infof("took the node over from %s", s.from)
}

// watchSuccessor looks for a ready successor when it starts and whenever the node lock's file tells of a
// change in the line (nodelock.Closed: a successor rings when it queues, says it is ready and leaves, and a
// successor's process that dies closes the file), and once more successorPoll after each (the kernel tells of
// a file's close just before it drops the closing process's locks), and lets it take the node. Where the file
// cannot be watched it looks every successorPoll. What it finds about the line is announced to this
// process's users of the reuseport groups (ReuseportChanges).
func (s *Succession) watchSuccessor(ctx context.Context, rec *Reconciler) {
	bell, err := nodelock.Closed(ctx, s.cfg.LockPath)
	if err != nil {
		s.log.Warningf("looking for a successor every %v: %v", successorPoll, err)
	}
	look := time.NewTimer(0) // at once: a successor may have queued before the watch began
	defer look.Stop()
	var failed string // the last error, logged once until it changes or a look succeeds
	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-bell:
			if !ok && ctx.Err() == nil {
				s.log.Warningf("the node lock's bell stopped; looking for a successor every %v", successorPoll)
				bell = nil
			}
			look.Reset(successorPoll)
		case <-look.C:
			if bell == nil {
				look.Reset(successorPoll)
			}
		}
		queued, ready, err := rec.SuccessorReady()
		if errors.Is(err, ErrClosed) {
			return
		}
		if err != nil {
			// A read lock posing as a successor (a forged lock) ends here too: never a hand-off.
			if msg := err.Error(); msg != failed {
				s.log.Warningf("keeping the node: %v", err)
				failed = msg
			}
			continue
		}
		failed = ""
		s.setQueued(queued)
		if ready && s.handOff(ctx, rec) {
			return
		}
	}
}

// handOff lets the ready successor take the node: the caller's Reconciler goes, and link, addresses and
// rules stay as they are. This process keeps answering what reaches it until it stops, and watches that
// the successor takes the node. It reports whether it handed the node off.
func (s *Succession) handOff(ctx context.Context, rec *Reconciler) bool {
	s.hooks.Lock.Lock()
	defer s.hooks.Lock.Unlock()
	if s.state != Owning || s.rec != rec || ctx.Err() != nil {
		return true
	}
	if err := rec.HandOff(); err != nil {
		s.failed(err, "hand the node over: %v", err)
	}
	s.hooks.Release()
	s.state, s.rec = HandedOff, nil
	s.log.Infof("a successor answers on this node's addresses: handed the node over, leaving the link, the addresses and the rules in place; answering what still reaches this instance until it stops")
	s.watch(s.watchOrphan)
	return true
}

// watchOrphan takes the node back when the successor left before it took the node.
func (s *Succession) watchOrphan(ctx context.Context) {
	t := time.NewTicker(orphanPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.hooks.Lock.Lock()
		if s.state != HandedOff {
			s.hooks.Lock.Unlock()
			return
		}
		taken, err := s.takeBackIfOrphaned(s.life, TookBack)
		if err != nil {
			s.failed(err, "%v", err)
		}
		s.hooks.Lock.Unlock()
		if taken {
			return
		}
	}
}

// takeBackIfOrphaned takes the node back when neither an owner nor a successor holds it, and reports
// whether it did. The lock is held.
func (s *Succession) takeBackIfOrphaned(ctx context.Context, how Ownership) (bool, error) {
	orphaned, err := nodelock.Orphaned(s.cfg.LockPath)
	if err != nil || !orphaned {
		return false, err
	}
	rec, err := New(s.cfg)
	if err != nil {
		return false, fmt.Errorf("the node has no owner any more, but taking it back failed: %w", err)
	}
	s.adopt(rec)
	if how == AtExit {
		s.state, s.rec = Alone, nil
	} else {
		s.ownLocked(rec)
	}
	err = s.hooks.Own(ctx, rec, how)
	s.log.Warningf("the successor left before it took the node over: took the node back")
	return true, err
}

// Leave ends the Succession at this process's exit, and reports whether the process is done with the
// node. One still waiting to take it over leaves the line; one that handed it off lets the successor's
// sockets take over its TCP listeners' connections, drains its sockets on endpoints and leaves
// everything to the successor, unless the successor left before it took the node, which this process
// then takes back (Own with AtExit) to leave it as an owner does; one taking the node over gets it now
// (Own with AtExit). It returns false when the caller owns the node and should hand it over or tear it
// down as usual.
func (s *Succession) Leave(ctx context.Context, reason string, endpoints []netip.AddrPort) bool {
	if s.stopWatch != nil {
		s.stopWatch()
		s.stopWatch = nil
	}
	state, rec := s.state, s.rec
	s.state, s.rec = Alone, nil
	s.setQueued(false)
	switch state {
	case Waiting:
		_ = s.successor.Close()
		s.successor = nil
		s.log.Infof("%s: stopping before taking the node over; %s keeps it", reason, s.from)
		return true
	case TakingOver:
		if err := s.hooks.Own(ctx, rec, AtExit); err != nil {
			s.failed(err, "%s: %v", reason, err)
		}
		return false
	case HandedOff:
		taken, err := s.takeBackIfOrphaned(ctx, AtExit)
		if err != nil {
			s.failed(err, "%s: %v", reason, err)
		}
		if taken {
			return false // the usual exit
		}
	default:
		return false
	}
	// New UDP packets go to the successor already (it steered the groups); new TCP connections, and those
	// waiting to be accepted here, go to it once these listeners stop taking them.
	if stopped, err := s.sockets.HandListenersOver(endpoints); err != nil {
		s.log.Warningf("%s: TCP connections may still reach this instance while it stops: %v", reason, err)
	} else if stopped > 0 {
		s.log.Infof("%s: handed %d TCP listeners' connections over to the successor", reason, stopped)
	}
	s.Drain(reason, endpoints)
	s.log.Infof("%s: left the link, the addresses and the rules to the successor", reason)
	return true
}

// setQueued records whether a successor waits for this owner, for readiness (SuccessorQueued) and for the
// fast path, which gives its reuseport group back to the kernel's hash for the successor's sockets.
func (s *Succession) setQueued(queued bool) {
	s.queued.Store(queued)
	drain.SetSuccessorQueued(queued)
}

// failed logs an error of the background work and passes it to the Failed hook.
func (s *Succession) failed(err error, format string, args ...any) {
	s.log.Errorf(format, args...)
	if s.hooks.Failed != nil {
		s.hooks.Failed(err)
	}
}

// sortedEndpoints returns endpoints unmapped, sorted, without repeats.
func sortedEndpoints(endpoints []netip.AddrPort) []netip.AddrPort {
	out := make([]netip.AddrPort, len(endpoints))
	for i, e := range endpoints {
		out[i] = netip.AddrPortFrom(e.Addr().Unmap(), e.Port())
	}
	slices.SortFunc(out, netip.AddrPort.Compare)
	return slices.Compact(out)
}

func endpointList(endpoints []netip.AddrPort) string {
	s := make([]string, len(endpoints))
	for i, e := range endpoints {
		s[i] = e.String()
	}
	return strings.Join(s, ", ")
}
