//go:build linux

package rules

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
)

// GuardChain is the nat chain of the fail-open guard. While it exists the node has failed open: the
// cache's jumps are out and its local addresses that no kube-proxy rule serves are diverted to the
// cluster DNS. Its presence is also the guard's word to the cache's reconciler that the jumps must stay
// out until the cache answers again. Empty chains of the same name in the raw and filter tables, the
// tables of the cache's jumps, carry the same word where RemoveJumpsWhileMarked can check it in the
// transaction that removes the jumps.
const GuardChain = "NODELOCALDNS-GUARD"

// GuardComment starts the comment of every guard rule.
const GuardComment = "nodelocaldns-guard"

// Divert sends DNS traffic for a local address of the cache to the cluster DNS, the kube-dns-upstream
// Service, while the node has failed open: with a DNAT to the Service's ClusterIP where that is an address
// of the node (kube-proxy's IPVS mode), or through kube-proxy's own chains of the Service (iptables mode).
type Divert struct {
	// From is the cache's local address (the link-local one, which no kube-proxy rule serves).
	From netip.Addr
	// To is the kube-dns-upstream ClusterIP; same family as From.
	To netip.Addr
	// Port is the DNS port of both; 53 when zero.
	Port uint16
	// Via are kube-proxy's chains of the Service's DNS port (iptables mode; see
	// Manager.KubeProxyServiceChains). A protocol with a chain jumps there: the chain picks an endpoint
	// and DNATs to it, as it does for the ClusterIP, so no DNAT to the ClusterIP (which would end the nat
	// table's walk before kube-proxy saw the packet) is needed. A protocol without one is DNATed to To.
	Via []ServiceChain
	// MarkMasq marks the host's own lookups of From (their source is From itself) for kube-proxy's
	// masquerading, so that a cluster-DNS Pod on another node can answer them. Set it only where
	// KUBE-MARK-MASQ exists.
	MarkMasq bool
}

// Guard builds the guard's ruleset for one family: a chain in the nat table, hooked from PREROUTING (Pods)
// and OUTPUT (the host), that DNATs UDP and TCP to each Divert's From and port to its To, and the empty
// marker chains GuardMarks of the same name. Diverts of other families are ignored; with none the nat
// chain is empty and only marks the node as failed open.
func Guard(fam Family, diverts []Divert) Ruleset {
	c := Chain{
		Table:       NAT,
		Name:        GuardChain,
		Hooks:       []string{"PREROUTING", "OUTPUT"},
		JumpComment: GuardComment + ": the node-local DNS cache failed; divert its traffic",
	}
	ds := slices.Clone(diverts)
	slices.SortFunc(ds, func(a, b Divert) int {
		if c := a.From.Compare(b.From); c != 0 {
			return c
		}
		return int(a.Port) - int(b.Port)
	})
	for _, d := range ds {
		from, to := d.From.Unmap(), d.To.Unmap()
		if FamilyOf(from) != fam {
			continue
		}
		port := d.Port
		if port == 0 {
			port = 53
		}
		dest := netip.AddrPortFrom(to, port).String()
		fromNet := netip.PrefixFrom(from, from.BitLen()).String()
		for _, proto := range []string{string(UDP), string(TCP)} {
			match := Rule{"-d", fromNet, "-p", proto, "-m", proto, "--dport", strconv.Itoa(int(port))}
			i := slices.IndexFunc(d.Via, func(sc ServiceChain) bool { return string(sc.Protocol) == proto })
			if i < 0 {
				c.Rules = append(c.Rules, append(match,
					"-m", "comment", "--comment", fmt.Sprintf("%s: %s %s/%d to %s", GuardComment, from, proto, port, to),
					"-j", "DNAT", "--to-destination", dest))
				continue
			}
			if d.MarkMasq {
				c.Rules = append(c.Rules, append(Rule{"-s", fromNet}, append(slices.Clone(match),
					"-m", "comment", "--comment", fmt.Sprintf("%s: masquerade host lookups of %s %s/%d", GuardComment, from, proto, port),
					"-j", KubeMarkMasqChain)...))
			}
			c.Rules = append(c.Rules, append(match,
				"-m", "comment", "--comment", fmt.Sprintf("%s: %s %s/%d to %s through kube-proxy", GuardComment, from, proto, port, to),
				"-j", d.Via[i].Chain))
		}
	}
	chains := make([]Chain, 0, 1+len(GuardMarks))
	chains = append(chains, c)
	for _, t := range GuardMarks {
		chains = append(chains, Chain{Table: t, Name: GuardChain})
	}
	return Ruleset{Family: fam, Chains: chains}
}

