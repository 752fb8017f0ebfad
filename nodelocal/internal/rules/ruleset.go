//go:build linux

// Package rules keeps iptables and ip6tables chains of our own in place, cheaply and atomically.
//
// A Ruleset names chains we own. Each chain is rewritten only as a whole and is reached by one jump at
// position 1 of each built-in chain it hooks. Manager.Sync reads our chains and the first rule of each hook
// (a few processes whose cost does not depend on the rules of others), and when anything differs it
// rewrites what differs in one `iptables-restore --noflush -w` run per address family, in which each table is
// a transaction of its own (iptables-restore commits table by table).
//
// NodeCache builds the ruleset of a node-local DNS cache; other rulesets (a nat chain, say) are plain
// values of the same types.
package rules

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// Family is an IP address family: IPv4 rules live in iptables, IPv6 rules in ip6tables.
type Family uint8

// The address families.
const (
	IPv4 Family = 4
	IPv6 Family = 6
)

// Families lists both families in the order syncs handle them.
var Families = []Family{IPv4, IPv6}

func (f Family) String() string {
	switch f {
	case IPv4:
		return "IPv4"
	case IPv6:
		return "IPv6"
	}
	return "Family(" + strconv.Itoa(int(f)) + ")"
}

// FamilyOf returns the family of a.
func FamilyOf(a netip.Addr) Family {
	if a.Unmap().Is4() {
		return IPv4
	}
	return IPv6
}

// Table is an iptables table.
type Table string

// The tables a ruleset may use.
const (
	Raw    Table = "raw"
	Filter Table = "filter"
	NAT    Table = "nat"
	Mangle Table = "mangle"
)

// tableOrder is the order tables appear in a restore payload.
var tableOrder = []Table{Raw, Mangle, NAT, Filter}

// Rule is one rule: the arguments iptables takes after "-A CHAIN", in the order iptables prints them
// (source, destination, protocol, matches, target), so that a rule read back compares equal.
type Rule []string

// Chain is a chain we own: created and rewritten as a whole, and jumped to from position 1 of each hook.
type Chain struct {
	Table Table
	Name  string
	// Hooks are the built-in chains of Table that jump to this chain as their first rule.
	Hooks []string
	// JumpComment is the comment on the jump rules.
	JumpComment string
	Rules       []Rule
}

// Jump returns the rule a hook uses to reach the chain.
func (c Chain) Jump() Rule {
	return Rule{"-m", "comment", "--comment", c.JumpComment, "-j", c.Name}
}

// Ruleset is everything one family needs from us.
type Ruleset struct {
	Family Family
	Chains []Chain
}

// RuleCount returns how many rules the ruleset installs, jumps included.
func (rs Ruleset) RuleCount() int {
	n := 0
	for _, c := range rs.Chains {
		n += len(c.Rules) + len(c.Hooks)
	}
	return n
}

// Validate checks that the ruleset can be written and that no two chains claim position 1 of the same hook.
func (rs Ruleset) Validate() error {
	if rs.Family != IPv4 && rs.Family != IPv6 {
		return fmt.Errorf("ruleset: unknown address family %d", rs.Family)
	}
	hooks := map[string]string{}
	names := map[string]bool{}
	for _, c := range rs.Chains {
		if !slices.Contains(tableOrder, c.Table) {
			return fmt.Errorf("ruleset: chain %s: unknown table %q", c.Name, c.Table)
		}
		if err := validChainName(c.Name); err != nil {
			return fmt.Errorf("ruleset: %w", err)
		}
		key := string(c.Table) + "/" + c.Name
		if names[key] {
			return fmt.Errorf("ruleset: chain %s appears twice in table %s", c.Name, c.Table)
		}
		names[key] = true
		for _, h := range c.Hooks {
			hk := string(c.Table) + "/" + h
			if other, ok := hooks[hk]; ok {
				return fmt.Errorf("ruleset: chains %s and %s both want position 1 of %s in table %s", other, c.Name, h, c.Table)
			}
			hooks[hk] = c.Name
		}
		if len(c.Hooks) > 0 {
			if err := validTokens(c.Jump()); err != nil {
				return fmt.Errorf("ruleset: jump to %s: %w", c.Name, err)
			}
		}
		for _, r := range c.Rules {
			if len(r) == 0 {
				return fmt.Errorf("ruleset: empty rule in chain %s", c.Name)
			}
			if err := validTokens(r); err != nil {
				return fmt.Errorf("ruleset: rule in chain %s: %w", c.Name, err)
			}
		}
	}
	return nil
}

// validChainName accepts the names iptables accepts for a chain of its own (at most 28 bytes, no blanks).
func validChainName(name string) error {
	if name == "" || len(name) > 28 || strings.ContainsAny(name, " \t\n\"'\\") || strings.HasPrefix(name, "-") {
		return fmt.Errorf("invalid chain name %q", name)
	}
	return nil
}

// validTokens rejects what the restore format cannot carry from us: quotes, backslashes and line breaks.
func validTokens(r Rule) error {
	for _, tok := range r {
		if strings.ContainsAny(tok, "\"\\\n\r") {
			return fmt.Errorf("argument %q holds a quote, backslash or line break", tok)
		}
	}
	return nil
}

// DefaultChain is the name of our chain in the raw and in the filter table.
const DefaultChain = "NODELOCALDNS"

// DefaultComment starts the comment of every rule: it names the project.
const DefaultComment = "nodelocaldns"

// Protocol is a transport protocol a rule matches.
type Protocol string

// The protocols DNS uses.
const (
	UDP Protocol = "udp"
	TCP Protocol = "tcp"
)

// Endpoint is a local address and port the cache serves on.
type Endpoint struct {
	Addr     netip.Addr
	Protocol Protocol
	Port     uint16
}

