//go:build linux

package nodelocal

import (
	"context"
	"errors"
	"net/netip"

	"github.com/nodelocaldns/nodelocaldns/nodelocal/internal/rules"
)

// A fail-open, step by step: the guard's (failOpenLocked, then keepOutLocked at each recheck while the node
// stays failed open, and followEndpointsLocked), written with writeDivert, which a cache handing its node
// over (Reconciler.HandOver) uses too.

// FailOpen fails open at once, whatever the probes say: for an operator, or a test. It fails, leaving the
// node to the cache, when the cache took the node back while it was under way.
func (g *Guard) FailOpen(ctx context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
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
	fw, err := g.fw.get(ctx)
	if err != nil {
		return err
	}
	// The divert and its marks go first: they are also the word to the cache's repair loop to keep its
	// jumps out, and the condition of their removal.
	plan, err := writeDivert(ctx, fw, g.nodeAddrs, g.fams, g.diverts)
	if err != nil {
		return err
	}
	if len(plan.Skipped) > 0 {
		g.log.Warningf("nodelocal guard: not diverting %v: kube-proxy serves the upstream neither as an address of this node (IPVS) nor "+
			"in its own rules (iptables and nftables modes); Pods that ask the kube-dns ClusterIP are served", plan.Skipped)
	}
	k, err := g.keepOutLocked(ctx, fw)
	if err != nil {
		return err
	}
	if !k.marked {
		return errTakenBack
	}
	g.routes = plan.Routes
	if _, err := g.forgetFlows(plan.Endpoints()); err != nil {
		g.log.Warningf("nodelocal guard: %v", err)
	}
	g.log.Warningf("nodelocal guard: failed open: removed the cache's jumps and %v from %s; diverting %v",
		k.addresses, g.cfg.Interface, plan.Routes)
	return nil
}

// followEndpointsLocked keeps the divert pointed at the endpoints kube-dns-upstream has now: it plans the
// divert again and, when the routes differ from those in place (a cluster-DNS Pod moved, or the divert is
// a hand-over's or an earlier guard's), rewrites them while the node stays marked failed open. A failure
// is logged and tried again at the next recheck.
func (g *Guard) followEndpointsLocked(ctx context.Context, fw firewall) {
	plan, err := planDivertNow(ctx, fw, g.nodeAddrs, g.fams, g.diverts)
	if err != nil {
		g.log.Warningf("nodelocal guard: could not check the divert against kube-dns-upstream's endpoints: %v", err)
		return
	}
	if g.routes != nil && rules.SameDivertRoutes(plan.Routes, g.routes) {
		return
	}
	rewrote, err := fw.RefreshDivert(ctx, plan)
	switch {
	case err != nil:
		g.log.Warningf("nodelocal guard: could not point the divert at kube-dns-upstream's endpoints %v: %v", plan.Routes, err)
	case rewrote:
		if g.routes != nil {
			g.log.Infof("nodelocal guard: kube-dns-upstream's endpoints changed: diverting %v", plan.Routes)
		}
		g.routes = plan.Routes
	}
}

// writeDivert plans the divert of wants in the node's kube-proxy mode and writes it with the marks that say
// the node has failed open in fams: the first step of a fail-open, by the guard or by a cache that stops
// without a successor (Reconciler.HandOver).
func writeDivert(ctx context.Context, fw firewall, nodeAddrs func(context.Context) ([]netip.Addr, error), fams []rules.Family, wants []rules.Divert) (divertPlan, error) {
	plan, err := planDivertNow(ctx, fw, nodeAddrs, fams, wants)
	if err != nil {
		return divertPlan{}, err
	}
	if err := fw.WriteDivert(ctx, plan); err != nil {
		return divertPlan{}, err
	}
	return plan, nil
}

// planDivertNow plans the divert of wants with the node's addresses and kube-proxy's rules as they are now.
func planDivertNow(ctx context.Context, fw firewall, nodeAddrs func(context.Context) ([]netip.Addr, error), fams []rules.Family, wants []rules.Divert) (divertPlan, error) {
	local, err := nodeAddrs(ctx)
	if err != nil {
		return divertPlan{}, err
	}
	return fw.PlanDivert(ctx, fams, wants, local)
}

// keptOut is what keepOutLocked found and did.
type keptOut struct {
	// marked is true when the guard's marks were in place in some family: the node is failed open.
	marked bool
	// unhooked is set when it took the cache's jumps out; addresses are the Service addresses it removed.
	unhooked  bool
	addresses []netip.Addr
}

// keepOutLocked takes the cache's jumps and the Service addresses out, as long as the guard's marks are in
// place. The cache takes the node back in the opposite order (marks, then addresses, then jumps), so:
// jumps go only in a transaction that finds the marks (firewall.UnhookCacheWhileDiverted), and Service
// addresses removed while the marks went away are given back.
func (g *Guard) keepOutLocked(ctx context.Context, fw firewall) (keptOut, error) {
	if g.beforeJumpRemoval != nil {
		g.beforeJumpRemoval()
	}
	var k keptOut
	var err error
	if k.marked, k.unhooked, err = fw.UnhookCacheWhileDiverted(ctx, g.fams); err != nil {
		return k, err
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
	still, err := fw.Diverted(ctx, g.fams)
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

// cacheJumpsPresentLocked reports whether the cache's rules see traffic: only then is there anything to
// fail open. With no backend chosen yet (no rules of the cache or of kube-proxy on the node) there is not.
func (g *Guard) cacheJumpsPresentLocked(ctx context.Context) (bool, error) {
	fw, err := g.fw.get(ctx)
	if backendPending(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return fw.CacheHooked(ctx, g.fams)
}

// divertPresentLocked reports whether the node has failed open.
func (g *Guard) divertPresentLocked(ctx context.Context) (bool, error) {
	fw, err := g.fw.get(ctx)
	if backendPending(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return fw.Diverted(ctx, g.fams)
}
