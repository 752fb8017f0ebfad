//go:build linux

package nodelocal

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/nodelocaldns/nodelocaldns/nodelocal/internal/rules"
)

// nftablesFirewall is the firewall for kube-proxy's nftables mode: tables of family inet of our own (the
// cache's, the divert's, the probes'), each written in one netlink transaction (rules.NFTablesManager). One
// table holds both families, so the families the operations take are not needed here.
type nftablesFirewall struct {
	backend *rules.Backend
	nft     *rules.NFTablesManager
	log     Logger

	// written holds the endpoints of the cache's table as last synced, nil before.
	written []rules.Endpoint
	// probeAddrs are the addresses the probe table exempts answers from; nil while there is no table.
	probeAddrs []netip.Addr
}

func newNFTablesFirewall(b *rules.Backend, log Logger) *nftablesFirewall {
	return &nftablesFirewall{backend: b, nft: rules.NewNFTablesManager(), log: log}
}

func (f *nftablesFirewall) Mode() rules.Mode { return f.backend.Mode }
func (f *nftablesFirewall) Reason() string   { return f.backend.Reason }

// Families returns fams: netlink needs no command per family.
func (f *nftablesFirewall) Families(fams []rules.Family) []rules.Family { return slices.Clone(fams) }

func (f *nftablesFirewall) SyncCache(ctx context.Context, endpoints []rules.Endpoint) (cacheSync, error) {
	res, err := f.nft.SyncCache(ctx, endpoints, "")
	if err != nil {
		return cacheSync{}, rulesError("sync table inet "+rules.NFTablesTable, err)
	}
	switch {
	case len(endpoints) == 0 && f.written != nil:
		f.log.Infof("nodelocal: deleted table inet %s", rules.NFTablesTable)
	case res.Changed && slices.Equal(f.written, endpoints):
		f.log.Warningf("nodelocal: repaired table inet %s: %v", rules.NFTablesTable, res.Differences)
	case res.Changed:
		f.log.Infof("nodelocal: wrote table inet %s for %d endpoints", rules.NFTablesTable, len(endpoints))
	}
	f.written = nil
	if len(endpoints) > 0 {
		f.written = slices.Clone(endpoints)
	}
	return cacheSync{Rules: res.Rules, Covered: addressesOf(endpoints)}, nil
}

// NarrowCache unhooks the cache's table: nftables has no way here to leave only the cache's answers
// untracked, so the flows its last answers open are forgotten once it drained.
func (f *nftablesFirewall) NarrowCache(ctx context.Context, _ []rules.Endpoint) error {
	return f.UnhookCache(ctx, nil)
}

func (f *nftablesFirewall) UnhookCache(ctx context.Context, _ []rules.Family) error {
	if _, err := f.nft.UnhookCache(ctx); err != nil {
		return rulesError("unhook table inet "+rules.NFTablesTable, err)
	}
	return nil
}

func (f *nftablesFirewall) CacheHooked(ctx context.Context, _ []rules.Family) (bool, error) {
	ok, err := f.nft.CacheHooked(ctx)
	if err != nil {
		return false, rulesError("read the cache's table inet "+rules.NFTablesTable, err)
	}
	return ok, nil
}

func (f *nftablesFirewall) CacheEndpoints(ctx context.Context) ([]rules.Endpoint, error) {
	eps, err := f.nft.CacheEndpoints(ctx)
	if err != nil {
		return nil, rulesError("read the cache's table inet "+rules.NFTablesTable, err)
	}
	return eps, nil
}

// PlanDivert DNATs each wanted divert, per protocol, to the upstream ClusterIP where that is an address of
// the node, and elsewhere to the endpoints kube-proxy's nftables table DNATs the ClusterIP to, read now: a
// DNAT in the divert's table runs before kube-proxy's and ends NAT for the connection, so a DNAT to a
// ClusterIP that is not local would leave the node untranslated.
func (f *nftablesFirewall) PlanDivert(ctx context.Context, fams []rules.Family, wants []rules.Divert, local []netip.Addr) (divertPlan, error) {
	p, unserved, err := planDivert(ctx, fams, wants, local, func(ctx context.Context, svc netip.Addr, proto rules.Protocol, port uint16) ([]netip.AddrPort, bool, error) {
		eps, err := f.nft.KubeProxyEndpoints(ctx, svc, proto, port)
		return eps, false, err
	})
	if err == nil && len(unserved) > 0 && len(p.Diverts) > 0 {
		f.log.Warningf("nodelocal: kube-proxy's nftables table has no endpoints for %v: lookups diverted there fail until the cache is back", unserved)
	}
	return p, err
}

func (f *nftablesFirewall) WriteDivert(ctx context.Context, p divertPlan) error {
	for _, r := range p.Routes {
		f.log.Infof("nodelocal: diverting %v", r)
	}
	if err := f.nft.WriteGuard(ctx, p.Routes); err != nil {
		return rulesError("write the divert (table inet "+rules.NFTablesGuardTable+")", err)
	}
	return nil
}

