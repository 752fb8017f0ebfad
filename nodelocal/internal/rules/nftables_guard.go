//go:build linux

package rules

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// guardTable is the guard's table: nat chains on prerouting (Pods) and output (the host), before
// kube-proxy's (priority dstnat - 10), that DNAT each divert to its endpoints. In nftables the first nat
// chain that sets up a DNAT for a connection ends NAT for it, so the DNAT goes straight to endpoints, not
// to a ClusterIP that kube-proxy would translate. With no diverts the chains are empty and the table only
// marks the node as failed open.
func guardTable(diverts []DivertRoute) nftTable {
	prio := *nftables.ChainPriorityNATDest - 10
	pre := nftChain{name: "prerouting", typ: nftables.ChainTypeNAT, hook: nftables.ChainHookPrerouting, priority: &prio}
	out := nftChain{name: "output", typ: nftables.ChainTypeNAT, hook: nftables.ChainHookOutput, priority: &prio}
	rules := guardTableRules(diverts)
	pre.rules, out.rules = rules, rules
	return nftTable{name: NFTablesGuardTable, chains: []nftChain{{name: nftGuardMarker}, pre, out}}
}

// guardTableRules are the rules of each nat chain of guardTable.
func guardTableRules(diverts []DivertRoute) []nftRule {
	var rules []nftRule
	for _, d := range SortDivertRoutes(diverts) {
		match := append(matchAddr(d.From, true), matchPort(d.Protocol, d.Port, true)...)
		for i, to := range d.To {
			exprs := slices.Clone(match)
			// Rule i of n takes the packet with probability 1/(n-i) when rules 0..i-1 did not: each
			// endpoint gets 1/n. The last rule takes whatever is left.
			if left := uint32(len(d.To) - i); left > 1 {
				exprs = append(exprs,
					&expr.Numgen{Register: nftReg1, Modulus: left, Type: unix.NFT_NG_RANDOM},
					&expr.Cmp{Op: expr.CmpOpEq, Register: nftReg1, Data: binary.NativeEndian.AppendUint32(nil, 0)})
			}
			addr := to.Addr().Unmap()
			exprs = append(exprs,
				&expr.Immediate{Register: nftReg1, Data: addr.AsSlice()},
				&expr.Immediate{Register: nftReg2, Data: binary.BigEndian.AppendUint16(nil, to.Port())},
				&expr.NAT{Type: expr.NATTypeDestNAT, Family: uint32(nfproto(addr)), RegAddrMin: nftReg1, RegProtoMin: nftReg2, Specified: true})
			rules = append(rules, nftRule{exprs: exprs,
				comment: fmt.Sprintf("%s: %s %s/%d to %s", GuardComment, d.From, d.Protocol, d.Port, to)})
		}
	}
	return rules
}

// nftGuardMarker is an empty chain of the guard's table. UnhookCacheWhileMarked flushes it in the
// transaction that unhooks the cache's table, so that the transaction fails, changing nothing, once the
// cache has deleted the guard's table to take the node back.
const nftGuardMarker = "failed-open"

// UnhookCacheWhileMarked is UnhookCache made safe against a reclaim running at the same time: it unhooks
// the cache's table only in a transaction that finds the guard's table. It reports whether the guard's
// table was there, and whether it unhooked anything; a transaction that failed because the guard's table
// went away meanwhile is not an error.
func (n *NFTablesManager) UnhookCacheWhileMarked(ctx context.Context) (marked, removed bool, err error) {
	c, err := nftables.New()
	if err != nil {
		return false, false, nftError("open netlink", err)
	}
	if ok, err := tableExists(c, NFTablesGuardTable); err != nil || !ok {
		return false, false, err
	}
	if ok, err := tableExists(c, NFTablesTable); err != nil || !ok {
		return true, false, err
	}
	t := inetTable(NFTablesTable)
	var hooks []string
	for _, name := range []string{nftPreroutingChain, nftOutputChain} {
		ok, err := chainExists(c, NFTablesTable, name)
		if err != nil {
			return true, false, err
		}
		if ok {
			hooks = append(hooks, name)
		}
	}
	if len(hooks) == 0 {
		return true, false, nil
	}
	if err := ctx.Err(); err != nil {
		return true, false, err
	}
	c.FlushChain(&nftables.Chain{Name: nftGuardMarker, Table: inetTable(NFTablesGuardTable)})
	for _, name := range hooks {
		ch := &nftables.Chain{Name: name, Table: t}
		c.FlushChain(ch)
		c.DelChain(ch)
	}
	if err := c.Flush(); err != nil {
		if ok, verr := n.TableExists(ctx, NFTablesGuardTable); verr == nil && !ok {
			return false, false, nil // taken back while we were at it
		}
		return true, false, nftError("unhook table inet "+NFTablesTable, err)
	}
	return true, true, nil
}

