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

// ForgetLocalFlows deletes the connection-tracking entries that would deliver a flow's next packet to a
// cache that is gone: flows to one of its endpoints that are not NATed (made while neither the cache's
// NOTRACK jumps nor a divert were in place: a start before the rules, the moment a cache takes its node
// back), and flows the cache's own answers opened (answers sent after the jumps went out, while it
// drained). The nat table only sees a flow's first packet, so a Pod that sends from the same source port
// again would otherwise meet a closed port, or an address that is not on the node any more, until the
// entry expired (two minutes for a UDP flow that saw replies). Called once the cache's sockets are drained
// (or the cache died), it makes every flow's next packet start over through kube-proxy and the divert.
// Flows DNATed elsewhere (kube-proxy's, the divert's) stay. It returns how many entries went.
func ForgetLocalFlows(endpoints []netip.AddrPort) (uint, error) {
	var total uint
	for _, e := range endpoints {
		e = netip.AddrPortFrom(e.Addr().Unmap(), e.Port())
		fam := netlink.InetFamily(netlink.FAMILY_V4)
		if e.Addr().Is6() {
			fam = netlink.FAMILY_V6
		}
		n, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, fam, localFlowFilter{e})
		total += n
		if err != nil {
			return total, linkError(fmt.Sprintf("forget the tracked flows of %s", e), err)
		}
	}
	return total, nil
}

// DivertEndpoints returns the address and port of each divert.
func DivertEndpoints(ds []rules.Divert) []netip.AddrPort {
	out := make([]netip.AddrPort, 0, len(ds))
	for _, d := range ds {
		port := d.Port
		if port == 0 {
			port = DefaultDNSPort
		}
		out = append(out, netip.AddrPortFrom(d.From, port))
	}
	return out
}

// localFlowFilter matches the flows to the endpoint that are not NATed, and those from it.
type localFlowFilter struct {
	endpoint netip.AddrPort
}

func (f localFlowFilter) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool {
	src, _ := netip.AddrFromSlice(flow.Forward.SrcIP)
	dst, _ := netip.AddrFromSlice(flow.Forward.DstIP)
	replySrc, _ := netip.AddrFromSlice(flow.Reverse.SrcIP)
	a := f.endpoint.Addr()
	if src.Unmap() == a && flow.Forward.SrcPort == f.endpoint.Port() {
		return true
	}
	return dst.Unmap() == a && flow.Forward.DstPort == f.endpoint.Port() && replySrc.Unmap() == a
}
