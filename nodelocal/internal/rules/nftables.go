//go:build linux

package rules

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
)

// The tables of the nftables backend, all of family inet (IPv4 and IPv6 in one table). Each is ours as a
// whole: written in one transaction that deletes and recreates it, and deleted as a whole.
const (
	// NFTablesTable holds the cache's NOTRACK rules.
	NFTablesTable = "nodelocaldns"
	// NFTablesGuardTable is the fail-open guard's: while it exists the node has failed open (see GuardChain).
	NFTablesGuardTable = "nodelocaldns-guard"
	// NFTablesProbeTable exempts the cache's own probes from connection tracking while they run.
	NFTablesProbeTable = "nodelocaldns-probe"
)

// Chains of the cache's table. The base chains hold one jump each to the regular chain that holds the
// rules, as the iptables chains are reached by one jump from each built-in chain: failing open deletes the
// base chains (the hooks) and keeps the rules.
const (
	nftEndpointsChain  = "endpoints"
	nftPreroutingChain = "prerouting"
	nftOutputChain     = "output"
)

// NFTablesManager writes the cache's, the guard's and the probe's tables with nftables over netlink: no nft or
// iptables command is needed. Every write is one netlink batch, which the kernel applies as one
// transaction. Reads ask for our tables and chains by name, so their cost does not grow with the rules of
// others (kube-proxy's table, a firewall's). Netlink calls do not block on a lock as iptables does; the
// context is checked between them.
type NFTablesManager struct{}

// NewNFTablesManager returns the nftables backend of the current network namespace.
func NewNFTablesManager() *NFTablesManager { return &NFTablesManager{} }

func inetTable(name string) *nftables.Table {
	return &nftables.Table{Name: name, Family: nftables.TableFamilyINet}
}

// nftRule is a rule of ours: its expressions and a comment, which `nft list` shows.
type nftRule struct {
	exprs   []expr.Any
	comment string
}

// nftChain is a chain of ours; hook is nil for a regular chain.
type nftChain struct {
	name     string
	typ      nftables.ChainType
	hook     *nftables.ChainHook
	priority *nftables.ChainPriority
	rules    []nftRule
}

// nftTable is one of our tables as a whole. Chains are listed so that a chain comes before the chains that
// jump to it.
type nftTable struct {
	name   string
	chains []nftChain
}

func (t nftTable) ruleCount() int {
	n := 0
	for _, c := range t.chains {
		n += len(c.rules)
	}
	return n
}

// cacheTable is the cache's table for endpoints of both families, its rules laid out by traffic (byTraffic).
func cacheTable(endpoints []Endpoint, comment string) nftTable {
	if comment == "" {
		comment = DefaultComment
	}
	rules := nftChain{name: nftEndpointsChain}
	for _, e := range byTraffic(endpoints) {
		for _, to := range []bool{true, false} {
			dir := "from"
			if to {
				dir = "to"
			}
			exprs := append(matchEndpoint(e, to), &expr.Notrack{})
			rules.rules = append(rules.rules, nftRule{exprs: exprs,
				comment: fmt.Sprintf("%s: %s %s %s/%d", comment, dir, e.Addr, e.Protocol, e.Port)})
		}
	}
	jump := nftRule{
		exprs:   []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: nftEndpointsChain}},
		comment: comment + ": skip conntrack for the node-local DNS cache",
	}
	return nftTable{name: NFTablesTable, chains: []nftChain{
		rules,
		{name: nftPreroutingChain, typ: nftables.ChainTypeFilter, hook: nftables.ChainHookPrerouting, priority: nftables.ChainPriorityRaw, rules: []nftRule{jump}},
		{name: nftOutputChain, typ: nftables.ChainTypeFilter, hook: nftables.ChainHookOutput, priority: nftables.ChainPriorityRaw, rules: []nftRule{jump}},
	}}
}

// Register 1 holds what a rule compares; registers 1 and 2 the address and port of a DNAT.
const (
	nftReg1 = 1
	nftReg2 = 2
)

func nfproto(a netip.Addr) byte {
	if a.Unmap().Is4() {
		return unix.NFPROTO_IPV4
	}
	return unix.NFPROTO_IPV6
}

