//go:build linux

package nodelocal

import (
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"

	"github.com/nodelocaldns/nodelocaldns/nodelocal/internal/rules"
)

// forgetLocalFlows deletes the connection-tracking entries that would deliver a flow's next packet to a
// cache that is gone: flows to one of its endpoints that are not NATed (made while neither the cache's
// NOTRACK jumps nor a divert were in place: a start before the rules, the moment a cache takes its node
// back), and flows the cache's own answers opened (answers sent after the jumps went out, while it
// drained). The nat table only sees a flow's first packet, so a Pod that sends from the same source port
// again would otherwise meet a closed port, or an address that is not on the node any more, until the
// entry expired (two minutes for a UDP flow that saw replies). Called once the cache's sockets are drained
// (or the cache died), it makes every flow's next packet start over through kube-proxy and the divert.
// Flows DNATed elsewhere (kube-proxy's, the divert's) stay. It returns how many entries went.
func forgetLocalFlows(endpoints []netip.AddrPort) (uint, error) {
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

// divertEndpoints returns the address and port of each divert.
func divertEndpoints(ds []rules.Divert) []netip.AddrPort {
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
