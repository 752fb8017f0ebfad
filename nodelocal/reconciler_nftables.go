package nodelocal

import (
	"context"
	"net/netip"
	"slices"

	"github.com/nodelocaldns/nodelocaldns/nodelocal/rules"
)

// syncNFTablesLocked is syncRulesLocked for the nftables backend: one table holds both families, written
// in one transaction when anything differs, and deleted when no endpoint is left.
func (r *Reconciler) syncNFTablesLocked(ctx context.Context, endpoints []rules.Endpoint) []error {
	res, err := r.nft.SyncCache(ctx, endpoints, "")
	if err != nil {
		r.statusMu.Lock()
		r.status.RulesPresent = false
		r.statusMu.Unlock()
		return []error{rulesError("sync table inet "+rules.NFTablesTable, err)}
	}
	switch {
	case len(endpoints) == 0 && r.nftWritten != nil:
		r.log.Infof("nodelocal: deleted table inet %s", rules.NFTablesTable)
	case res.Changed && slices.Equal(r.nftWritten, endpoints):
		r.log.Warningf("nodelocal: repaired table inet %s: %v", rules.NFTablesTable, res.Differences)
	case res.Changed:
		r.log.Infof("nodelocal: wrote table inet %s for %d endpoints", rules.NFTablesTable, len(endpoints))
	}
	r.nftWritten = nil
	if len(endpoints) > 0 {
		r.nftWritten = slices.Clone(endpoints)
	}
	var covered []netip.Addr
	for _, e := range endpoints {
		covered = append(covered, e.Addr)
	}
	slices.SortFunc(covered, netip.Addr.Compare)
	r.statusMu.Lock()
	r.status.RulesPresent = len(endpoints) > 0
	r.status.Rules = res.Rules
	r.status.RuleAddresses = slices.Compact(covered)
	r.statusMu.Unlock()
	return nil
}
