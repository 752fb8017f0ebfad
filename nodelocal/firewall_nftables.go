//go:build linux

package nodelocal

import (
	"context"
	"fmt"
	"net/netip"
	"slices"

	"github.com/nodelocaldns/nodelocaldns/nodelocal/rules"
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
	out := cacheSync{Rules: res.Rules}
	for _, e := range endpoints {
		out.Covered = append(out.Covered, e.Addr)
	}
	slices.SortFunc(out.Covered, netip.Addr.Compare)
	out.Covered = slices.Compact(out.Covered)
	return out, nil
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
// ClusterIP that is not local would leave the node untranslated. A divert with endpoints for neither
// protocol is skipped.
func (f *nftablesFirewall) PlanDivert(ctx context.Context, fams []rules.Family, wants []rules.Divert, local []netip.Addr) (divertPlan, error) {
	p := divertPlan{Families: slices.Clone(fams)}
	var unserved []string
	for _, d := range wants {
		port := d.Port
		if port == 0 {
			port = DefaultDNSPort
		}
		served := false
		for _, proto := range []rules.Protocol{rules.UDP, rules.TCP} {
			route := rules.NFTDivert{From: d.From, Port: port, Protocol: proto}
			if slices.Contains(local, d.To) {
				route.To = []netip.AddrPort{netip.AddrPortFrom(d.To, port)}
			} else {
				eps, err := f.nft.KubeProxyEndpoints(ctx, d.To, proto, port)
				if err != nil {
					return divertPlan{}, rulesError(fmt.Sprintf("read kube-proxy's endpoints of %s %s/%d", d.To, proto, port), err)
				}
				route.To = eps
			}
			if len(route.To) == 0 {
				unserved = append(unserved, fmt.Sprintf("%s %s/%d", d.To, proto, port))
				continue
			}
			p.routes = append(p.routes, route)
			served = true
		}
		if served {
			p.Diverts = append(p.Diverts, d)
		} else {
			p.Skipped = append(p.Skipped, d)
		}
	}
	if len(unserved) > 0 && len(p.Diverts) > 0 {
		f.log.Warningf("nodelocal: kube-proxy's nftables table has no endpoints for %v: lookups diverted there fail until the cache is back", unserved)
	}
	return p, nil
}

func (f *nftablesFirewall) WriteDivert(ctx context.Context, p divertPlan) error {
	for _, r := range p.routes {
		f.log.Infof("nodelocal: diverting %s %s/%d to %v", r.From, r.Protocol, r.Port, r.To)
	}
	if err := f.nft.WriteGuard(ctx, p.routes); err != nil {
		return rulesError("write the divert (table inet "+rules.NFTablesGuardTable+")", err)
	}
	return nil
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