// WriteGuard writes the guard's table with diverts, in one transaction, replacing any earlier one.
func (n *NFTablesManager) WriteGuard(ctx context.Context, diverts []DivertRoute) error {
	if err := checkDiverts(diverts); err != nil {
		return err
	}
	return n.replaceTable(ctx, guardTable(diverts))
}

// checkDiverts checks that every divert has endpoints of its own family.
func checkDiverts(diverts []DivertRoute) error {
	for _, d := range diverts {
		if len(d.To) == 0 {
			return fmt.Errorf("divert of %s %s/%d has no endpoints", d.From, d.Protocol, d.Port)
		}
		for _, to := range d.To {
			if nfproto(to.Addr()) != nfproto(d.From) {
				return fmt.Errorf("divert of %s to %s: families differ", d.From, to)
			}
		}
	}
	return nil
}

// RewriteGuardWhileMarked replaces the rules of the guard's nat chains with those of diverts, in one
// transaction that flushes the guard's marker first: it fails, changing nothing, once the cache has deleted
// the guard's table to take the node back. It reports whether it rewrote the chains; a table gone is not
// an error.
func (n *NFTablesManager) RewriteGuardWhileMarked(ctx context.Context, diverts []DivertRoute) (bool, error) {
	if err := checkDiverts(diverts); err != nil {
		return false, err
	}
	if err := ctx.Err(); err != nil {
		return false, err
	}
	c, err := nftables.New()
	if err != nil {
		return false, nftError("open netlink", err)
	}
	t := inetTable(NFTablesGuardTable)
	c.FlushChain(&nftables.Chain{Name: nftGuardMarker, Table: t})
	for _, name := range []string{"prerouting", "output"} {
		ch := &nftables.Chain{Name: name, Table: t}
		c.FlushChain(ch)
		for _, r := range guardTableRules(diverts) {
			c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: r.exprs, UserData: userdata.AppendString(nil, userdata.TypeComment, r.comment)})
		}
	}
	if err := c.Flush(); err != nil {
		if ok, verr := n.TableExists(ctx, NFTablesGuardTable); verr == nil && !ok {
			return false, nil // taken back while we were at it
		}
		return false, nftError("rewrite table inet "+NFTablesGuardTable, err)
	}
	return true, nil
}

// DeleteGuard deletes the guard's table and reports whether there was one.
func (n *NFTablesManager) DeleteGuard(ctx context.Context) (bool, error) {
	return n.deleteTable(ctx, NFTablesGuardTable)
}

