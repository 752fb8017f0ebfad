//go:build linux

package rules

import (
	"context"
	"encoding/binary"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// CacheEndpoints returns the endpoints the cache's table covers: one per rule of its endpoints chain that
// matches packets to an address and port (the NOTRACK rule for the queries), read from the rules'
// expressions, not their comments. None when the table does not exist.
func (n *NFTablesManager) CacheEndpoints(ctx context.Context) ([]Endpoint, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c, err := nftables.New()
	if err != nil {
		return nil, nftError("open netlink", err)
	}
	if ok, err := tableExists(c, NFTablesTable); err != nil || !ok {
		return nil, err
	}
	t := inetTable(NFTablesTable)
	rs, err := c.GetRules(t, &nftables.Chain{Name: nftEndpointsChain, Table: t})
	if isNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, nftError("read chain "+nftEndpointsChain+" of table inet "+NFTablesTable, err)
	}
	var eps []Endpoint
	for _, r := range rs {
		if e, ok := endpointOfRule(r.Exprs); ok {
			eps = append(eps, e)
		}
	}
	return SortEndpoints(eps), nil
}

// endpointOfRule parses the match matchEndpoint(e, true) builds: the destination address compared after
// a load of the network header, the transport protocol after a load of its meta key, and the destination
// port after a load of the transport header.
func endpointOfRule(exprs []expr.Any) (Endpoint, bool) {
	var (
		e                  Endpoint
		load               expr.Any
		haveAddr, havePort bool
		haveProto          bool
	)
	for _, x := range exprs {
		switch x := x.(type) {
		case *expr.Meta, *expr.Payload:
			load = x
		case *expr.Cmp:
			switch l := load.(type) {
			case *expr.Meta:
				if l.Key == expr.MetaKeyL4PROTO && len(x.Data) == 1 {
					switch x.Data[0] {
					case unix.IPPROTO_UDP:
						e.Protocol, haveProto = UDP, true
					case unix.IPPROTO_TCP:
						e.Protocol, haveProto = TCP, true
					}
				}
			case *expr.Payload:
				switch {
				case l.Base == expr.PayloadBaseNetworkHeader && ((l.Offset == 16 && l.Len == 4) || (l.Offset == 24 && l.Len == 16)):
					if a, ok := netip.AddrFromSlice(x.Data); ok {
						e.Addr, haveAddr = a.Unmap(), true
					}
				case l.Base == expr.PayloadBaseTransportHeader && l.Offset == 2 && l.Len == 2 && len(x.Data) == 2:
					e.Port, havePort = binary.BigEndian.Uint16(x.Data), true
				}
			}
			load = nil
		}
	}
	return e, haveAddr && havePort && haveProto
}
