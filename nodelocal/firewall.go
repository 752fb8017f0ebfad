//go:build linux

package nodelocal

import (
	"context"
	"net/netip"
	"slices"

	"github.com/nodelocaldns/nodelocaldns/nodelocal/rules"
)

// firewall is one rules backend as the node's state machines (Reconciler, Guard, ProbeExemption, the
// successor's check) use it: iptables of one flavour (iptablesFirewall) or tables of our own over netlink
// (nftablesFirewall). Everything the state machines ask of the rules goes through it, and nothing outside
// the two implementations knows which one it is; selectFirewall picks it, and tests use fakeFirewall.
//
// Operations that take families act on those families only (iptables keeps one set of chains per family,
// and a node may lack IPv6's tables); nftables keeps both families in one table and ignores them. Errors
// are of KindIPTables or KindIPTablesLock (see rulesError), with what was being done.
type firewall interface {
	// Mode is the backend; Reason says why it was chosen.
	Mode() rules.Mode
	Reason() string
	// Families returns those of fams the backend can write rules for on this node.
	Families(fams []rules.Family) []rules.Family

	// SyncCache makes the node hold the cache's rules for endpoints, both families, hooked so that they see
	// traffic first; with none it deletes them. A sync that finds everything in place writes nothing.
	SyncCache(ctx context.Context, endpoints []rules.Endpoint) (cacheSync, error)
	// NarrowCache keeps only what the cache's answers need of its rules while it drains: new queries meet
	// kube-proxy and the divert, and the answers to what the cache already has still leave untracked. A
	// backend that cannot leave the answers alone unhooks the rules instead.
	NarrowCache(ctx context.Context, endpoints []rules.Endpoint) error
	// UnhookCache takes the cache's rules out of the traffic's path and keeps them, so that a later
	// SyncCache only hooks them again.
	UnhookCache(ctx context.Context, fams []rules.Family) error
	// CacheHooked reports whether the cache's rules see traffic in any of fams.
	CacheHooked(ctx context.Context, fams []rules.Family) (bool, error)
	// CacheEndpoints returns the endpoints the cache's rules on the node cover, hooked or not.
	CacheEndpoints(ctx context.Context) ([]rules.Endpoint, error)

	// PlanDivert works out how each wanted divert reaches the kube-dns-upstream Service in this node's
	// kube-proxy mode, given the node's own addresses: the plan WriteDivert applies, which marks the node
	// failed open in fams (the families of every address of the cache, diverted or not).
	PlanDivert(ctx context.Context, fams []rules.Family, wants []rules.Divert, local []netip.Addr) (divertPlan, error)
	// WriteDivert writes the plan's divert and the marks that say the node has failed open, replacing any
	// earlier divert.
	WriteDivert(ctx context.Context, p divertPlan) error
	// DeleteDivert deletes the divert and its marks, and reports whether there were any.
	DeleteDivert(ctx context.Context, fams []rules.Family) (bool, error)
	// Diverted reports whether the divert's marks are in place in any of fams: the node has failed open.
	Diverted(ctx context.Context, fams []rules.Family) (bool, error)
	// UnhookCacheWhileDiverted is UnhookCache in transactions that find the divert's marks, so that it can
	// never undo a cache taking the node back at the same moment (which deletes the marks first). It
	// reports whether the marks were there, and whether it unhooked anything.
	UnhookCacheWhileDiverted(ctx context.Context, fams []rules.Family) (marked, unhooked bool, err error)

	// AddProbeExemption exempts packets with mark, the cache's probes of addrs, from connection tracking.
	// It adds to what earlier calls exempted, and may have taken effect when it fails.
	AddProbeExemption(ctx context.Context, mark uint32, addrs []netip.Addr) error
	// RemoveProbeExemption removes whatever AddProbeExemption may have put in place.
	RemoveProbeExemption(ctx context.Context, mark uint32) error
}

// cacheSync says what a SyncCache found and did.
type cacheSync struct {
	// Rules is the number of rules in place, jumps or hooks included; Covered the addresses they cover.
	Rules   int
	Covered []netip.Addr
}

// divertPlan is how a fail-open diverts the cache's addresses to the cluster DNS, worked out by
// PlanDivert and applied by WriteDivert. The guard fails a node open with it, and a cache that stops
// without a successor hands its node over with the same plan.
type divertPlan struct {
	// Families are those whose marks the divert writes: the node has failed open in each.
	Families []rules.Family
	// Diverts are the wanted diverts that reach the Service, with how (rules.Divert.Via in iptables mode).
	Diverts []rules.Divert
	// Skipped are the wanted diverts kube-proxy does not serve in any way the backend can reach.
	Skipped []rules.Divert
	// routes are the nftables backend's form of Diverts: the endpoints each address and protocol is
	// DNATed to.
	routes []rules.NFTDivert
}

// Endpoints returns the address and DNS port of each divert: the flows a fail-open must forget.
func (p divertPlan) Endpoints() []netip.AddrPort { return DivertEndpoints(p.Diverts) }

// familiesOf returns the families of addrs, sorted, each once.
func familiesOf(addrs []netip.Addr) []rules.Family {
	fams := make([]rules.Family, 0, len(addrs))
	for _, a := range addrs {
		fams = append(fams, rules.FamilyOf(a))
	}
	slices.Sort(fams)
	return slices.Compact(fams)
}

// familiesOfEndpoints returns the families of endpoints, sorted, each once.
func familiesOfEndpoints(eps []rules.Endpoint) []rules.Family {
	addrs := make([]netip.Addr, 0, len(eps))
	for _, e := range eps {
		addrs = append(addrs, e.Addr)
	}
	return familiesOf(addrs)
}
