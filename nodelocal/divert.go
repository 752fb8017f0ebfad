package nodelocal

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"

	"github.com/nodelocaldns/nodelocaldns/nodelocal/rules"
)

// resolveDiverts works out how each divert reaches the kube-dns-upstream Service in this node's kube-proxy
// mode, and returns those that can, and those that cannot (kube-proxy serves the upstream ClusterIP in
// neither way; they are left undiverted).
//
// A DNAT ends the nat table's walk for a packet, so kube-proxy's own DNAT never sees traffic that was
// DNATed already: a DNAT to the upstream ClusterIP works only where that ClusterIP is an address of the
// node (kube-ipvs0, IPVS mode), where IPVS takes it from there. In iptables mode the divert jumps into
// kube-proxy's own chain of the Service port instead, found through the Service's ClusterIP rule in
// KUBE-SERVICES: that chain picks an endpoint and DNATs to it, as for the ClusterIP. Its name is a hash
// of the Service port, so it survives kube-proxy's syncs; kube-proxy can only delete it (the Service or
// its port removed, or left without endpoints) while nothing jumps to it, so the divert must not outstay
// the restart or the failure it bridges.
func resolveDiverts(ctx context.Context, m *rules.Manager, ds []rules.Divert) (kept, skipped []rules.Divert, err error) {
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, nil, linkError("list the node's addresses", err)
	}
	local := map[netip.Addr]bool{}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			local[ip.Unmap()] = true
		}
	}
	for _, d := range ds {
		if local[d.To] {
			kept = append(kept, d)
			continue
		}
		port := d.Port
		if port == 0 {
			port = DefaultDNSPort
		}
		chains, masq, err := m.KubeProxyServiceChains(ctx, d.To, port)
		if err != nil {
			return nil, nil, rulesError(fmt.Sprintf("look for kube-proxy's chains of %s", netip.AddrPortFrom(d.To, port)), err)
		}
		if len(chains) == 0 {
			skipped = append(skipped, d)
			continue
		}
		d.Via, d.MarkMasq = chains, masq
		kept = append(kept, d)
	}
	return kept, skipped, nil
}
