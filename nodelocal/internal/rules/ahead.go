//go:build linux

package rules

import "fmt"

// AheadRule is a rule of someone else's that sat ahead of our jump in a hook: packets met it before our
// chain. In raw, one that ends the table's walk (ACCEPT, DROP, a RETURN or a chain that does) keeps the
// packet from our NOTRACK, so conntrack tracks it and kube-proxy's nat rules apply to it
// (kubernetes-sigs/node-local-dns#13: TCP lookups time out).
type AheadRule struct {
	Family Family
	Table  Table
	Chain  string
	// Position is the rule's place in Chain, counted from 1 as iptables -L --line-numbers does.
	Position int
	Rule     Rule
}

// Text is the rule as iptables-save prints it.
func (a AheadRule) Text() string {
	return joinArgs(append([]string{"-A", a.Chain}, a.Rule...))
}

// String names the rule: family, table, chain, position and text.
func (a AheadRule) String() string {
	return fmt.Sprintf("%s %s/%s rule %d (%s)", a.Family, a.Table, a.Chain, a.Position, a.Text())
}

// RulesAhead returns the rules of hook (all, its rules in order) before the first jump to chain: what
// traffic meets before our rules. None when the jump is first or absent (nothing of ours to be ahead of).
func RulesAhead(fam Family, table Table, hook string, all []Rule, chain string) []AheadRule {
	var out []AheadRule
	for i, r := range all {
		if target(r) == chain {
			return out
		}
		out = append(out, AheadRule{Family: fam, Table: table, Chain: hook, Position: i + 1, Rule: r})
	}
	return nil
}

// ParseTable reads table from out, iptables-save output of one family.
func ParseTable(out []byte, table Table) (TableState, error) {
	return parseRules(out, table)
}

// EndsWalk reports whether r, when it matches, ends the walk of its table's chain for the packet, so that
// no rule after it sees the packet: ACCEPT, DROP, REJECT, or RETURN (from a hook chain, its policy). A jump
// to another chain may end it too, through that chain's rules; EndsWalk does not follow it.
func EndsWalk(r Rule) bool {
	switch target(r) {
	case "ACCEPT", "DROP", "REJECT", "RETURN":
		return true
	}
	return false
}