// matchAddr matches the packet's destination (dst) or source address against a. In an inet table the
// network header is read only after the protocol family is known.
func matchAddr(a netip.Addr, dst bool) []expr.Any {
	a = a.Unmap()
	var offset, length uint32 = 12, 4 // IPv4 source address
	switch {
	case a.Is4() && dst:
		offset = 16
	case a.Is6() && dst:
		offset, length = 24, 16
	case a.Is6():
		offset, length = 8, 16
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: nftReg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: nftReg1, Data: []byte{nfproto(a)}},
		&expr.Payload{DestRegister: nftReg1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: length},
		&expr.Cmp{Op: expr.CmpOpEq, Register: nftReg1, Data: a.AsSlice()},
	}
}

func l4proto(p Protocol) byte {
	if p == TCP {
		return unix.IPPROTO_TCP
	}
	return unix.IPPROTO_UDP
}

// matchPort matches the transport protocol and the destination (dst) or source port.
func matchPort(p Protocol, port uint16, dst bool) []expr.Any {
	var offset uint32 // source port
	if dst {
		offset = 2
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: nftReg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: nftReg1, Data: []byte{l4proto(p)}},
		&expr.Payload{DestRegister: nftReg1, Base: expr.PayloadBaseTransportHeader, Offset: offset, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: nftReg1, Data: binaryutil.BigEndian.PutUint16(port)},
	}
}

// matchEndpoint matches packets to the endpoint (to) or from it.
func matchEndpoint(e Endpoint, to bool) []expr.Any {
	return append(matchAddr(e.Addr, to), matchPort(e.Protocol, e.Port, to)...)
}

// NFTablesResult says what a sync of the nftables backend found and did.
type NFTablesResult struct {
	// Changed is true when the sync rewrote the table.
	Changed bool
	// Differences say what was not as wanted (empty when Changed is false).
	Differences []string
	// Rules is the number of rules in the table, jumps included.
	Rules int
}

// SyncCache makes the node hold the cache's table for endpoints (both families): base chains at the raw
// priority of the prerouting and output hooks that jump to a chain with a NOTRACK rule for packets to
// and from each endpoint. It reads the table's three chains by name and writes nothing when all is in
// place; otherwise one transaction replaces the table. With no endpoints it deletes the table.
func (n *NFTablesManager) SyncCache(ctx context.Context, endpoints []Endpoint, comment string) (NFTablesResult, error) {
	if len(endpoints) == 0 {
		_, err := n.deleteTable(ctx, NFTablesTable)
		return NFTablesResult{}, err
	}
	want := cacheTable(endpoints, comment)
	res := NFTablesResult{Rules: want.ruleCount()}
	diffs, err := n.diff(ctx, want)
	if err != nil || len(diffs) == 0 {
		return res, err
	}
	if err := n.replaceTable(ctx, want); err != nil {
		return res, err
	}
	res.Changed, res.Differences = true, diffs
	return res, nil
}

// DeleteCache deletes the cache's table; a table already gone is not an error. It reports whether there
// was one.
func (n *NFTablesManager) DeleteCache(ctx context.Context) (bool, error) {
	return n.deleteTable(ctx, NFTablesTable)
}

// CacheHooked reports whether the cache's table has a base chain: whether its NOTRACK rules see traffic.
func (n *NFTablesManager) CacheHooked(ctx context.Context) (bool, error) {
	pre, out, err := n.CacheHooks(ctx)
	return pre || out, err
}

// CacheHooks reports whether the cache's table has its base chain at the prerouting hook (Pods' traffic)
// and at the output hook (the host's).
func (n *NFTablesManager) CacheHooks(ctx context.Context) (prerouting, output bool, err error) {
	c, err := nftables.New()
	if err != nil {
		return false, false, nftError("open netlink", err)
	}
	if ok, err := tableExists(c, NFTablesTable); err != nil || !ok {
		return false, false, err
	}
	var found [2]bool
	for i, name := range []string{nftPreroutingChain, nftOutputChain} {
		if err := ctx.Err(); err != nil {
			return false, false, err
		}
		if found[i], err = chainExists(c, NFTablesTable, name); err != nil {
			return false, false, err
		}
	}
	return found[0], found[1], nil
}