func (f *nftablesFirewall) RefreshDivert(ctx context.Context, p divertPlan) (bool, error) {
	ok, err := f.nft.RewriteGuardWhileMarked(ctx, p.Routes)
	if err != nil {
		return false, rulesError("rewrite the divert (table inet "+rules.NFTablesGuardTable+")", err)
	}
	return ok, nil
}

func (f *nftablesFirewall) DeleteDivert(ctx context.Context, _ []rules.Family) (bool, error) {
	found, err := f.nft.DeleteGuard(ctx)
	if err != nil {
		return false, rulesError("remove the divert (table inet "+rules.NFTablesGuardTable+")", err)
	}
	return found, nil
}

func (f *nftablesFirewall) Diverted(ctx context.Context, _ []rules.Family) (bool, error) {
	ok, err := f.nft.TableExists(ctx, rules.NFTablesGuardTable)
	if err != nil {
		return false, rulesError("look for the divert (table inet "+rules.NFTablesGuardTable+")", err)
	}
	return ok, nil
}

func (f *nftablesFirewall) UnhookCacheWhileDiverted(ctx context.Context, _ []rules.Family) (marked, unhooked bool, err error) {
	marked, unhooked, err = f.nft.UnhookCacheWhileMarked(ctx)
	if err != nil {
		return marked, unhooked, rulesError("unhook the cache's table inet "+rules.NFTablesTable, err)
	}
	return marked, unhooked, nil
}

// AddProbeExemption writes the probe table for the union of addrs and what it exempts already: it also
// exempts UDP from the probed addresses, since kube-proxy's nftables mode rejects new connections to a
// ClusterIP's other ports, and a tracked answer from the kube-dns ClusterIP to the prober (which has that
// address too) is one.
func (f *nftablesFirewall) AddProbeExemption(ctx context.Context, mark uint32, addrs []netip.Addr) error {
	all := append(slices.Clone(f.probeAddrs), addrs...)
	for i := range all {
		all[i] = all[i].Unmap()
	}
	slices.SortFunc(all, netip.Addr.Compare)
	all = slices.Compact(all)
	if f.probeAddrs != nil && slices.Equal(all, f.probeAddrs) {
		return nil
	}
	if err := f.nft.AddProbeExemption(ctx, mark, all); err != nil {
		if f.probeAddrs == nil {
			f.probeAddrs = []netip.Addr{} // may have been written: removal looks
		}
		return rulesError("add the probe exemption (table inet "+rules.NFTablesProbeTable+")", err)
	}
	f.probeAddrs = all
	return nil
}

func (f *nftablesFirewall) RemoveProbeExemption(ctx context.Context, _ uint32) error {
	if f.probeAddrs == nil {
		return nil
	}
	if _, err := f.nft.RemoveProbeExemption(ctx); err != nil {
		return rulesError("remove the probe exemption (table inet "+rules.NFTablesProbeTable+")", err)
	}
	f.probeAddrs = nil
	return nil
}

// Inspect checks that the cache's table is hooked at prerouting and output and that its rules cover every
// endpoint (read from their expressions), and that the divert's table, which exists while the node is
// failed open, does not.
func (f *nftablesFirewall) Inspect(ctx context.Context, endpoints []rules.Endpoint) []RuleCheck {
	target := "nftables inet " + rules.NFTablesTable
	check := func(ok bool, format string, args ...any) RuleCheck {
		return RuleCheck{Check: "rules", Target: target, OK: ok, Detail: fmt.Sprintf(format, args...)}
	}
	var out []RuleCheck
	have, err := f.nft.CacheEndpoints(ctx)
	pre, output, herr := f.nft.CacheHooks(ctx)
	var missing []string
	for _, e := range endpoints {
		if !slices.Contains(have, e) {
			missing = append(missing, e.String())
		}
	}
	switch {
	case err != nil || herr != nil:
		out = append(out, check(false, "reading the table: %v", errors.Join(err, herr)))
	case len(have) == 0 && !pre && !output:
		out = append(out, check(false, "no table inet %s", rules.NFTablesTable))
	case !pre || !output:
		out = append(out, check(false, "base chains: prerouting %v, output %v; the NOTRACK rules miss the traffic of a missing hook", pre, output))
	case len(missing) > 0:
		out = append(out, check(false, "no NOTRACK rule for %s", strings.Join(missing, ", ")))
	default:
		out = append(out, check(true, "NOTRACK rules for %d endpoints, hooked at prerouting and output (%s)", len(have), f.Reason()))
	}
	switch diverted, err := f.nft.TableExists(ctx, rules.NFTablesGuardTable); {
	case err != nil:
		out = append(out, RuleCheck{Check: "fail-open", Target: "nftables", Detail: err.Error()})
	case diverted:
		out = append(out, RuleCheck{Check: "fail-open", Target: "nftables",
			Detail: fmt.Sprintf("table inet %s exists: the guard failed the node open and the cache has not taken it back", rules.NFTablesGuardTable)})
	default:
		out = append(out, RuleCheck{Check: "fail-open", Target: "nftables", OK: true, Detail: "no table inet " + rules.NFTablesGuardTable})
	}
	return out
}
