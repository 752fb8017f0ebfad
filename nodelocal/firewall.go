//go:build linux

package nodelocal

import (
	"context"
	"fmt"
	"net/netip"
	"slices"

	"github.com/nodelocaldns/nodelocaldns/nodelocal/internal/rules"
)

// firewall is one rules backend as the node's state machines (Reconciler, Guard, ProbeExemption, the
// successor's check) use it: iptables of one flavour (iptablesFirewall) or tables of our own over netlink
// (nftablesFirewall). Everything the state machines ask of the rules goes through it, and nothing outside
// the two implementations knows which one it is; firewallChoice picks it, and tests use fakeFirewall.
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
	// RefreshDivert rewrites the divert's routes with the plan's, while the marks are in place: a divert
	// that stands follows the endpoints of kube-dns-upstream. It never marks the node again once the cache
	// took it back (deleted the marks), and reports whether it rewrote anything.
	RefreshDivert(ctx context.Context, p divertPlan) (bool, error)
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

	// Inspect reads whether the cache's rules cover endpoints and see traffic first, and whether the node
	// has failed open, for InspectRules; it changes nothing.
	Inspect(ctx context.Context, endpoints []rules.Endpoint) []RuleCheck
}

// cacheSync says what a SyncCache found and did.
type cacheSync struct {
	// Rules is the number of rules in place, jumps or hooks included; Covered the addresses they cover.
	Rules   int
	Covered []netip.Addr
	// Ahead are the rules of others the sync found ahead of the cache's jumps, and put the jumps back above.
	Ahead []AheadRule
}

// divertPlan is how a fail-open diverts the cache's addresses to the cluster DNS, worked out by
// PlanDivert and applied by WriteDivert. The guard fails a node open with it, and a cache that stops
// without a successor hands its node over with the same plan.
type divertPlan struct {
	// Families are those whose marks the divert writes: the node has failed open in each.
	Families []rules.Family
	// Diverts are the wanted diverts that reach the Service; Skipped those kube-proxy does not serve in any
	// way the divert can reach.
	Diverts []rules.Divert
	Skipped []rules.Divert
	// Routes say where each address's traffic goes, per protocol.
	Routes []rules.DivertRoute
}

// Endpoints returns the address and DNS port of each divert: the flows a fail-open must forget.
func (p divertPlan) Endpoints() []netip.AddrPort { return divertEndpoints(p.Diverts) }

// serviceEndpoints returns the endpoints kube-proxy DNATs a Service's ClusterIP to on a protocol and port,
// and whether the host's own lookups diverted there need masquerading; none when kube-proxy does not serve
// it.
type serviceEndpoints func(ctx context.Context, clusterIP netip.Addr, proto rules.Protocol, port uint16) ([]netip.AddrPort, bool, error)

// planDivert is PlanDivert for either backend, given how the backend reads kube-proxy's endpoints: per
// wanted divert and protocol, a route to the upstream ClusterIP where that is an address of the node (IPVS
// mode), and elsewhere to the endpoints kube-proxy DNATs it to. A divert with endpoints for neither
// protocol is skipped; a protocol without endpoints is named in unserved.
func planDivert(ctx context.Context, fams []rules.Family, wants []rules.Divert, local []netip.Addr, endpointsOf serviceEndpoints) (p divertPlan, unserved []string, err error) {
	p.Families = slices.Clone(fams)
	for _, d := range wants {
		port := d.Port
		if port == 0 {
			port = DefaultDNSPort
		}
		served := false
		for _, proto := range []rules.Protocol{rules.UDP, rules.TCP} {
			route := rules.DivertRoute{From: d.From, Port: port, Protocol: proto}
			if slices.Contains(local, d.To) {
				route.To = []netip.AddrPort{netip.AddrPortFrom(d.To, port)}
			} else if route.To, route.Masquerade, err = endpointsOf(ctx, d.To, proto, port); err != nil {
				return divertPlan{}, nil, rulesError(fmt.Sprintf("read kube-proxy's endpoints of %s %s/%d", d.To, proto, port), err)
			}
			if len(route.To) == 0 {
				unserved = append(unserved, fmt.Sprintf("%s %s/%d", d.To, proto, port))
				continue
			}
			p.Routes = append(p.Routes, route)
			served = true
		}
		if served {
			p.Diverts = append(p.Diverts, d)
		} else {
			p.Skipped = append(p.Skipped, d)
		}
	}
	p.Routes = rules.SortDivertRoutes(p.Routes)
	return p, unserved, nil
}

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
func familiesOfEndpoints(eps []rules.Endpoint) []rules.Family { return familiesOf(addressesOf(eps)) }

// addressesOf returns the addresses of eps, sorted, each once.
func addressesOf(eps []rules.Endpoint) []netip.Addr {
	out := make([]netip.Addr, 0, len(eps))
	for _, e := range eps {
		out = append(out, e.Addr)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}