// GuardMarks are the tables that hold the cache's jumps (NodeCache's raw and filter chains): in each, an
// empty GuardChain with no jump to it marks the node as failed open.
var GuardMarks = []Table{Raw, Filter}

// RemoveJumpsWhileMarked is RemoveJumps made safe against a reclaim running at the same time: each table's
// transaction first flushes the (empty) chain marker in that table, which fails, and so leaves the table
// as it is, when the marker is gone. Whoever deletes the markers and then puts the jumps back (the cache
// taking the node back from the guard) therefore never loses its jumps to this call. It reports whether
// every table of rs held the marker, and whether it removed any jump; a removal that failed because a
// marker went away meanwhile is not an error.
func (m *Manager) RemoveJumpsWhileMarked(ctx context.Context, rs Ruleset, marker string) (marked, removed bool, err error) {
	if err := rs.Validate(); err != nil {
		return false, false, err
	}
	if err := validChainName(marker); err != nil {
		return false, false, err
	}
	var tables []Table
	for _, c := range rs.Chains {
		if len(c.Hooks) > 0 && !slices.Contains(tables, c.Table) {
			tables = append(tables, c.Table)
		}
	}
	v, err := m.view(ctx, rs.Family)
	if err != nil {
		return false, false, err
	}
	if ok, err := markedIn(ctx, v, tables, marker); err != nil || !ok {
		return false, false, err
	}
	deletes := map[Table][][]string{}
	for _, c := range rs.Chains {
		for _, h := range c.Hooks {
			all, _, err := v.chain(ctx, c.Table, h)
			if err != nil {
				return true, false, err
			}
			for _, r := range all {
				if target(r) == c.Name {
					deletes[c.Table] = append(deletes[c.Table], append([]string{"-D", h}, r...))
				}
			}
		}
	}
	if len(deletes) == 0 {
		return true, false, nil
	}
	var p payload
	for _, t := range tables {
		if len(deletes[t]) == 0 {
			continue
		}
		p.rule(t, "-F", marker) // fails when the marker is gone: then the table stays as it is
		for _, d := range deletes[t] {
			p.rule(t, d...)
		}
	}
	if err := m.restore(ctx, rs.Family, p.bytes()); err != nil {
		v, verr := m.view(ctx, rs.Family)
		if verr != nil {
			return true, false, errors.Join(err, verr)
		}
		if ok, verr := markedIn(ctx, v, tables, marker); verr == nil && !ok {
			return false, false, nil // taken back while we were at it
		}
		return true, false, err
	}
	return true, true, nil
}

func markedIn(ctx context.Context, v view, tables []Table, marker string) (bool, error) {
	for _, t := range tables {
		_, exists, err := v.chain(ctx, t, marker)
		if err != nil || !exists {
			return false, err
		}
	}
	return true, nil
}

// ChainExists reports whether table holds a chain called name in family fam.
func (m *Manager) ChainExists(ctx context.Context, fam Family, table Table, name string) (bool, error) {
	v, err := m.view(ctx, fam)
	if err != nil {
		return false, err
	}
	_, exists, err := v.chain(ctx, table, name)
	return exists, err
}

// HasJumps reports whether any hook of rs jumps to its chain, wherever in the hook the jump is.
func (m *Manager) HasJumps(ctx context.Context, rs Ruleset) (bool, error) {
	if err := rs.Validate(); err != nil {
		return false, err
	}
	v, err := m.view(ctx, rs.Family)
	if err != nil {
		return false, err
	}
	for _, c := range rs.Chains {
		for _, h := range c.Hooks {
			all, _, err := v.chain(ctx, c.Table, h)
			if err != nil {
				return false, err
			}
			for _, r := range all {
				if target(r) == c.Name {
					return true, nil
				}
			}
		}
	}
	return false, nil
}
