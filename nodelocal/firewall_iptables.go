//go:build linux

package nodelocal

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/nodelocaldns/nodelocaldns/nodelocal/internal/rules"
)

// iptablesFirewall is the firewall of an iptables flavour (legacy or nft): chains of our own in the raw and
// filter tables of iptables and ip6tables for the cache (rules.NodeCache), a nat chain and marker chains for
// the divert (rules.Guard), a rule in raw OUTPUT for the probes. Its commands run with rules.Manager.
type iptablesFirewall struct {
	backend *rules.Backend
	rules   *rules.Manager
	log     Logger

	// applied holds the families whose cache rules this firewall has written (or may have: a failed write).
	applied map[rules.Family]bool
	// lastRules holds the cache's ruleset of each family as last synced, to tell repairs from changes.
	lastRules map[rules.Family]rules.Ruleset
	// leftoversChecked is set once the first sync looked for cache rules of families nobody claims.
	leftoversChecked bool
	// probed holds the families where the probe exemption is, or may be, in place: an iptables-restore
	// killed because its context ended can have committed just before. Removal looks in all of them; an
	// add that failed is tried again.
	probed map[rules.Family]bool
	// probeInstalled holds the families where it is known to be in place.
	probeInstalled map[rules.Family]bool
}

func newIPTablesFirewall(b *rules.Backend, lockWait time.Duration, log Logger) *iptablesFirewall {
	return &iptablesFirewall{
		backend:        b,
		rules:          rules.NewManager(b, rules.ManagerOptions{LockWait: lockWait}),
		log:            log,
		applied:        map[rules.Family]bool{},
		lastRules:      map[rules.Family]rules.Ruleset{},
		probed:         map[rules.Family]bool{},
		probeInstalled: map[rules.Family]bool{},
	}
}

func (f *iptablesFirewall) Mode() rules.Mode { return f.backend.Mode }
func (f *iptablesFirewall) Reason() string   { return f.backend.Reason }

// Families keeps the families whose commands are installed.
func (f *iptablesFirewall) Families(fams []rules.Family) []rules.Family {
	var out []rules.Family
	for _, fam := range fams {
		if _, err := f.backend.Tools(fam); err == nil && !slices.Contains(out, fam) {
			out = append(out, fam)
		}
	}
	return out
}

func cacheRuleset(fam rules.Family, eps []rules.Endpoint, repliesOnly bool) rules.Ruleset {
	return rules.NodeCache(fam, rules.NodeCacheSpec{Endpoints: eps, RepliesOnly: repliesOnly})
}

// endpointsOfFamily returns those of eps of family fam: each family's chains hold its own.
func endpointsOfFamily(eps []rules.Endpoint, fam rules.Family) []rules.Endpoint {
	var out []rules.Endpoint
	for _, e := range eps {
		if rules.FamilyOf(e.Addr) == fam {
			out = append(out, e)
		}
	}
	return out
}