func (e Endpoint) String() string {
	return fmt.Sprintf("%s %s/%d", e.Addr, e.Protocol, e.Port)
}

// Endpoints lists, for every address, the DNS port over UDP and TCP and each extra port over TCP, sorted and
// without duplicates.
func Endpoints(addrs []netip.Addr, dnsPort uint16, extraTCPPorts []uint16) []Endpoint {
	eps := make([]Endpoint, 0, (2+len(extraTCPPorts))*len(addrs))
	for _, a := range addrs {
		a = a.Unmap()
		eps = append(eps, Endpoint{a, UDP, dnsPort}, Endpoint{a, TCP, dnsPort})
		for _, p := range extraTCPPorts {
			eps = append(eps, Endpoint{a, TCP, p})
		}
	}
	return SortEndpoints(eps)
}

// Compare orders endpoints by address, then UDP before TCP, then port.
func (e Endpoint) Compare(o Endpoint) int {
	if c := e.Addr.Compare(o.Addr); c != 0 {
		return c
	}
	if e.Protocol != o.Protocol {
		if e.Protocol == UDP {
			return -1
		}
		return 1
	}
	return int(e.Port) - int(o.Port)
}

// SortEndpoints sorts endpoints by address, then UDP before TCP, then port, and drops duplicates.
func SortEndpoints(eps []Endpoint) []Endpoint {
	slices.SortFunc(eps, Endpoint.Compare)
	return slices.Compact(eps)
}

// byTraffic orders endpoints as the rules that match them are laid out in a chain: by protocol (UDP first)
// and port, then address, the rule for packets to each endpoint (queries) right before the one for packets
// from it (answers). A packet walks the filter chain until an ACCEPT rule matches it (each rule a few
// compares), so a query over UDP and its answer, most of a cache's packets, are accepted within the chain's
// first rules, where a chain ordered by address alone put the other addresses' TCP and health-port rules
// ahead of the last address's (in iptables mode with the health ports, 7 rules walked instead of 19). The
// raw chain is laid out alike, but NOTRACK does not end a walk: every packet walks all of it (16 rules
// there). Ending that walk after each port's rules was tried and measured, and made no difference
// (nodelocal's README).
func byTraffic(eps []Endpoint) []Endpoint {
	out := SortEndpoints(slices.Clone(eps))
	slices.SortStableFunc(out, func(a, b Endpoint) int {
		if a.Protocol != b.Protocol {
			if a.Protocol == UDP {
				return -1
			}
			return 1
		}
		return int(a.Port) - int(b.Port)
	})
	return out
}

// NodeCacheSpec says what NodeCache builds.
type NodeCacheSpec struct {
	// Chain names our chain in both tables; DefaultChain when empty.
	Chain string
	// Comment starts every rule's comment; DefaultComment when empty.
	Comment string
	// Endpoints are the served addresses and ports; those of other families are ignored.
	Endpoints []Endpoint
	// RepliesOnly leaves the raw chain only the rules for packets from the endpoints: the cache's answers
	// skip connection tracking, queries do not, so that kube-proxy and a divert see every new query while
	// the cache answers what it has (see nodelocal.Reconciler.HandOver).
	RepliesOnly bool
}

// NodeCache builds the rules of a node-local DNS cache for one family.
//
// For every endpoint, one chain in the raw table (hooked from PREROUTING and OUTPUT) exempts the traffic from
// connection tracking, and one chain in the filter table (hooked from INPUT and OUTPUT) accepts it. Each
// chain holds a rule for packets to the endpoint and one for packets from it: in PREROUTING and INPUT the
// first kind matches clients' queries, in OUTPUT the second kind matches answers and the first matches
// queries of clients in the host's network namespace. The rules are laid out by traffic (byTraffic). The
// ruleset has chains but no rules when no endpoint is of the family.
func NodeCache(fam Family, spec NodeCacheSpec) Ruleset {
	chain := spec.Chain
	if chain == "" {
		chain = DefaultChain
	}
	comment := spec.Comment
	if comment == "" {
		comment = DefaultComment
	}
	raw := Chain{Table: Raw, Name: chain, Hooks: []string{"PREROUTING", "OUTPUT"}, JumpComment: comment + ": skip conntrack for the node-local DNS cache"}
	filter := Chain{Table: Filter, Name: chain, Hooks: []string{"INPUT", "OUTPUT"}, JumpComment: comment + ": accept traffic of the node-local DNS cache"}
	for _, e := range byTraffic(spec.Endpoints) {
		if FamilyOf(e.Addr) != fam {
			continue
		}
		if !spec.RepliesOnly {
			raw.Rules = append(raw.Rules, endpointRule("-d", "--dport", e, comment, "NOTRACK"))
		}
		raw.Rules = append(raw.Rules, endpointRule("-s", "--sport", e, comment, "NOTRACK"))
		filter.Rules = append(filter.Rules,
			endpointRule("-d", "--dport", e, comment, "ACCEPT"),
			endpointRule("-s", "--sport", e, comment, "ACCEPT"))
	}
	return Ruleset{Family: fam, Chains: []Chain{raw, filter}}
}

func endpointRule(addrFlag, portFlag string, e Endpoint, comment, target string) Rule {
	dir := "to"
	if addrFlag == "-s" {
		dir = "from"
	}
	prefix := netip.PrefixFrom(e.Addr, e.Addr.BitLen())
	proto := string(e.Protocol)
	return Rule{
		addrFlag, prefix.String(),
		"-p", proto, "-m", proto, portFlag, strconv.Itoa(int(e.Port)),
		"-m", "comment", "--comment", fmt.Sprintf("%s: %s %s %s/%d", comment, dir, e.Addr, proto, e.Port),
		"-j", target,
	}
}
