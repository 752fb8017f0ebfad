//go:build linux

package notrack

import (
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/nodelocaldns/nodelocaldns/nodelocal"
)

// reclaimProbeTimeout bounds one round of probes that decides whether to take the node back from the
// fail-open guard.
const reclaimProbeTimeout = 2 * time.Second

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
// server does not answer. Only the addresses the link holds are probed: while failed open the Reconciler
// leaves off those the guard removed. It takes and returns since when the server has answered (zero: it does not).
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
	if !n.settings.NoInterface {
		// Addresses the guard took off the link (the kube-dns ClusterIP) cannot be probed until the reclaim
		// puts them back; the listeners on them are this process's, as on the others.
		held := rec.Status().Addresses
		targets = slices.DeleteFunc(targets, func(t probeTarget) bool { return !slices.Contains(held, t.addr) })
	}
	n.mu.Unlock()
	if len(targets) == 0 {
		return time.Time{}
	}
	slices.SortFunc(targets, func(a, b probeTarget) int { return strings.Compare(a.String(), b.String()) })
	targets = slices.CompactFunc(targets, func(a, b probeTarget) bool { return a.endpoint == b.endpoint })

	probeCtx, cancel := context.WithTimeout(ctx, min(every, reclaimProbeTimeout))
	defer cancel()
	err := n.probe.Acquire(probeCtx, mode, targetAddrs(targets))
	if err != nil {
		countSetupError(err)
		n.releaseProbeExemption()
		log.Warningf("could not exempt probes from connection tracking to check whether to take the node back from the fail-open guard: %v", err)
		return time.Time{}
	}
	err = probeAll(probeCtx, targets, nil) // only the held addresses, above
	n.releaseProbeExemption()
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
