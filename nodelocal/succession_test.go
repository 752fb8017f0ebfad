//go:build linux

package nodelocal

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodelocaldns/nodelocaldns/nodelocal/internal/drain"
)

// The Succession's state machine, without root: two processes are two Successions in this one, sharing a
// node lock in a temporary directory; the reuseport groups are fakeSockets, the DNS server a probe that
// answers when told to.

// stepBound bounds the wait for one step of a change of hands; it only decides when a test gives up.
const stepBound = 30 * time.Second

// fakeSockets records what a Succession does with the reuseport groups, and answers as told.
type fakeSockets struct {
	mu  sync.Mutex
	ops []string
	// taking holds the endpoints taken over; others the groups that still have another process's sockets.
	taking map[netip.AddrPort]bool
	others map[netip.AddrPort]bool
	// idleAfter makes Idle report busy sockets this many times first.
	idleAfter int
	restored  bool
}

func newFakeSockets() *fakeSockets {
	return &fakeSockets{taking: map[netip.AddrPort]bool{}, others: map[netip.AddrPort]bool{}}
}

func (f *fakeSockets) record(format string, args ...any) {
	f.ops = append(f.ops, fmt.Sprintf(format, args...))
}

func (f *fakeSockets) log() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.ops)
}

func (f *fakeSockets) MigrateListeners(string) (func() error, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("MigrateListeners")
	return func() error {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.record("RestoreMigrate")
		f.restored = true
		return nil
	}, nil
}

func (f *fakeSockets) TakeOver(local netip.AddrPort) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("TakeOver(%s)", local)
	if f.others[local] {
		f.taking[local] = true
		return 2, nil
	}
	return 1, nil
}

func (f *fakeSockets) TakingOver(local netip.AddrPort) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.taking[local]
}

func (f *fakeSockets) EndTakeOver(local netip.AddrPort) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("EndTakeOver(%s)", local)
	delete(f.taking, local)
	return nil
}

func (f *fakeSockets) Alone(_ drain.Network, local netip.AddrPort) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return !f.others[local]
}

func (f *fakeSockets) Idle(network drain.Network, _ []netip.AddrPort) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("Idle(%s)", network)
	if f.idleAfter > 0 {
		f.idleAfter--
		return false, nil
	}
	return true, nil
}

func (f *fakeSockets) HandListenersOver(eps []netip.AddrPort) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("HandListenersOver%v", eps)
	return len(eps), nil
}

// leaveOthers makes the other process's sockets leave every group.
func (f *fakeSockets) leaveOthers() {
	f.mu.Lock()
	defer f.mu.Unlock()
	clear(f.others)
}

// quietLog records lines and shows them only when the test failed: the Succession's goroutines may log
// after the test ended.
type quietLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *quietLog) add(level, format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, level+" "+fmt.Sprintf(format, args...))
}
func (l *quietLog) Infof(f string, a ...any)    { l.add("[INFO]", f, a...) }
func (l *quietLog) Warningf(f string, a ...any) { l.add("[WARNING]", f, a...) }
func (l *quietLog) Errorf(f string, a ...any)   { l.add("[ERROR]", f, a...) }

// fakeProcess is one cache process on the node: its Succession, its hooks' side, and its server.
type fakeProcess struct {
	t       *testing.T
	name    string
	cfg     Config
	mu      sync.Mutex // the caller's lock, SuccessionHooks.Lock
	s       *Succession
	sockets *fakeSockets
	log     *quietLog

	// Guarded by mu.
	rec    *Reconciler
	events []string

	// answers says whether the server answers its probes; probes counts them.
	answers  atomic.Bool
	probes   atomic.Int64
	inflight atomic.Int64
	// changed gets a value at every event.
	changed chan struct{}
	ctx     context.Context
}

var fakeEndpoints = []netip.AddrPort{netip.MustParseAddrPort("169.254.20.10:53"), netip.MustParseAddrPort("10.96.0.10:53")}

