//go:build linux

package rules

import (
	"context"
	"net/netip"
	"strconv"
)

// CachedEndpoints returns the endpoints the node cache's rules of family fam cover: one per "to" rule of
// its raw chain (spec's chain name; DefaultChain when empty). A successor reads what the owner serves
// from here; none when the chain does not exist.
func (m *Manager) CachedEndpoints(ctx context.Context, fam Family, spec NodeCacheSpec) ([]Endpoint, error) {
	chain := spec.Chain
	if chain == "" {
		chain = DefaultChain
	}
	v, err := m.view(ctx, fam)
	if err != nil {
		return nil, err
	}
	rules, _, err := v.chain(ctx, Raw, chain)
	if err != nil {
		return nil, err
	}
	var eps []Endpoint
	for _, r := range rules {
		if e, ok := toEndpoint(r); ok {
			eps = append(eps, e)
		}
	}
	return SortEndpoints(eps), nil
}

// toEndpoint parses a rule "-d ADDR/LEN -p PROTO -m PROTO --dport PORT ..." of a node cache's chain.
func toEndpoint(r Rule) (Endpoint, bool) {
	var e Endpoint
	var haveAddr, havePort bool
	for i := 0; i+1 < len(r); i++ {
		switch r[i] {
		case "-d":
			p, err := netip.ParsePrefix(r[i+1])
			if err != nil || p.Bits() != p.Addr().BitLen() {
				return Endpoint{}, false
			}
			e.Addr, haveAddr = p.Addr().Unmap(), true
		case "-p":
			e.Protocol = Protocol(r[i+1])
		case "--dport":
			n, err := strconv.ParseUint(r[i+1], 10, 16)
			if err != nil {
				return Endpoint{}, false
			}
			e.Port, havePort = uint16(n), true
		}
	}
	return e, haveAddr && havePort && (e.Protocol == UDP || e.Protocol == TCP)
}
