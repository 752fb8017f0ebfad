package rules

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
)

// GuardChain is the nat chain of the fail-open guard. While it exists the node has failed open: the
// cache's jumps are out and its local addresses that no kube-proxy rule serves are diverted to the
// cluster DNS. Its presence is also the guard's word to the cache's reconciler that the jumps must stay
// out until the cache answers again.
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
// and OUTPUT (the host), that DNATs UDP and TCP to each Divert's From and port to its To. Diverts of
// other families are ignored; with none the chain is empty and only marks the node as failed open.
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
	return Ruleset{Family: fam, Chains: []Chain{c}}
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