// probeTable exempts the cache's probes from connection tracking: on the output hook at raw priority,
// packets with mark (the probe socket's SO_MARK), and UDP from the probed addresses (the answers).
// kube-proxy's nftables mode rejects new connections to a ClusterIP on ports it does not serve (its
// cluster-ips-check chain), and a tracked answer from the kube-dns ClusterIP to the prober, which also has
// that address, is such a connection. Nothing but the cache's own listeners sends from the cache's
// addresses, which only it holds; while the cache's rules are not in place kube-proxy DNATs everyone
// else's queries to the ClusterIP, so those listeners answer only probes there.
func probeTable(mark uint32, addrs []netip.Addr, comment string) nftTable {
	if comment == "" {
		comment = DefaultComment
	}
	out := nftChain{name: nftOutputChain, typ: nftables.ChainTypeFilter, hook: nftables.ChainHookOutput, priority: nftables.ChainPriorityRaw}
	out.rules = append(out.rules, nftRule{
		exprs: []expr.Any{
			&expr.Meta{Key: expr.MetaKeyMARK, Register: nftReg1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: nftReg1, Data: binary.NativeEndian.AppendUint32(nil, mark)},
			&expr.Notrack{},
		},
		comment: comment + ": probe of the node-local DNS cache",
	})
	as := slices.Clone(addrs)
	slices.SortFunc(as, netip.Addr.Compare)
	for _, a := range slices.Compact(as) {
		exprs := append(matchAddr(a, false),
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: nftReg1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: nftReg1, Data: []byte{unix.IPPROTO_UDP}},
			&expr.Notrack{})
		out.rules = append(out.rules, nftRule{exprs: exprs, comment: fmt.Sprintf("%s: answer to a probe of %s", comment, a.Unmap())})
	}
	return nftTable{name: NFTablesProbeTable, chains: []nftChain{out}}
}

// AddProbeExemption writes the probe table for the probe mark and the probed addresses, replacing any
// earlier one.
func (n *NFTablesManager) AddProbeExemption(ctx context.Context, mark uint32, addrs []netip.Addr) error {
	return n.replaceTable(ctx, probeTable(mark, addrs, ""))
}

// RemoveProbeExemption deletes the probe table and reports whether there was one.
func (n *NFTablesManager) RemoveProbeExemption(ctx context.Context) (bool, error) {
	return n.deleteTable(ctx, NFTablesProbeTable)
}

// kube-proxy's nftables layout (pkg/proxy/nftables): one table per family, a verdict map from ClusterIP,
// protocol and port to the Service port's chain, which DNATs: to its one endpoint directly ("dnat to
// IP:PORT"), to one of several picked with numgen from an anonymous map of address . port ("dnat ip addr .
// port to numgen random mod N map { 0 : IP . PORT, ... }"), or, with session affinity and in kube-proxy
// before 1.35, through an endpoint chain picked with numgen from a verdict map.
const (
	kubeProxyTable      = "kube-proxy"
	kubeProxyServiceIPs = "service-ips"
)

// KubeProxyTables returns the nftables tables of kube-proxy's nftables mode that exist ("ip kube-proxy",
// "ip6 kube-proxy"). A kernel without nf_tables has none.
func (n *NFTablesManager) KubeProxyTables(ctx context.Context) ([]string, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, nftError("open netlink", err)
	}
	var found []string
	for _, fam := range []nftables.TableFamily{nftables.TableFamilyIPv4, nftables.TableFamilyIPv6} {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		ok, err := tableOfFamilyExists(c, kubeProxyTable, fam)
		if err != nil {
			if nfTablesUnsupported(err) {
				return nil, nil
			}
			return nil, err
		}
		if ok {
			found = append(found, familyName(fam)+" "+kubeProxyTable)
		}
	}
	return found, nil
}

// nfTablesUnsupported reports whether err says that the kernel has no nf_tables.
func nfTablesUnsupported(err error) bool {
	return isErrno(err, unix.EPROTONOSUPPORT) || isErrno(err, unix.EAFNOSUPPORT)
}

func isErrno(err error, errno unix.Errno) bool {
	for e := err; e != nil; {
		if en, ok := e.(unix.Errno); ok && en == errno {
			return true
		}
		u, ok := e.(interface{ Unwrap() error })
		if !ok {
			break
		}
		e = u.Unwrap()
	}
	return false
}

