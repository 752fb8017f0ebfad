//go:build linux

package rules

import (
	"bufio"
	"bytes"
	"fmt"
	"slices"
	"strings"
)

// payload collects the lines of one iptables-restore transaction, grouped by table.
type payload struct {
	lines map[Table][]string
}

func (p *payload) add(t Table, line string) {
	if p.lines == nil {
		p.lines = map[Table][]string{}
	}
	p.lines[t] = append(p.lines[t], line)
}

// declare creates the chain, or empties it if it exists: with --noflush, a chain line flushes that chain only.
func (p *payload) declare(t Table, chain string) {
	p.add(t, ":"+chain+" - [0:0]")
}

// rule adds a rule command such as "-A CHAIN args" or "-I CHAIN 1 args".
func (p *payload) rule(t Table, cmd ...string) {
	p.add(t, joinArgs(cmd))
}

func (p *payload) empty() bool { return len(p.lines) == 0 }

func (p *payload) bytes() []byte {
	var b bytes.Buffer
	for _, t := range tableOrder {
		lines := p.lines[t]
		if len(lines) == 0 {
			continue
		}
		b.WriteString("*" + string(t) + "\n")
		for _, l := range lines {
			b.WriteString(l + "\n")
		}
		b.WriteString("COMMIT\n")
	}
	return b.Bytes()
}

// Payload returns the restore input that writes the whole ruleset from scratch: every chain declared
// (which creates or empties it), its rules, and the jumps inserted at position 1. Manager.Sync writes only
// what differs; Payload shows what the ruleset amounts to.
func (rs Ruleset) Payload() ([]byte, error) {
	if err := rs.Validate(); err != nil {
		return nil, err
	}
	var p payload
	for _, c := range rs.Chains {
		p.declare(c.Table, c.Name)
		for _, r := range c.Rules {
			p.rule(c.Table, append([]string{"-A", c.Name}, r...)...)
		}
	}
	for _, c := range rs.Chains {
		for _, h := range c.Hooks {
			p.rule(c.Table, append([]string{"-I", h, "1"}, c.Jump()...)...)
		}
	}
	return p.bytes(), nil
}

// joinArgs quotes arguments the way iptables-save does, so that iptables-restore splits them back.
func joinArgs(args []string) string {
	var b strings.Builder
	for i, a := range args {
		if i > 0 {
			b.WriteByte(' ')
		}
		if a != "" && !strings.ContainsAny(a, " \t\"\\'") {
			b.WriteString(a)
			continue
		}
		b.WriteByte('"')
		for _, r := range a {
			if r == '"' || r == '\\' {
				b.WriteByte('\\')
			}
			b.WriteRune(r)
		}
		b.WriteByte('"')
	}
	return b.String()
}

// splitArgs splits a line of iptables -S or iptables-save output into arguments, undoing the quoting of
// joinArgs.
func splitArgs(line string) ([]string, error) {
	var (
		args    []string
		cur     strings.Builder
		inArg   bool
		quoted  bool
		escaped bool
	)
	for _, r := range line {
		switch {
		case escaped:
			cur.WriteRune(r)
			escaped = false
		case r == '\\':
			escaped, inArg = true, true
		case r == '"':
			quoted, inArg = !quoted, true
		case (r == ' ' || r == '\t') && !quoted:
			if inArg {
				args = append(args, cur.String())
				cur.Reset()
				inArg = false
			}
		default:
			cur.WriteRune(r)
			inArg = true
		}
	}
	if quoted || escaped {
		return nil, fmt.Errorf("unterminated quote or escape in %q", line)
	}
	if inArg {
		args = append(args, cur.String())
	}
	return args, nil
}

// TableState is one table as iptables-save (or iptables -S) prints it.
type TableState struct {
	// Chains maps every chain of the table to its rules.
	Chains map[string][]Rule
}

// ChainExists reports whether the table has the chain.
func (s TableState) ChainExists(chain string) bool {
	_, ok := s.Chains[chain]
	return ok
}

