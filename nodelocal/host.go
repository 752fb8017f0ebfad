//go:build linux

package nodelocal

import (
	"context"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"

	"github.com/nodelocaldns/nodelocaldns/nodelocal/internal/link"
)

// linkOps is what the state machines do with the link that holds the cache's addresses: *link.Manager on
// a node, a fake in tests.
type linkOps interface {
	// Ensure makes the link exist, be up and hold want (see link.Manager.Ensure).
	Ensure(ctx context.Context, want []netip.Addr) (link.Result, error)
	// Addresses returns the addresses the link holds.
	Addresses(ctx context.Context) ([]netip.Addr, error)
	// AddAddresses and RemoveAddresses change them, returning what they changed.
	AddAddresses(ctx context.Context, addrs []netip.Addr) ([]netip.Addr, error)
	RemoveAddresses(ctx context.Context, addrs []netip.Addr) ([]netip.Addr, error)
	// Teardown removes the link if we created it, or else the addresses we added.
	Teardown(ctx context.Context) error
}

var _ linkOps = (*link.Manager)(nil)

// nodeAddresses returns every address of the node's network namespace, on any link, IPv4-mapped ones
// unmapped, sorted. A divert to an upstream that is one of them stays on the node; a successor checks
// that the owner's addresses are there before it serves them.
func nodeAddresses(ctx context.Context) ([]netip.Addr, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	list, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, linkError("list the node's addresses", err)
	}
	out := make([]netip.Addr, 0, len(list))
	for _, a := range list {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			out = append(out, ip.Unmap())
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out), nil
}
