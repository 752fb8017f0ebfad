//go:build linux

package nodelocal

import (
	"fmt"

	"github.com/nodelocaldns/nodelocaldns/nodelocal/internal/rules"
)

// AheadRule is another component's rule that sat ahead of the cache's jump in a hook chain of the raw or
// filter table: packets met it before the cache's rules, and one that ends the table's walk (ACCEPT, DROP)
// kept them from NOTRACK (kubernetes-sigs/node-local-dns#13). In nftables no such rule exists: an accept in
// another table's base chain, at any priority, ends only that chain, and the packet still meets the cache's.
type AheadRule struct {
	// Family is "IPv4" or "IPv6"; Table "raw" or "filter"; Chain the hook, such as PREROUTING.
	Family, Table, Chain string
	// Position is the rule's place in Chain, from 1 (iptables -L --line-numbers).
	Position int
	// Text is the rule as iptables-save prints it.
	Text string
}

func (a AheadRule) String() string {
	return fmt.Sprintf("%s %s/%s rule %d (%s)", a.Family, a.Table, a.Chain, a.Position, a.Text)
}

// aheadRule is a as nodelocal's callers see it; both print the same.
func aheadRule(a rules.AheadRule) AheadRule {
	return AheadRule{Family: a.Family.String(), Table: string(a.Table), Chain: a.Chain, Position: a.Position, Text: a.Text()}
}
