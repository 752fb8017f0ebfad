//go:build linux

package notrack

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/nodelocaldns/nodelocaldns/nodelocal"
)

// enableTimeout bounds putting the rules in place once the server answers its own probes (probeAndEnable);
// the ready plugin then follows the rules (ready).
const enableTimeout = 30 * time.Second

// ready reports whether the block's rules are in place (or left to others) and the last sync succeeded.
func (n *node) ready(b *block) bool {
	if n.succ.SuccessorQueued() {
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
	rec := n.rec
	n.mu.Unlock()
	if len(targets) == 0 {
		return
	}
	slices.SortFunc(targets, func(a, b probeTarget) int { return strings.Compare(a.String(), b.String()) })
	targets = slices.CompactFunc(targets, func(a, b probeTarget) bool { return a.endpoint == b.endpoint })

	start := time.Now()
	// kube-proxy DNATs host traffic to the kube-dns ClusterIP as it does Pod traffic; without the probe
	// rule the probe of that address would reach kube-dns, not us.
	if err := n.probe.Acquire(in.ctx, mode, targetAddrs(targets)); err != nil {
		if in.ctx.Err() != nil {
			n.releaseProbeExemption()
			return
		}
		countSetupError(err)
		log.Warningf("could not exempt probes from connection tracking; addresses that kube-proxy DNATs will not answer them: %v", err)
	}
	err := probeAll(in.ctx, targets, rec)
	n.releaseProbeExemption()
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

func targetAddrs(targets []probeTarget) []netip.Addr {
	addrs := make([]netip.Addr, len(targets))
	for i, t := range targets {
		addrs[i] = t.addr
	}
	return addrs
}

func targetList(targets []probeTarget) string {
	s := make([]string, len(targets))
	for i, t := range targets {
		s[i] = t.String()
	}
	return strings.Join(s, ", ")
}
