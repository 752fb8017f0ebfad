//go:build linux

package notrack

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nodelocaldns/nodelocaldns/nodelocal"
)

// Bounds of the calls that change the node at a start or a reload.
const (
	// acquireTimeout bounds putting a Corefile's addresses in place at its start.
	acquireTimeout = 30 * time.Second
	// releaseTimeout bounds dropping what a replaced Corefile alone claimed.
	releaseTimeout = 10 * time.Second
)

// processStart approximates when the process started: package initialisation runs first thing.
var processStart = time.Now()

// theNode is the process's one view of the node (this file: the node and the start and stop of instances
// on it; lease.go the shared leases, readiness.go the rules that follow the server answering, repair.go the
// periodic repair, shutdown.go the final teardown). CoreDNS sets a plugin up once per server block and again
// on every reload, but the link, the rules and the node lock belong to the process: the server blocks and
// the successive Corefiles share one Reconciler, as CoreDNS plugins share listeners across reloads.
var theNode = newNode()

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
	// aheadCounted is the Reconciler's RuleSyncs whose rules ahead rulesAhead counts already.
	aheadCounted int
	rulesLogged  bool

	// life is the context of everything that works on the Reconciler in the background (probes, repairs).
	// It has its own lock so that a final shutdown can end that work before it waits for mu.
	lifeMu  sync.Mutex
	life    context.Context
	endLife context.CancelFunc

	// probe keeps the probe exemption in place while this process probes its own addresses.
	probe *nodelocal.ProbeExemption

	// succ is the process's part in the node's changes of hands (succession.go).
	succ *nodelocal.Succession
	// inflight counts the queries the plugin chains are answering.
	inflight atomic.Int64
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
	if st := n.succ.State(); st != nodelocal.Alone && st != nodelocal.Owning {
		// A reload while the node changes hands: the owner's leases are taken over as a whole (own), or
		// not at all.
		n.live[in] = struct{}{}
		n.settings = in.settings
		return nil
	}
	if n.rec == nil {
		rec, err := nodelocal.New(in.settings.reconcilerConfig())
		if err != nil && first && nodelocal.KindOf(err) == nodelocal.KindNodeLock {
			return n.startAsSuccessor(life, in, err)
		}
		if err != nil {
			countSetupError(err)
			return fmt.Errorf("set up the node: %w", err)
		}
		n.rec, n.aheadCounted = rec, 0
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
		n.succ.Own(life, in.settings.reconcilerConfig(), n.rec)
	}
	n.updateGauges()
	if n.settings.NoRules {
		return nil
	}
	go n.probeAndEnable(in)
	return nil
}

// stop ends an instance. During a reload, with the new instance started, it drops what only the old
// instance claimed. When no instance is left, it is the final shutdown, which logs what it could not undo.
func (n *node) stop(in *instance) {
	n.mu.Lock()
	if _, ok := n.live[in]; !ok {
		n.mu.Unlock()
		return
	}
	delete(n.live, in)
	if len(n.live) == 0 {
		n.mu.Unlock()
		_ = n.finalShutdown("shutdown") // logged there
		return
	}
	defer n.mu.Unlock()
	if n.rec != nil {
		n.drop(in.keys())
	}
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