func (f *iptablesFirewall) SyncCache(ctx context.Context, endpoints []rules.Endpoint) (cacheSync, error) {
	var (
		errs []error
		res  cacheSync
	)
	for _, fam := range rules.Families {
		eps := endpointsOfFamily(endpoints, fam)
		if len(eps) == 0 {
			if err := f.removeFamily(ctx, fam, !f.leftoversChecked); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		if _, err := f.backend.Tools(fam); err == nil {
			f.applied[fam] = true
		}
		rs := cacheRuleset(fam, eps, false)
		sync, err := f.rules.Sync(ctx, rs)
		if err != nil {
			errs = append(errs, rulesError(fmt.Sprintf("sync %s rules", fam), err))
			continue
		}
		for _, a := range sync.Ahead {
			res.Ahead = append(res.Ahead, aheadRule(a))
			f.log.Warningf("nodelocal: %s was ahead of the jump to the cache's chain, so the cache's rules did not apply to the traffic it matched; "+
				"the jump is back in front of it (whatever inserts it there may do so again)", aheadRule(a))
		}
		if sync.Changed {
			if last, ok := f.lastRules[fam]; ok && sameRuleset(last, rs) {
				f.log.Warningf("nodelocal: repaired %s rules: rewrote chains %v, jumps %v", fam, sync.RewrittenChains, sync.RepairedJumps)
			} else {
				f.log.Infof("nodelocal: wrote %s rules for %d endpoints", fam, len(eps))
			}
		}
		f.lastRules[fam] = rs
		res.Rules += sync.Rules
		res.Covered = append(res.Covered, addressesOf(eps)...)
	}
	f.leftoversChecked = true
	return res, errors.Join(errs...)
}

// removeFamily deletes the cache's rules of a family nobody claims. For a family this firewall never wrote
// (leftovers of an earlier run, looked for once) a failure is only logged: no command for that family may
// ever have worked on this node.
func (f *iptablesFirewall) removeFamily(ctx context.Context, fam rules.Family, lookForLeftovers bool) error {
	if !f.applied[fam] {
		if !lookForLeftovers {
			return nil
		}
		if _, err := f.backend.Tools(fam); err != nil {
			return nil // no tools for the family: nothing of ours can be there
		}
	}
	if err := f.rules.Delete(ctx, cacheRuleset(fam, nil, false)); err != nil {
		if f.applied[fam] {
			return rulesError(fmt.Sprintf("delete %s rules", fam), err)
		}
		f.log.Warningf("nodelocal: could not look for leftover %s rules: %v", fam, err)
		return nil
	}
	if f.applied[fam] {
		f.log.Infof("nodelocal: deleted %s rules", fam)
	}
	f.applied[fam] = false
	delete(f.lastRules, fam)
	return nil
}

// NarrowCache rewrites the raw chains to exempt only the cache's answers (rules.NodeCacheSpec.RepliesOnly).
func (f *iptablesFirewall) NarrowCache(ctx context.Context, endpoints []rules.Endpoint) error {
	for _, fam := range f.Families(familiesOfEndpoints(endpoints)) {
		if _, err := f.rules.Sync(ctx, cacheRuleset(fam, endpointsOfFamily(endpoints, fam), true)); err != nil {
			return rulesError(fmt.Sprintf("narrow the %s rules to the answers", fam), err)
		}
	}
	return nil
}

func (f *iptablesFirewall) UnhookCache(ctx context.Context, fams []rules.Family) error {
	var errs []error
	for _, fam := range f.Families(fams) {
		if err := f.rules.RemoveJumps(ctx, cacheRuleset(fam, nil, false)); err != nil {
			errs = append(errs, rulesError(fmt.Sprintf("remove the %s jumps", fam), err))
		}
	}
	return errors.Join(errs...)
}

func (f *iptablesFirewall) CacheHooked(ctx context.Context, fams []rules.Family) (bool, error) {
	for _, fam := range f.Families(fams) {
		has, err := f.rules.HasJumps(ctx, cacheRuleset(fam, nil, false))
		if err != nil {
			return false, rulesError(fmt.Sprintf("read the cache's %s jumps", fam), err)
		}
		if has {
			return true, nil
		}
	}
	return false, nil
}

func (f *iptablesFirewall) CacheEndpoints(ctx context.Context) ([]rules.Endpoint, error) {
	var out []rules.Endpoint
	for _, fam := range f.Families(rules.Families) {
		eps, err := f.rules.CachedEndpoints(ctx, fam, rules.NodeCacheSpec{})
		if err != nil {
			return nil, rulesError(fmt.Sprintf("read the cache's %s rules", fam), err)
		}
		out = append(out, eps...)
	}
	return rules.SortEndpoints(out), nil
}

// PlanDivert routes each wanted divert, per protocol, to the upstream ClusterIP where that is an address
// of the node (IPVS mode: a DNAT to it, and IPVS takes it from there), and elsewhere to the endpoints
// kube-proxy's iptables mode DNATs the ClusterIP to (its KUBE-SEP-* chains), read now. A DNAT to the
// ClusterIP would not do there: a DNAT ends the nat table's walk, so kube-proxy's DNAT would never see the
// packet. Nothing of the divert refers to kube-proxy's Service chains, which kube-proxy must be free to
// delete (the Service or its endpoints gone) while a divert stands; RefreshDivert follows the endpoints.
func (f *iptablesFirewall) PlanDivert(ctx context.Context, fams []rules.Family, wants []rules.Divert, local []netip.Addr) (divertPlan, error) {
	fams = f.Families(fams)
	p, unserved, err := planDivert(ctx, fams, wants, local, func(ctx context.Context, svc netip.Addr, proto rules.Protocol, port uint16) ([]netip.AddrPort, bool, error) {
		if !slices.Contains(fams, rules.FamilyOf(svc)) {
			return nil, false, nil // no tools of the family
		}
		return f.rules.KubeProxyEndpoints(ctx, svc, proto, port)
	})
	if err == nil && len(unserved) > 0 && len(p.Diverts) > 0 {
		f.log.Warningf("nodelocal: kube-proxy's rules have no endpoints for %v: lookups diverted there fail until the cache is back", unserved)
	}
	return p, err
}

func (f *iptablesFirewall) WriteDivert(ctx context.Context, p divertPlan) error {
	for _, fam := range p.Families {
		if _, err := f.rules.Sync(ctx, rules.Guard(fam, p.Routes)); err != nil {
			return rulesError(fmt.Sprintf("write the %s divert", fam), err)
		}
	}
	return nil
}

func (f *iptablesFirewall) RefreshDivert(ctx context.Context, p divertPlan) (bool, error) {
	rewrote := false
	for _, fam := range p.Families {
		ok, err := f.rules.RewriteGuardWhileMarked(ctx, fam, p.Routes)
		if err != nil {
			return rewrote, rulesError(fmt.Sprintf("rewrite the %s divert", fam), err)
		}
		rewrote = rewrote || ok
	}
	return rewrote, nil
}

func (f *iptablesFirewall) DeleteDivert(ctx context.Context, fams []rules.Family) (bool, error) {
	found, err := f.Diverted(ctx, fams)
	if err != nil {
		return false, err
	}
	for _, fam := range f.Families(fams) {
		if err := f.rules.Delete(ctx, rules.Guard(fam, nil)); err != nil {
			return found, rulesError(fmt.Sprintf("remove the %s divert", fam), err)
		}
	}
	return found, nil
}

// Diverted looks for the guard's chain in the nat table: one read per family, for every sync of the cache.
// A reclaim deletes it first (its table commits first), so a node whose reclaim is under way counts as the
// cache's; UnhookCacheWhileDiverted checks the markers in the tables of the jumps themselves.
func (f *iptablesFirewall) Diverted(ctx context.Context, fams []rules.Family) (bool, error) {
	for _, fam := range f.Families(fams) {
		ok, err := f.rules.ChainExists(ctx, fam, rules.NAT, rules.GuardChain)
		if err != nil {
			return false, rulesError(fmt.Sprintf("look for the %s divert", fam), err)
		}
		if ok {
			return true, nil
		}
	}
	return false, nil
}

func (f *iptablesFirewall) UnhookCacheWhileDiverted(ctx context.Context, fams []rules.Family) (marked, unhooked bool, err error) {
	for _, fam := range f.Families(fams) {
		m, removed, err := f.rules.RemoveJumpsWhileMarked(ctx, cacheRuleset(fam, nil, false), rules.GuardChain)
		if err != nil {
			return marked, unhooked, rulesError(fmt.Sprintf("remove the cache's %s jumps", fam), err)
		}
		marked = marked || m
		unhooked = unhooked || removed
	}
	return marked, unhooked, nil
}

func (f *iptablesFirewall) AddProbeExemption(ctx context.Context, mark uint32, addrs []netip.Addr) error {
	var errs []error
	for _, fam := range familiesOf(addrs) {
		if f.probeInstalled[fam] {
			continue
		}
		f.probed[fam] = true
		if err := f.rules.AddProbeExemption(ctx, fam, mark); err != nil {
			errs = append(errs, rulesError(fmt.Sprintf("add the %s probe exemption", fam), err))
			continue
		}
		f.probeInstalled[fam] = true
	}
	return errors.Join(errs...)
}

func (f *iptablesFirewall) RemoveProbeExemption(ctx context.Context, mark uint32) error {
	var errs []error
	for _, fam := range rules.Families {
		if !f.probed[fam] {
			continue
		}
		// Removing a rule that is not there is not an error.
		if err := f.rules.RemoveProbeExemption(ctx, fam, mark); err != nil {
			errs = append(errs, rulesError(fmt.Sprintf("remove the %s probe exemption", fam), err))
			continue
		}
		delete(f.probed, fam)
		delete(f.probeInstalled, fam)
	}
	return errors.Join(errs...)
}

func sameRuleset(a, b rules.Ruleset) bool {
	return a.Family == b.Family && slices.EqualFunc(a.Chains, b.Chains, func(x, y rules.Chain) bool {
		return x.Table == y.Table && x.Name == y.Name && slices.Equal(x.Hooks, y.Hooks) && x.JumpComment == y.JumpComment &&
			slices.EqualFunc(x.Rules, y.Rules, func(p, q rules.Rule) bool { return slices.Equal(p, q) })
	})
}

// Inspect checks, per family of endpoints, that the cache's raw and filter chains hold the rules for every
// endpoint and that each hook jumps to them first, and that the guard's nat chain is not there. It reads
// whole tables with iptables-save.
func (f *iptablesFirewall) Inspect(ctx context.Context, endpoints []rules.Endpoint) []RuleCheck {
	var out []RuleCheck
	backend := "iptables-" + string(f.Mode())
	for _, fam := range rules.Families {
		eps := endpointsOfFamily(endpoints, fam)
		if len(eps) == 0 {
			continue
		}
		check := func(target string, ok bool, format string, args ...any) {
			out = append(out, RuleCheck{Check: "rules", Target: target, OK: ok, Detail: fmt.Sprintf(format, args...)})
		}
		for _, c := range cacheRuleset(fam, eps, false).Chains {
			target := fmt.Sprintf("%s %s %s/%s", backend, fam, c.Table, c.Name)
			st, err := f.rules.Inspect(ctx, fam, c.Table)
			if err != nil {
				check(target, false, "reading the table: %v", err)
				continue
			}
			have, ok := st.Chains[c.Name]
			if !ok {
				check(target, false, "no chain %s", c.Name)
				continue
			}
			missing := 0
			for _, r := range c.Rules {
				if !slices.ContainsFunc(have, func(h rules.Rule) bool { return slices.Equal(h, r) }) {
					missing++
				}
			}
			var notFirst []string
			for _, hook := range c.Hooks {
				hr := st.Chains[hook]
				if len(hr) > 0 && hr[0].Target() == c.Name {
					continue
				}
				ahead := rules.RulesAhead(fam, c.Table, hook, hr, c.Name)
				if len(ahead) == 0 {
					notFirst = append(notFirst, "no jump from "+hook)
					continue
				}
				for _, a := range ahead {
					notFirst = append(notFirst, aheadRule(a).String()+" is ahead of the jump from "+hook)
				}
			}
			switch {
			case missing > 0:
				check(target, false, "%d of the %d rules for %v are missing", missing, len(c.Rules), addressesOf(eps))
			case len(notFirst) > 0:
				check(target, false, "the jump to %s is not the first rule: %s", c.Name, strings.Join(notFirst, "; "))
			default:
				check(target, true, "%d rules, jumped to first from %s (%s)", len(have), strings.Join(c.Hooks, ", "), f.Reason())
			}
		}
		target := backend + " " + fam.String()
		nat, err := f.rules.Inspect(ctx, fam, rules.NAT)
		switch {
		case err != nil:
			out = append(out, RuleCheck{Check: "fail-open", Target: target, Detail: fmt.Sprintf("reading the nat table: %v", err)})
		case nat.ChainExists(rules.GuardChain):
			out = append(out, RuleCheck{Check: "fail-open", Target: target,
				Detail: fmt.Sprintf("chain %s exists: the guard failed the node open and the cache has not taken it back", rules.GuardChain)})
		default:
			out = append(out, RuleCheck{Check: "fail-open", Target: target, OK: true, Detail: "no " + rules.GuardChain + " chain"})
		}
	}
	return out
}