// JumpPosition is a rule that jumps to one of our chains, by chain and 1-based position.
type JumpPosition struct {
	From     string
	Position int
}

// JumpsTo lists every rule in the table, in any chain, whose target is chain.
func (s TableState) JumpsTo(chain string) []JumpPosition {
	var out []JumpPosition
	names := make([]string, 0, len(s.Chains))
	for n := range s.Chains {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		for i, r := range s.Chains[n] {
			if target(r) == chain {
				out = append(out, JumpPosition{From: n, Position: i + 1})
			}
		}
	}
	return out
}

// RuleCount returns the number of rules in chain plus the number of jumps to it.
func (s TableState) RuleCount(chain string) int {
	return len(s.Chains[chain]) + len(s.JumpsTo(chain))
}

// Len returns the number of rules in the whole table.
func (s TableState) Len() int {
	n := 0
	for _, rs := range s.Chains {
		n += len(rs)
	}
	return n
}

// parseRules reads iptables-save or iptables -S output. With table set, only that table's section of
// iptables-save output is read; -S output has no sections and is read whole.
func parseRules(out []byte, table Table) (TableState, error) {
	st := TableState{Chains: map[string][]Rule{}}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 64*1024), 4*1024*1024)
	inTable := true
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "*"):
			inTable = table == "" || line[1:] == string(table)
		case line == "COMMIT":
		case !inTable:
		case strings.HasPrefix(line, ":"):
			name, _, _ := strings.Cut(line[1:], " ")
			if _, ok := st.Chains[name]; !ok {
				st.Chains[name] = nil
			}
		case strings.HasPrefix(line, "-P ") || strings.HasPrefix(line, "-N "):
			f := strings.Fields(line)
			if _, ok := st.Chains[f[1]]; !ok {
				st.Chains[f[1]] = nil
			}
		case strings.HasPrefix(line, "-A "):
			args, err := splitArgs(line)
			if err != nil {
				return TableState{}, err
			}
			if len(args) < 2 {
				return TableState{}, fmt.Errorf("malformed rule %q", line)
			}
			st.Chains[args[1]] = append(st.Chains[args[1]], Rule(args[2:]))
		default:
			return TableState{}, fmt.Errorf("unexpected line %q", line)
		}
	}
	if err := sc.Err(); err != nil {
		return TableState{}, err
	}
	return st, nil
}

// chainFromSave returns one chain's rules from iptables-save output, and whether the table has the chain,
// parsing no other chain's rules.
func chainFromSave(out []byte, table Table, name string) ([]Rule, bool, error) {
	header := []byte("*" + string(table) + "\n")
	_, after, ok := bytes.Cut(out, header)
	if !ok {
		return nil, false, fmt.Errorf("no table %s in the output", table)
	}
	section := after
	if end := bytes.Index(section, []byte("\nCOMMIT")); end >= 0 {
		section = section[:end+1]
	}
	declared := []byte(":" + name + " ")
	prefix := []byte("-A " + name + " ")
	exists := false
	var rules []Rule
	for len(section) > 0 {
		line := section
		if nl := bytes.IndexByte(section, '\n'); nl >= 0 {
			line, section = section[:nl], section[nl+1:]
		} else {
			section = nil
		}
		switch {
		case bytes.HasPrefix(line, declared):
			exists = true
		case bytes.HasPrefix(line, prefix):
			args, err := splitArgs(string(line))
			if err != nil {
				return nil, false, err
			}
			rules = append(rules, Rule(args[2:]))
		}
	}
	return rules, exists, nil
}

// target returns the chain or target a rule jumps (or goes) to, or "".
// Target returns the chain or target the rule jumps to ("-j"), or "".
func (r Rule) Target() string { return target(r) }

func target(r Rule) string {
	for i := len(r) - 2; i >= 0; i-- {
		switch r[i] {
		case "-j", "--jump", "-g", "--goto":
			return r[i+1]
		}
	}
	return ""
}
