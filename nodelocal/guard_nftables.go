package nodelocal

import (
	"context"
	"fmt"
	"net/netip"
	"slices"

	"github.com/nodelocaldns/nodelocaldns/nodelocal/rules"
)

// nftablesDivertsLocked turns the guard's diverts into the nftables backend's. A DNAT in the guard's table
// runs before kube-proxy's and ends NAT for the connection, so a divert to the kube-dns-upstream ClusterIP
// would leave the node untranslated. Where the ClusterIP is an address of the node it is the target as it
// stands; elsewhere the targets are the endpoints kube-proxy's nftables table DNATs the ClusterIP to, read
// now, per protocol. A divert with neither is left out and logged.
func (g *Guard) nftablesDivertsLocked(ctx context.Context, notLocal []rules.Divert) ([]rules.NFTDivert, error) {
	var out []rules.NFTDivert
	var unserved []string
	for _, d := range g.diverts {
		for _, proto := range []rules.Protocol{rules.UDP, rules.TCP} {
			nd := rules.NFTDivert{From: d.From, Port: d.Port, Protocol: proto}
			if !slices.ContainsFunc(notLocal, func(o rules.Divert) bool { return o.From == d.From && o.To == d.To && o.Port == d.Port }) {
				nd.To = []netip.AddrPort{netip.AddrPortFrom(d.To, d.Port)}
			} else {
				eps, err := g.nft.KubeProxyEndpoints(ctx, d.To, proto, d.Port)
				if err != nil {
					return nil, rulesError(fmt.Sprintf("read kube-proxy's endpoints of %s %s/%d", d.To, proto, d.Port), err)
				}
				nd.To = eps
			}
			if len(nd.To) == 0 {
				unserved = append(unserved, fmt.Sprintf("%s %s/%d", d.To, proto, d.Port))
				continue
			}
			out = append(out, nd)
		}
	}
	if len(unserved) > 0 {
		g.log.Warningf("nodelocal guard: kube-proxy's nftables table has no endpoints for %v: lookups of the addresses diverted there "+
			"fail until the cache is back (Pods that ask the kube-dns ClusterIP are served by kube-proxy)", unserved)
	}
	for _, d := range out {
		g.log.Infof("nodelocal guard: diverting %s %s/%d to %v", d.From, d.Protocol, d.Port, d.To)
	}
	return out, nil
}
