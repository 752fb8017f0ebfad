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

// Divert sends DNS traffic for a local address of the cache to another address, the kube-dns-upstream
// Service's ClusterIP, while the guard has failed open.
type Divert struct {
	// From is the cache's local address (the link-local one, which no kube-proxy rule serves).
	From netip.Addr
	// To is where its traffic goes instead; same family as From.
	To netip.Addr
	// Port is the DNS port of both; 53 when zero.
	Port uint16
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
		for _, proto := range []string{string(UDP), string(TCP)} {
			c.Rules = append(c.Rules, Rule{
				"-d", netip.PrefixFrom(from, from.BitLen()).String(),
				"-p", proto, "-m", proto, "--dport", strconv.Itoa(int(port)),
				"-m", "comment", "--comment", fmt.Sprintf("%s: %s %s/%d to %s", GuardComment, from, proto, port, to),
				"-j", "DNAT", "--to-destination", dest,
			})
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