// KubeProxyEndpoints returns the endpoints kube-proxy's nftables mode DNATs svc (a ClusterIP) on proto
// and port to, as its table says: the element of its service-ips map, the chain that element goes to,
// and that chain's DNATs, direct, through a map, or in the endpoint chains it picks from. It reads the whole map, so its cost grows
// with the number of Services: it is for failing open, not for every sync. It returns no endpoints, and
// no error, when kube-proxy's table has no element for the Service port.
func (n *NFTablesManager) KubeProxyEndpoints(ctx context.Context, svc netip.Addr, proto Protocol, port uint16) ([]netip.AddrPort, error) {
	svc = svc.Unmap()
	c, err := nftables.New()
	if err != nil {
		return nil, nftError("open netlink", err)
	}
	fam := nftables.TableFamilyIPv4
	if svc.Is6() {
		fam = nftables.TableFamilyIPv6
	}
	t := &nftables.Table{Name: kubeProxyTable, Family: fam}
	if ok, err := tableOfFamilyExists(c, kubeProxyTable, fam); err != nil || !ok {
		return nil, err
	}
	set, err := c.GetSetByName(t, kubeProxyServiceIPs)
	if err != nil {
		return nil, nftError("read map "+kubeProxyServiceIPs+" of table "+familyName(fam)+" "+kubeProxyTable, err)
	}
	elems, err := c.GetSetElements(set)
	if err != nil {
		return nil, nftError("read the elements of map "+kubeProxyServiceIPs, err)
	}
	// The key is a concatenation: address . protocol . port, each padded to 4 bytes.
	key := append(svc.AsSlice(), l4proto(proto), 0, 0, 0)
	key = append(binary.BigEndian.AppendUint16(key, port), 0, 0)
	var chain string
	for _, e := range elems {
		if slices.Equal(e.Key, key) {
			if v, ok := parseVerdict(e.Val); ok {
				chain = v.Chain
			}
			break
		}
	}
	if chain == "" {
		return nil, nil
	}
	var eps []netip.AddrPort
	seen := map[string]bool{}
	if err := n.collectDNATs(ctx, c, t, chain, 0, seen, &eps); err != nil {
		return nil, err
	}
	slices.SortFunc(eps, netip.AddrPort.Compare)
	return slices.Compact(eps), nil
}

// collectDNATs follows a chain of kube-proxy's, and the chains it jumps or goes to directly or through a
// verdict map, down to the DNATs, and appends their targets.
func (n *NFTablesManager) collectDNATs(ctx context.Context, c *nftables.Conn, t *nftables.Table, chain string, depth int, seen map[string]bool, out *[]netip.AddrPort) error {
	if seen[chain] || depth > 4 {
		return nil
	}
	seen[chain] = true
	if err := ctx.Err(); err != nil {
		return err
	}
	rules, err := c.GetRules(t, &nftables.Chain{Name: chain, Table: t})
	if err != nil {
		return nftError("read chain "+chain+" of table "+familyName(t.Family)+" "+kubeProxyTable, err)
	}
	for _, r := range rules {
		regs := map[uint32][]byte{}
		// mapped holds, by the register a map lookup writes, the data of every element of the map.
		mapped := map[uint32][][]byte{}
		for _, e := range r.Exprs {
			switch e := e.(type) {
			case *expr.Immediate:
				regs[e.Register] = e.Data
			case *expr.NAT:
				if e.Type != expr.NATTypeDestNAT || e.RegAddrMin == 0 || e.RegProtoMin == 0 {
					continue
				}
				if data, ok := mapped[e.RegAddrMin]; ok {
					*out = append(*out, mappedDNATs(data, e)...)
					continue
				}
				addr, ok := netip.AddrFromSlice(regs[e.RegAddrMin])
				if !ok || len(regs[e.RegProtoMin]) < 2 {
					continue
				}
				*out = append(*out, netip.AddrPortFrom(addr.Unmap(), binary.BigEndian.Uint16(regs[e.RegProtoMin])))
			case *expr.Verdict:
				// Only the mark-for-masquerade jump and endpoint gotos appear here; following a jump
				// that leads to no DNAT costs one read.
				if e.Kind == expr.VerdictGoto || e.Kind == expr.VerdictJump {
					if err := n.collectDNATs(ctx, c, t, e.Chain, depth+1, seen, out); err != nil {
						return err
					}
				}
			case *expr.Lookup:
				if !e.IsDestRegSet {
					continue // a set match, not a map
				}
				set, err := c.GetSetByName(t, e.SetName)
				if err != nil {
					return nftError("read map "+e.SetName, err)
				}
				elems, err := c.GetSetElements(set)
				if err != nil {
					return nftError("read the elements of map "+e.SetName, err)
				}
				if e.DestRegister != 0 {
					// A data map, such as the endpoints' addresses and ports a DNAT picks from.
					for _, el := range elems {
						mapped[e.DestRegister] = append(mapped[e.DestRegister], el.Val)
					}
					continue
				}
				for _, el := range elems {
					if v, ok := parseVerdict(el.Val); ok && (v.Kind == expr.VerdictGoto || v.Kind == expr.VerdictJump) {
						if err := n.collectDNATs(ctx, c, t, v.Chain, depth+1, seen, out); err != nil {
							return err
						}
					}
				}
			}
		}
	}
	return nil
}