// UnhookCache deletes the base chains of the cache's table and keeps its rules: traffic then takes its
// course as if we were not there, and the cache's next SyncCache puts them back. It reports whether there
// was anything to delete.
func (n *NFTablesManager) UnhookCache(ctx context.Context) (bool, error) {
	c, err := nftables.New()
	if err != nil {
		return false, nftError("open netlink", err)
	}
	if ok, err := tableExists(c, NFTablesTable); err != nil || !ok {
		return false, err
	}
	t := inetTable(NFTablesTable)
	found := false
	for _, name := range []string{nftPreroutingChain, nftOutputChain} {
		ok, err := chainExists(c, NFTablesTable, name)
		if err != nil {
			return false, err
		}
		if ok {
			ch := &nftables.Chain{Name: name, Table: t}
			c.FlushChain(ch)
			c.DelChain(ch)
			found = true
		}
	}
	if !found {
		return false, nil
	}
	if err := ctx.Err(); err != nil {
		return false, err
	}
	if err := c.Flush(); err != nil {
		return false, nftError("delete the base chains of table inet "+NFTablesTable, err)
	}
	return true, nil
}

// TableExists reports whether table inet name exists.
func (n *NFTablesManager) TableExists(ctx context.Context, name string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	c, err := nftables.New()
	if err != nil {
		return false, nftError("open netlink", err)
	}
	return tableExists(c, name)
}

// diff returns what differs between want and the node, reading only want's table and chains.
func (n *NFTablesManager) diff(ctx context.Context, want nftTable) ([]string, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, nftError("open netlink", err)
	}
	t, err := c.ListTableOfFamily(want.name, nftables.TableFamilyINet)
	if isNotExist(err) {
		return []string{"table inet " + want.name + " missing"}, nil
	}
	if err != nil {
		return nil, nftError("read table inet "+want.name, err)
	}
	var diffs []string
	// The table's use count is the number of its chains, sets and other objects: one more than ours is
	// something someone else added, which the rewrite removes.
	if use := tableUse(t); int(use) != len(want.chains) {
		diffs = append(diffs, fmt.Sprintf("table holds %d objects, want %d", use, len(want.chains)))
	}
	for _, wc := range want.chains {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		have, err := c.ListChain(t, wc.name)
		if isNotExist(err) {
			diffs = append(diffs, "chain "+wc.name+" missing")
			continue
		}
		if err != nil {
			return nil, nftError("read chain "+wc.name, err)
		}
		if !sameHook(have, wc) {
			diffs = append(diffs, "chain "+wc.name+" has another type, hook or priority")
			continue
		}
		rules, err := c.GetRules(t, have)
		if isNotExist(err) {
			diffs = append(diffs, "chain "+wc.name+" missing")
			continue
		}
		if err != nil {
			return nil, nftError("read the rules of chain "+wc.name, err)
		}
		if !sameRuleList(rules, wc.rules) {
			diffs = append(diffs, fmt.Sprintf("chain %s holds %d rules, not the %d wanted", wc.name, len(rules), len(wc.rules)))
		}
	}
	return diffs, nil
}

func sameHook(have *nftables.Chain, want nftChain) bool {
	if want.hook == nil {
		return have.Hooknum == nil
	}
	return have.Hooknum != nil && *have.Hooknum == *want.hook &&
		have.Priority != nil && *have.Priority == *want.priority &&
		have.Type == want.typ &&
		(have.Policy == nil || *have.Policy == nftables.ChainPolicyAccept)
}

// sameRuleList compares rules read back with the wanted ones, expression by expression in their netlink
// form, and by comment.
func sameRuleList(have []*nftables.Rule, want []nftRule) bool {
	if len(have) != len(want) {
		return false
	}
	for i, r := range have {
		if comment, _ := userdata.GetString(r.UserData, userdata.TypeComment); comment != want[i].comment {
			return false
		}
		if len(r.Exprs) != len(want[i].exprs) {
			return false
		}
		for j, e := range r.Exprs {
			a, err1 := expr.Marshal(byte(nftables.TableFamilyINet), e)
			b, err2 := expr.Marshal(byte(nftables.TableFamilyINet), want[i].exprs[j])
			if err1 != nil || err2 != nil || !bytes.Equal(a, b) {
				return false
			}
		}
	}
	return true
}

