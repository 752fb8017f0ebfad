//go:build linux

package nodelocal

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/nodelocaldns/nodelocaldns/nodelocal/internal/rules"
)

// How a Reconciler's syncs put the leases' claims in place (syncLocked), take the node back from a
// fail-open, tear down, and keep Status.

// wanted is the union of the leases' claims.
type wanted struct {
	addrs     []netip.Addr
	endpoints []rules.Endpoint
}

func (r *Reconciler) wantedLocked() wanted {
	var w wanted
	for l := range r.leases {
		w.addrs = append(w.addrs, l.claim.Addresses...)
		if l.rules {
			w.endpoints = append(w.endpoints, rules.Endpoints(l.claim.Addresses, l.claim.DNSPort, l.claim.ExtraTCPPorts)...)
		}
	}
	slices.SortFunc(w.addrs, netip.Addr.Compare)
	w.addrs = slices.Compact(w.addrs)
	w.endpoints = rules.SortEndpoints(w.endpoints)
	return w
}

// syncScope says what a sync puts in place.
type syncScope uint8

const (
	// syncLink puts the link and its addresses in place.
	syncLink syncScope = 1 << iota
	// syncRules puts the rules in place.
	syncRules
	// syncReclaim takes the node back from the fail-open guard (or from a hand-over) first; it implies
	// syncLink, since the guard took addresses away.
	syncReclaim
)

// syncLocked puts the link and the rules in place as the leases claim them. With syncReclaim it also
// takes the node back from the fail-open guard: first the guard's divert and marks go, then the addresses
// come back, then the jumps, the order Guard.keepOutLocked relies on. Without it, while the guard's divert
// is there, it keeps the jumps out and does not put back addresses the link lost (the guard took the
// kube-dns ClusterIP out so that kube-proxy serves it).
//
// A repair (Ensure) on an nftables-based backend (iptables-nft, nftables) first reads the ruleset's
// generation (rules.NFTGeneration), which the kernel counts up at every change by anyone: when it is where
// the last repair that found everything in place left it, for the same endpoints, nothing changed since,
// and the rules are not read again (for iptables-nft that is a handful of iptables-save runs a minute, most
// of what an idle cache does). The link is checked every time. A repair records the generation only when it
// wrote nothing and nothing changed while it read (the same generation before and after), so that a change
// made while it looked is never taken for the state it found.
func (r *Reconciler) syncLocked(ctx context.Context, scope syncScope) error {
	if len(r.leases) == 0 {
		return nil
	}
	w := r.wantedLocked()
	var errs []error
	reclaim := scope&syncReclaim != 0
	// Taking the node back puts back the addresses the guard removed, whoever calls (EnableRules too).
	doLink := scope&syncLink != 0 || reclaim
	doRules := scope&syncRules != 0 && !r.cfg.NoRules
	repair := scope == syncLink|syncRules && doRules
	checked := r.unchanged
	r.unchanged = rulesUnchanged{}
	gen, genRead := uint32(0), false
	if repair && nftBased(r.fw.current()) {
		if g, err := rules.NFTGeneration(); err == nil {
			gen, genRead = g, true
		}
	}
	sig := fmt.Sprint(w.endpoints)
	failedOpen := false
	if genRead && checked.valid && checked.gen == gen && checked.endpoints == sig {
		r.unchanged = checked
		failedOpen = checked.failedOpen
		doRules = false
	}
	rulesRead := doRules
	switch {
	case doRules && len(w.endpoints) > 0:
		var err error
		if failedOpen, err = r.guardLocked(ctx, familiesOfEndpoints(w.endpoints), reclaim); err != nil {
			errs = append(errs, err)
			doRules = false
		}
	case doRules && len(w.addrs) > 0:
		// No lease has its rules yet (a cache starting, its server not probed yet): its repairs honour a
		// fail-open all the same, and leave off the addresses the guard keeps out, so that they do not
		// fight the guard over them. Before a backend can be chosen there is no divert to honour.
		var err error
		if failedOpen, err = r.guardLocked(ctx, familiesOf(w.addrs), false); err != nil && !backendPending(err) {
			errs = append(errs, err)
		}
	}
	if doLink && r.link != nil {
		addrs := w.addrs
		if failedOpen {
			addrs = r.heldLocked(ctx, addrs)
		}
		if err := r.syncLinkLocked(ctx, addrs); err != nil {
			errs = append(errs, err)
		}
	}
	if doRules && !failedOpen {
		if err := r.syncRulesLocked(ctx, w.endpoints); err != nil {
			errs = append(errs, err)
		}
	}
	err := errors.Join(errs...)
	if genRead && rulesRead && err == nil {
		if after, gerr := rules.NFTGeneration(); gerr == nil && after == gen {
			r.unchanged = rulesUnchanged{valid: true, gen: gen, endpoints: sig, failedOpen: failedOpen}
		}
	}
	r.noteAttempt(err)
	return err
}

// rulesUnchanged is what a repair that found the rules in place recorded: the nftables generation it saw,
// for which endpoints, and whether the node had failed open.
type rulesUnchanged struct {
	valid      bool
	gen        uint32
	endpoints  string
	failedOpen bool
}

// nftBased reports whether fw keeps its rules in nftables, where every change counts up the ruleset's
// generation: iptables-nft and the nftables backend, not iptables-legacy, nor a backend not yet chosen.
func nftBased(fw firewall) bool {
	return fw != nil && (fw.Mode() == rules.NFT || fw.Mode() == rules.NFTables)
}