func newFakeProcess(t *testing.T, name, lockPath string) *fakeProcess {
	t.Helper()
	p := &fakeProcess{t: t, name: name, sockets: newFakeSockets(), log: &quietLog{}, changed: make(chan struct{}, 100)}
	p.cfg = Config{LockPath: lockPath, Logger: p.log, NoInterface: true}
	ctx, cancel := context.WithCancel(context.Background())
	p.ctx = ctx
	s, err := NewSuccession(SuccessionHooks{
		Lock: &p.mu,
		Own: func(_ context.Context, rec *Reconciler, how Ownership) error {
			p.rec = rec
			p.event("Own(%s)", how)
			return nil
		},
		Release: func() {
			p.rec = nil
			p.event("Release")
		},
		InFlight: p.inflight.Load,
	}, p.log)
	if err != nil {
		t.Fatal(err)
	}
	s.sockets = p.sockets
	s.ownerEndpoints = func(*Successor, context.Context) ([]netip.AddrPort, error) { return fakeEndpoints, nil }
	s.nodeAddrs = func(context.Context) ([]netip.Addr, error) {
		return []netip.Addr{fakeEndpoints[0].Addr(), fakeEndpoints[1].Addr()}, nil
	}
	p.s = s
	t.Cleanup(func() {
		cancel()
		p.mu.Lock()
		if p.rec != nil {
			_ = p.rec.Close()
		}
		p.mu.Unlock()
		if t.Failed() {
			p.log.mu.Lock()
			t.Logf("%s's log:\n%s", name, strings.Join(p.log.lines, "\n"))
			p.log.mu.Unlock()
		}
	})
	return p
}

// event records an event; mu is held.
func (p *fakeProcess) event(format string, args ...any) {
	p.events = append(p.events, fmt.Sprintf(format, args...))
	p.changed <- struct{}{}
}

func (p *fakeProcess) probe(context.Context, netip.AddrPort) error {
	p.probes.Add(1)
	if p.answers.Load() {
		return nil
	}
	return errors.New("no answer")
}

// start starts the process as the cache does: it owns the node, or queues behind its owner.
func (p *fakeProcess) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	rec, err := New(p.cfg)
	if err == nil {
		p.rec = rec
		p.s.Own(p.ctx, p.cfg, rec)
		return nil
	}
	if KindOf(err) != KindNodeLock {
		return err
	}
	return p.s.Queue(p.ctx, p.cfg, err, fakeEndpoints, p.probe)
}

// await waits until cond, checked with mu held at every event and every HandoffPoll, holds.
func (p *fakeProcess) await(what string, cond func() bool) {
	p.t.Helper()
	deadline := time.NewTimer(stepBound)
	defer deadline.Stop()
	tick := time.NewTicker(HandoffPoll)
	defer tick.Stop()
	for {
		p.mu.Lock()
		ok := cond()
		p.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-p.changed:
		case <-tick.C:
		case <-deadline.C:
			p.mu.Lock()
			defer p.mu.Unlock()
			p.t.Fatalf("%s: not within %v: %s is %s, events %v", what, stepBound, p.name, p.s.State(), p.events)
		}
	}
}

func (p *fakeProcess) state() SuccessionState {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.s.State()
}

func (p *fakeProcess) eventList() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.events)
}

// exit ends the process as the cache does: Leave, then, when it still owns the node, it lets go of it.
func (p *fakeProcess) exit() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	done := p.s.Leave(context.Background(), "exit", fakeEndpoints)
	if !done && p.rec != nil {
		_ = p.rec.Close()
		p.rec = nil
	}
	return done
}

