//go:build linux

package rules

import (
	"context"
	"errors"
	"fmt"
	"math"
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

// Divert is a fail-open's wish for one local address of the cache: send its DNS traffic to the cluster
// DNS, the kube-dns-upstream Service, while the node has failed open. How it gets there depends on the
// node's kube-proxy mode; DivertRoute says how.
type Divert struct {
	// From is the cache's local address (the link-local one, which no kube-proxy rule serves).
	From netip.Addr
	// To is the kube-dns-upstream ClusterIP; same family as From.
	To netip.Addr
	// Port is the DNS port of both; 53 when zero.
	Port uint16
}

// DivertRoute sends the DNS traffic for one of the cache's local addresses over one protocol to the
// endpoints behind the kube-dns-upstream Service while the node has failed open. A DNAT ends NAT for a
// connection, so kube-proxy's own DNAT never sees traffic diverted before it: the route's endpoints are the
// ClusterIP itself where that is an address of the node (IPVS mode, where IPVS takes it from there), and
// elsewhere the endpoints kube-proxy DNATs the ClusterIP to, read from its rules. No rule of ours refers to
// one of kube-proxy's chains, so kube-proxy can always rewrite or delete its own.
type DivertRoute struct {
	// From is the cache's local address, Port its DNS port.
	From netip.Addr
	Port uint16
	// Protocol is the protocol diverted.
	Protocol Protocol
	// To are the endpoints, of From's family; traffic is spread evenly over them.
	To []netip.AddrPort
	// Masquerade marks the host's own lookups of From (their source is From itself) for kube-proxy's
	// masquerading (KUBE-MARK-MASQ), so that a cluster-DNS Pod on another node can answer them. iptables
	// only; set it where the endpoints are not on the node and KUBE-MARK-MASQ exists.
	Masquerade bool
}

// endpoint is the cache's endpoint the route diverts.
func (r DivertRoute) endpoint() Endpoint {
	return Endpoint{Addr: r.From, Protocol: r.Protocol, Port: r.Port}
}

func (r DivertRoute) String() string {
	return fmt.Sprintf("%s %s/%d to %v", r.From, r.Protocol, r.Port, r.To)
}

// SortDivertRoutes sorts routes by address, then UDP before TCP, then port, each route's endpoints too,
// so that two plans of the same routes compare equal.
func SortDivertRoutes(routes []DivertRoute) []DivertRoute {
	out := slices.Clone(routes)
	for i := range out {
		out[i].To = slices.Clone(out[i].To)
		slices.SortFunc(out[i].To, netip.AddrPort.Compare)
	}
	slices.SortFunc(out, func(a, b DivertRoute) int { return a.endpoint().Compare(b.endpoint()) })
	return out
}

// SameDivertRoutes reports whether a and b send the same traffic to the same endpoints.
func SameDivertRoutes(a, b []DivertRoute) bool {
	return slices.EqualFunc(SortDivertRoutes(a), SortDivertRoutes(b), func(x, y DivertRoute) bool {
		return x.From == y.From && x.Port == y.Port && x.Protocol == y.Protocol && x.Masquerade == y.Masquerade && slices.Equal(x.To, y.To)
	})
}

// Guard builds the guard's ruleset for one family: a chain in the nat table, hooked from PREROUTING (Pods)
// and OUTPUT (the host), that DNATs each route's traffic to its endpoints, spread evenly (the statistic
// match, as kube-proxy spreads a Service's), and the empty marker chains GuardMarks of the same name. Routes
// of other families are ignored; with none the nat chain is empty and only marks the node as failed open.
func Guard(fam Family, routes []DivertRoute) Ruleset {
	c := Chain{
		Table:       NAT,
		Name:        GuardChain,
		Hooks:       []string{"PREROUTING", "OUTPUT"},
		JumpComment: GuardComment + ": the node-local DNS cache failed; divert its traffic",
	}
	c.Rules = guardRules(fam, routes)
	chains := make([]Chain, 0, 1+len(GuardMarks))
	chains = append(chains, c)
	for _, t := range GuardMarks {
		chains = append(chains, Chain{Table: t, Name: GuardChain})
	}
	return Ruleset{Family: fam, Chains: chains}
}

// guardRules are the nat chain's rules of Guard.
func guardRules(fam Family, routes []DivertRoute) []Rule {
	var out []Rule
	for _, r := range SortDivertRoutes(routes) {
		from := r.From.Unmap()
		if FamilyOf(from) != fam || len(r.To) == 0 {
			continue
		}
		port := r.Port
		if port == 0 {
			port = 53
		}
		proto := string(r.Protocol)
		fromNet := netip.PrefixFrom(from, from.BitLen()).String()
		match := Rule{"-d", fromNet, "-p", proto, "-m", proto, "--dport", strconv.Itoa(int(port))}
		if r.Masquerade {
			out = append(out, append(Rule{"-s", fromNet}, append(slices.Clone(match),
				"-m", "comment", "--comment", fmt.Sprintf("%s: masquerade host lookups of %s %s/%d", GuardComment, from, proto, port),
				"-j", KubeMarkMasqChain)...))
		}
		for i, to := range r.To {
			rule := slices.Clone(match)
			// Rule i of n takes the packet with probability 1/(n-i) when rules 0..i-1 did not: each
			// endpoint gets 1/n. The last rule takes whatever is left.
			if left := len(r.To) - i; left > 1 {
				rule = append(rule, "-m", "statistic", "--mode", "random", "--probability", probability(1/float64(left)))
			}
			out = append(out, append(rule,
				"-m", "comment", "--comment", fmt.Sprintf("%s: %s %s/%d to %s", GuardComment, from, proto, port, to.Addr().Unmap()),
				"-j", "DNAT", "--to-destination", netip.AddrPortFrom(to.Addr().Unmap(), to.Port()).String()))
		}
	}
	return out
}

// probability formats p as iptables-save prints the statistic match's probability, which it keeps as a
// fraction of 2^31: written this way, a rule reads back as it was written.
func probability(p float64) string {
	const scale = 1 << 31
	return strconv.FormatFloat(math.Round(p*scale)/scale, 'f', 11, 64)
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

// RewriteGuardWhileMarked replaces the rules of the guard's nat chain of family fam with those of routes, in
// a transaction that first flushes the chain without declaring it: the transaction fails, changing nothing,
// once the cache has deleted the chain to take the node back. It reports whether it rewrote the chain; a
// chain gone is not an error.
func (m *Manager) RewriteGuardWhileMarked(ctx context.Context, fam Family, routes []DivertRoute) (bool, error) {
	var p payload
	p.rule(NAT, "-F", GuardChain)
	for _, r := range guardRules(fam, routes) {
		p.rule(NAT, append([]string{"-A", GuardChain}, r...)...)
	}
	if err := m.restore(ctx, fam, p.bytes()); err != nil {
		if ok, verr := m.ChainExists(ctx, fam, NAT, GuardChain); verr == nil && !ok {
			return false, nil // taken back while we were at it
		}
		return false, err
	}
	return true, nil
}