// replaceTable writes t in one transaction: the table is added (a no-op when it exists), deleted with
// everything in it, and created afresh with its chains and rules. The kernel applies all of it or nothing,
// so no packet sees a half-written table.
func (n *NFTablesManager) replaceTable(ctx context.Context, want nftTable) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c, err := nftables.New()
	if err != nil {
		return nftError("open netlink", err)
	}
	t := inetTable(want.name)
	c.AddTable(t)
	c.DelTable(t)
	c.AddTable(t)
	for _, wc := range want.chains {
		ch := &nftables.Chain{Name: wc.name, Table: t}
		if wc.hook != nil {
			ch.Type, ch.Hooknum, ch.Priority = wc.typ, wc.hook, wc.priority
			accept := nftables.ChainPolicyAccept
			ch.Policy = &accept
		}
		c.AddChain(ch)
		for _, r := range wc.rules {
			c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: r.exprs,
				UserData: userdata.AppendString(nil, userdata.TypeComment, r.comment)})
		}
	}
	if err := c.Flush(); err != nil {
		return nftError("write table inet "+want.name, err)
	}
	return nil
}

// deleteTable deletes table inet name if it exists, and reports whether it did.
func (n *NFTablesManager) deleteTable(ctx context.Context, name string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	c, err := nftables.New()
	if err != nil {
		return false, nftError("open netlink", err)
	}
	ok, err := tableExists(c, name)
	if err != nil || !ok {
		return false, err
	}
	t := inetTable(name)
	// Added first so that the delete cannot fail on a table that went away in between.
	c.AddTable(t)
	c.DelTable(t)
	if err := c.Flush(); err != nil {
		return false, nftError("delete table inet "+name, err)
	}
	return true, nil
}

// tableUse returns the table's use count. google/nftables v0.3.0 decodes NFTA_TABLE_USE in host byte
// order; the kernel sends it in network byte order.
func tableUse(t *nftables.Table) uint32 {
	return binary.BigEndian.Uint32(binary.NativeEndian.AppendUint32(nil, t.Use))
}

func tableExists(c *nftables.Conn, name string) (bool, error) {
	return tableOfFamilyExists(c, name, nftables.TableFamilyINet)
}

func tableOfFamilyExists(c *nftables.Conn, name string, fam nftables.TableFamily) (bool, error) {
	_, err := c.ListTableOfFamily(name, fam)
	switch {
	case isNotExist(err):
		return false, nil
	case err != nil:
		return false, nftError("read table "+familyName(fam)+" "+name, err)
	}
	return true, nil
}

func chainExists(c *nftables.Conn, table, name string) (bool, error) {
	_, err := c.ListChain(inetTable(table), name)
	switch {
	case isNotExist(err):
		return false, nil
	case err != nil:
		return false, nftError("read chain "+name+" of table inet "+table, err)
	}
	return true, nil
}

// isNotExist reports whether err says that a table, chain or set does not exist. google/nftables wraps
// some netlink errors with %v, which keeps only their text.
func isNotExist(err error) bool {
	return err != nil && (errors.Is(err, unix.ENOENT) || strings.Contains(err.Error(), unix.ENOENT.Error()))
}

func familyName(fam nftables.TableFamily) string {
	switch fam {
	case nftables.TableFamilyIPv4:
		return "ip"
	case nftables.TableFamilyIPv6:
		return "ip6"
	case nftables.TableFamilyINet:
		return "inet"
	}
	return fmt.Sprintf("family(%d)", fam)
}

// NFTablesError is a failed nftables netlink operation.
type NFTablesError struct {
	// Op says what was being done.
	Op  string
	Err error
}

func (e *NFTablesError) Error() string { return "nftables: " + e.Op + ": " + e.Err.Error() }
func (e *NFTablesError) Unwrap() error { return e.Err }

func nftError(op string, err error) error { return &NFTablesError{Op: op, Err: err} }