// heldLocked returns those of addrs the link holds now; all of them when the link cannot be read (the link
// sync that follows reports why).
func (r *Reconciler) heldLocked(ctx context.Context, addrs []netip.Addr) []netip.Addr {
	have, err := r.link.Addresses(ctx)
	if err != nil {
		return addrs
	}
	var held []netip.Addr
	for _, a := range addrs {
		if slices.Contains(have, a) {
			held = append(held, a)
		}
	}
	return held
}

// guardLocked looks for the fail-open guard's divert in fams. Found, with reclaim it removes it; without,
// it reports the node failed open, so that the jumps and the addresses the guard took out stay out.
func (r *Reconciler) guardLocked(ctx context.Context, fams []rules.Family, reclaim bool) (failedOpen bool, err error) {
	fw, err := r.fw.get(ctx)
	if err != nil {
		return false, err
	}
	diverted, err := fw.Diverted(ctx, fams)
	if err != nil {
		return false, err
	}
	switch {
	case diverted && !reclaim:
		if !r.guardLogged {
			r.log.Warningf("nodelocal: the fail-open guard has diverted DNS (%v); the jumps stay out until the cache answers and reclaims the node", fams)
			r.guardLogged = true
		}
		r.setStatus(func(s *Status) { s.GuardFailedOpen, s.RulesPresent = true, false })
		return true, nil
	case diverted:
		// The divert goes first: until the jumps are back, the cache gets the link-local traffic
		// through conntrack and kube-proxy still serves the ClusterIP, so nothing is lost in between.
		if _, err := fw.DeleteDivert(ctx, fams); err != nil {
			return false, err
		}
		r.log.Infof("nodelocal: the cache answers; removed the fail-open guard's divert (%v) and reclaimed the node", fams)
	}
	r.guardLogged = false
	r.setStatus(func(s *Status) { s.GuardFailedOpen = false })
	return false, nil
}

func (r *Reconciler) syncLinkLocked(ctx context.Context, addrs []netip.Addr) error {
	res, err := r.link.Ensure(ctx, addrs)
	if err != nil {
		return linkError("ensure link "+r.cfg.Interface, err)
	}
	name := r.cfg.Interface
	if res.FellBack && !r.fallbackLogged {
		r.log.Warningf("nodelocal: the kernel has no dummy link type; %s is a bridge with no ports instead", name)
		r.fallbackLogged = true
	}
	if res.Created {
		r.log.Infof("nodelocal: created link %s (%s)", name, res.Kind)
	}
	if res.BroughtUp && !res.Created {
		r.log.Warningf("nodelocal: link %s was down; set it up", name)
	}
	if len(res.Added) > 0 {
		r.log.Infof("nodelocal: added %v to %s", res.Added, name)
	}
	if len(res.Removed) > 0 {
		r.log.Infof("nodelocal: removed %v from %s", res.Removed, name)
	}
	if foreign := fmt.Sprint(res.Foreign); len(res.Foreign) > 0 && foreign != r.foreignLogged {
		r.log.Warningf("nodelocal: %s also holds %s, which we did not add; leaving them", name, foreign)
		r.foreignLogged = foreign
	}
	r.setStatus(func(s *Status) {
		s.LinkKind, s.LinkOwned = res.Kind, res.Owned
		s.Addresses, s.ForeignAddresses = res.Present, res.Foreign
	})
	return nil
}

// syncRulesLocked makes the node hold the cache's rules for endpoints; with none it deletes them.
func (r *Reconciler) syncRulesLocked(ctx context.Context, endpoints []rules.Endpoint) error {
	fw, err := r.fw.get(ctx)
	if err != nil {
		return err
	}
	r.setStatus(func(s *Status) { s.Backend, s.BackendReason = string(fw.Mode()), fw.Reason() })
	res, err := fw.SyncCache(ctx, endpoints)
	r.setStatus(func(s *Status) {
		s.RulesPresent = err == nil && len(endpoints) > 0
		s.Rules, s.RuleAddresses, s.Ahead = res.Rules, res.Covered, res.Ahead
		s.RuleSyncs++
	})
	return err
}

func (r *Reconciler) teardownLocked(ctx context.Context) error {
	for l := range r.leases {
		l.released = true
	}
	clear(r.leases)
	r.noteLeases()
	var errs []error
	if !r.cfg.NoRules {
		if err := r.syncRulesLocked(ctx, nil); backendPending(err) {
			// Still waiting for kube-proxy's rules: this Reconciler has written none of its own.
			r.log.Infof("nodelocal: teardown: no rules backend chosen yet, so no rules of ours to remove")
		} else if err != nil {
			errs = append(errs, err)
		}
	}
	if r.link != nil {
		if err := r.link.Teardown(ctx); err != nil {
			errs = append(errs, linkError("tear down link "+r.cfg.Interface, err))
		}
	}
	err := errors.Join(errs...)
	if err == nil {
		r.setStatus(func(s *Status) {
			s.LinkKind, s.LinkOwned = "", false
			s.Addresses, s.ForeignAddresses = nil, nil
			s.RulesPresent, s.Rules, s.RuleAddresses = false, 0, nil
		})
	}
	r.noteAttempt(err)
	return err
}

// setStatus changes the status under its lock: the one place that writes Status.
func (r *Reconciler) setStatus(change func(*Status)) {
	r.statusMu.Lock()
	defer r.statusMu.Unlock()
	change(&r.status)
}

func (r *Reconciler) noteLeases() {
	n := len(r.leases)
	r.setStatus(func(s *Status) { s.Leases = n })
}

func (r *Reconciler) noteAttempt(err error) {
	now := time.Now()
	r.setStatus(func(s *Status) {
		s.LastAttempt, s.LastError = now, err
		if err == nil {
			s.LastSync = now
		}
	})
}