// mappedDNATs returns the targets of a DNAT whose address and port registers a map lookup wrote: each
// element's data is the address, then the port at the offset of the port's register from the address's.
func mappedDNATs(data [][]byte, nat *expr.NAT) []netip.AddrPort {
	addrLen := net.IPv4len
	if nat.Family == unix.NFPROTO_IPV6 {
		addrLen = net.IPv6len
	}
	portAt := registerOffset(nat.RegProtoMin) - registerOffset(nat.RegAddrMin)
	var out []netip.AddrPort
	for _, d := range data {
		if portAt < addrLen || len(d) < portAt+2 {
			continue
		}
		addr, ok := netip.AddrFromSlice(d[:addrLen])
		if !ok {
			continue
		}
		out = append(out, netip.AddrPortFrom(addr.Unmap(), binary.BigEndian.Uint16(d[portAt:portAt+2])))
	}
	return out
}

// registerOffset is where an nftables register starts in the kernel's register file: registers 1 to 4 are
// 16 bytes each, the 32-bit registers (NFT_REG32_00 = 8 on) 4 bytes each, over the same bytes.
func registerOffset(reg uint32) int {
	if reg >= unix.NFT_REG32_00 {
		return int(reg-unix.NFT_REG32_00) * 4
	}
	return int(reg-unix.NFT_REG_1) * 16
}

// parseVerdict reads the verdict of a map element: google/nftables returns its nested attributes as they
// came (NFTA_VERDICT_CODE, NFTA_VERDICT_CHAIN).
func parseVerdict(b []byte) (expr.Verdict, bool) {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return expr.Verdict{}, false
	}
	ad.ByteOrder = binary.BigEndian
	var v expr.Verdict
	ok := false
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_VERDICT_CODE:
			v.Kind = expr.VerdictKind(int32(ad.Uint32()))
			ok = true
		case unix.NFTA_VERDICT_CHAIN:
			v.Chain = ad.String()
		}
	}
	return v, ok && ad.Err() == nil
}

// IPTablesNFTChainExists reports whether iptables-nft's table (an nftables table of family ip) holds
// chain: iptables-nft rules can be found without the iptables commands.
func (n *NFTablesManager) IPTablesNFTChainExists(ctx context.Context, table, chain string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	c, err := nftables.New()
	if err != nil {
		return false, nftError("open netlink", err)
	}
	t := &nftables.Table{Name: table, Family: nftables.TableFamilyIPv4}
	if ok, err := tableOfFamilyExists(c, table, nftables.TableFamilyIPv4); err != nil || !ok {
		if err != nil && nfTablesUnsupported(err) {
			return false, nil
		}
		return false, err
	}
	_, err = c.ListChain(t, chain)
	switch {
	case isNotExist(err):
		return false, nil
	case err != nil:
		return false, nftError("read chain "+chain+" of table ip "+table, err)
	}
	return true, nil
}

// NFTablesUnsupported reports whether err says that the kernel has no nf_tables.
func NFTablesUnsupported(err error) bool { return nfTablesUnsupported(err) }