func TestSuccessionOnAFakeNode(t *testing.T) {
	t.Run("a ready successor takes over: steered first, then owned", func(t *testing.T) {
		lock := filepath.Join(t.TempDir(), "nodelocaldns.lock")
		a, b := newFakeProcess(t, "owner", lock), newFakeProcess(t, "successor", lock)
		if err := a.start(); err != nil {
			t.Fatal(err)
		}
		for _, e := range fakeEndpoints {
			b.sockets.others[e] = true // the owner's sockets are in the groups
		}
		if err := b.start(); err != nil {
			t.Fatal(err)
		}
		if s := b.state(); s != Waiting {
			t.Fatalf("successor: %s, want waiting", s)
		}
		a.await("the owner sees a successor queued", func() bool { return a.s.SuccessorQueued() })
		b.answers.Store(true)
		a.await("the owner hands off", func() bool { return a.s.State() == HandedOff })
		b.await("the successor owns the node", func() bool { return b.s.State() == Owning && len(b.events) > 0 })
		if got := a.eventList(); !slices.Equal(got, []string{"Release"}) {
			t.Errorf("owner's events %v, want [Release]", got)
		}
		if got := b.eventList(); !slices.Equal(got, []string{"Own(took over)"}) {
			t.Errorf("successor's events %v, want [Own(took over)]", got)
		}
		ops := b.sockets.log()
		for _, e := range sortedEndpoints(fakeEndpoints) {
			if !slices.Contains(ops, "TakeOver("+e.String()+")") {
				t.Errorf("%s not taken over: %v", e, ops)
			}
		}
		if ops[0] != "MigrateListeners" {
			t.Errorf("sockets ops %v: the TCP listeners' migration must come first", ops)
		}
		// Every endpoint was probed until it answered, then steerProbes times more.
		if n := b.probes.Load(); n < int64(len(fakeEndpoints)*(steerProbes+1)) {
			t.Errorf("%d probes, want at least %d", n, len(fakeEndpoints)*(steerProbes+1))
		}
		// Once the old sockets are gone the groups go back to the kernel's hash, and tcp_migrate_req back.
		b.sockets.leaveOthers()
		b.await("the takeover ends", func() bool {
			b.sockets.mu.Lock()
			defer b.sockets.mu.Unlock()
			return len(b.sockets.taking) == 0 && b.sockets.restored
		})
		// The old owner's exit leaves everything to the successor, after its sockets drained.
		if !a.exit() {
			t.Error("the old owner's exit found the node its own")
		}
		if ops := a.sockets.log(); !slices.Contains(ops, fmt.Sprintf("HandListenersOver%v", fakeEndpoints)) || !slices.Contains(ops, "Idle(udp)") {
			t.Errorf("old owner's sockets at exit: %v, want its listeners handed over and its sockets drained", ops)
		}
		if got := a.eventList(); len(got) != 1 {
			t.Errorf("owner's events %v: its exit must not take the node back", got)
		}
	})

	t.Run("the owner stops before its successor answers", func(t *testing.T) {
		lock := filepath.Join(t.TempDir(), "nodelocaldns.lock")
		a, b := newFakeProcess(t, "owner", lock), newFakeProcess(t, "successor", lock)
		if err := a.start(); err != nil {
			t.Fatal(err)
		}
		if err := b.start(); err != nil {
			t.Fatal(err)
		}
		b.await("the successor probes", func() bool { return b.probes.Load() > 0 })
		if a.exit() {
			t.Fatal("the owner's exit says a successor has the node")
		}
		b.await("the successor owns the node", func() bool { return b.s.State() == Owning })
		if got := b.eventList(); !slices.Equal(got, []string{"Own(owner left first)"}) {
			t.Errorf("successor's events %v, want [Own(owner left first)]", got)
		}
		if ops := b.sockets.log(); len(ops) != 0 {
			t.Errorf("nothing is steered for a server that does not answer yet: %v", ops)
		}
	})

	t.Run("the successor leaves before it takes the node", func(t *testing.T) {
		lock := filepath.Join(t.TempDir(), "nodelocaldns.lock")
		a := newFakeProcess(t, "owner", lock)
		if err := a.start(); err != nil {
			t.Fatal(err)
		}
		q, err := Queue(a.cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := q.Ready(); err != nil {
			t.Fatal(err)
		}
		a.await("the owner hands off", func() bool { return a.s.State() == HandedOff })
		_ = q.Close()
		a.await("the owner takes the node back", func() bool { return a.s.State() == Owning })
		if got := a.eventList(); !slices.Equal(got, []string{"Release", "Own(took back)"}) {
			t.Errorf("owner's events %v, want [Release Own(took back)]", got)
		}
		// It owns the node again: another successor queues behind it.
		b := newFakeProcess(t, "successor", lock)
		if err := b.start(); err != nil {
			t.Fatal(err)
		}
		if s := b.state(); s != Waiting {
			t.Errorf("a second successor is %s, want waiting", s)
		}
	})

	t.Run("the successor leaves at exit; the owner keeps the node", func(t *testing.T) {
		lock := filepath.Join(t.TempDir(), "nodelocaldns.lock")
		a, b := newFakeProcess(t, "owner", lock), newFakeProcess(t, "successor", lock)
		if err := a.start(); err != nil {
			t.Fatal(err)
		}
		if err := b.start(); err != nil {
			t.Fatal(err)
		}
		a.await("the owner sees a successor queued", func() bool { return a.s.SuccessorQueued() })
		if !b.exit() {
			t.Error("a waiting successor's exit must be done with the node")
		}
		a.await("the owner sees the line empty", func() bool { return !a.s.SuccessorQueued() })
		if s := a.state(); s != Owning {
			t.Errorf("owner: %s, want owning", s)
		}
		if got := a.eventList(); len(got) != 0 {
			t.Errorf("owner's events %v, want none", got)
		}
	})

	t.Run("the old owner's exit takes an orphaned node back to leave it as an owner", func(t *testing.T) {
		lock := filepath.Join(t.TempDir(), "nodelocaldns.lock")
		a := newFakeProcess(t, "owner", lock)
		if err := a.start(); err != nil {
			t.Fatal(err)
		}
		q, err := Queue(a.cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := q.Ready(); err != nil {
			t.Fatal(err)
		}
		a.await("the owner hands off", func() bool { return a.s.State() == HandedOff })
		_ = q.Close()
		a.mu.Lock()
		done := a.s.Leave(context.Background(), "exit", fakeEndpoints)
		events := slices.Clone(a.events)
		a.mu.Unlock()
		if done {
			t.Error("the exit of an owner whose successor left must leave the node as an owner does")
		}
		if !slices.Equal(events, []string{"Release", "Own(at exit)"}) {
			t.Errorf("owner's events %v, want [Release Own(at exit)]", events)
		}
	})

	t.Run("a successor that does not serve what its owner serves is refused", func(t *testing.T) {
		lock := filepath.Join(t.TempDir(), "nodelocaldns.lock")
		a, b := newFakeProcess(t, "owner", lock), newFakeProcess(t, "stray", lock)
		if err := a.start(); err != nil {
			t.Fatal(err)
		}
		b.s.ownerEndpoints = func(*Successor, context.Context) ([]netip.AddrPort, error) {
			return append(slices.Clone(fakeEndpoints), netip.MustParseAddrPort("169.254.20.10:5353")), nil
		}
		err := b.start()
		if err == nil || !strings.Contains(err.Error(), "the owner serves 169.254.20.10:5353") {
			t.Fatalf("start: %v, want the endpoint it does not serve named", err)
		}
		if s := b.state(); s != Alone {
			t.Errorf("stray: %s, want alone", s)
		}
		// It left the line: a real successor can queue.
		c := newFakeProcess(t, "successor", lock)
		if err := c.start(); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("a successor whose addresses are not on the node is refused", func(t *testing.T) {
		lock := filepath.Join(t.TempDir(), "nodelocaldns.lock")
		a, b := newFakeProcess(t, "owner", lock), newFakeProcess(t, "successor", lock)
		if err := a.start(); err != nil {
			t.Fatal(err)
		}
		b.s.nodeAddrs = func(context.Context) ([]netip.Addr, error) { return []netip.Addr{fakeEndpoints[0].Addr()}, nil }
		err := b.start()
		if err == nil || !strings.Contains(err.Error(), "10.96.0.10 not on the node") {
			t.Fatalf("start: %v, want 10.96.0.10 not on the node", err)
		}
	})
}

func TestSuccessionDrainWaitsForQueriesAndSockets(t *testing.T) {
	p := newFakeProcess(t, "cache", filepath.Join(t.TempDir(), "nodelocaldns.lock"))
	p.sockets.idleAfter = 2
	var checks atomic.Int64
	p.s.hooks.InFlight = func() int64 {
		// A query in flight for the first few checks, then none.
		if checks.Add(1) <= 4 {
			return 1
		}
		return 0
	}
	p.s.Drain("test", fakeEndpoints)
	// A round with busy sockets, then rounds with a query in flight, then
	// drainQuietChecks quiet ones in a row.
	idle := 0
	for _, op := range p.sockets.log() {
		if strings.HasPrefix(op, "Idle(") {
			idle++
		}
	}
	if got := checks.Load(); got < 4+drainQuietChecks {
		t.Errorf("%d in-flight checks, want at least %d: the drain ended while a query was answered", got, 4+drainQuietChecks)
	}
	if idle < 2+2*(4+drainQuietChecks) {
		t.Errorf("%d socket checks: %v", idle, p.sockets.log())
	}
}
