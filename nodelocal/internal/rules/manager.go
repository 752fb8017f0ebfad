//go:build linux

package rules

import (
	"context"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// DefaultLockWait is how long a command waits for the xtables lock before it fails.
const DefaultLockWait = 5 * time.Second

// ManagerOptions tune a Manager.
type ManagerOptions struct {
	// LockWait bounds the wait for the xtables lock (iptables -w); DefaultLockWait when zero. A context
	// deadline that comes sooner shortens it.
	LockWait time.Duration
}

// Manager reads and writes rulesets through one backend. It holds no state between calls, so one Manager
// may serve several goroutines; callers serialise syncs of the same chains.
type Manager struct {
	backend  *Backend
	run      runner
	lockWait time.Duration
}

// NewManager returns a Manager that drives b.
func NewManager(b *Backend, opts ManagerOptions) *Manager {
	wait := opts.LockWait
	if wait <= 0 {
		wait = DefaultLockWait
	}
	return &Manager{backend: b, run: b.run, lockWait: wait}
}

// Backend returns the backend the Manager drives.
func (m *Manager) Backend() *Backend { return m.backend }

// SyncResult says what a Sync found and did.
type SyncResult struct {
	// Changed is true when Sync wrote anything.
	Changed bool
	// RewrittenChains are the chains Sync declared and filled, as "table/chain".
	RewrittenChains []string
	// RepairedJumps are the hooks whose first rule Sync made a jump to our chain, as "table/hook".
	RepairedJumps []string
	// Ahead are the rules of others that sat ahead of our jumps in the hooks Sync repaired: traffic met them
	// before our chains until Sync put the jumps back in front of them.
	Ahead []AheadRule
	// Rules is the number of rules the ruleset installs, jumps included.
	Rules int
}

// Sync makes the node hold rs: each chain exactly its rules, and a jump to it as the first rule of each of
// its hooks. It reads only our chains and the first rule of each hook (a hook's other rules only when its
// first is not our jump), and writes nothing when all is in place. Otherwise one iptables-restore run
// rewrites the chains that differ, removes misplaced or duplicate jumps and inserts the jump at position 1;
// the rules of others it found ahead of a jump it moved back to the top are in SyncResult.Ahead. Each table
// commits on its own, so a failure in a later table leaves the earlier ones written. Iptables-nft reads only the chains a command names, so the cost of a Sync does not grow
// with the rules of others; iptables-legacy always copies whole tables, so with it Sync reads each table
// once by iptables-save.
func (m *Manager) Sync(ctx context.Context, rs Ruleset) (SyncResult, error) {
	res := SyncResult{Rules: rs.RuleCount()}
	if err := rs.Validate(); err != nil {
		return res, err
	}
	v, err := m.view(ctx, rs.Family)
	if err != nil {
		return res, err
	}
	var p payload
	for _, c := range rs.Chains {
		have, exists, err := v.chain(ctx, c.Table, c.Name)
		if err != nil {
			return res, err
		}
		if !exists || !sameRules(have, c.Rules) {
			p.declare(c.Table, c.Name)
			for _, r := range c.Rules {
				p.rule(c.Table, append([]string{"-A", c.Name}, r...)...)
			}
			res.RewrittenChains = append(res.RewrittenChains, string(c.Table)+"/"+c.Name)
		}
	}
	for _, c := range rs.Chains {
		for _, h := range c.Hooks {
			first, err := v.first(ctx, c.Table, h)
			if err != nil {
				return res, err
			}
			if first != nil && target(first) == c.Name {
				continue
			}
			all, _, err := v.chain(ctx, c.Table, h)
			if err != nil {
				return res, err
			}
			for _, r := range all {
				if target(r) == c.Name {
					p.rule(c.Table, append([]string{"-D", h}, r...)...)
				}
			}
			res.Ahead = append(res.Ahead, RulesAhead(rs.Family, c.Table, h, all, c.Name)...)
			p.rule(c.Table, append([]string{"-I", h, "1"}, c.Jump()...)...)
			res.RepairedJumps = append(res.RepairedJumps, string(c.Table)+"/"+h)
		}
	}
	if p.empty() {
		return res, nil
	}
	if err := m.restore(ctx, rs.Family, p.bytes()); err != nil {
		return res, err
	}
	res.Changed = true
	return res, nil
}

// RemoveJumps deletes every jump from the hooks of rs to its chains and keeps the chains: traffic then
// takes its course as if we were not there, and a later Sync puts the jumps back.
func (m *Manager) RemoveJumps(ctx context.Context, rs Ruleset) error {
	return m.remove(ctx, rs, false)
}

// Delete removes the jumps to the chains of rs, then the chains. Chains or jumps already gone are not an
// error.
func (m *Manager) Delete(ctx context.Context, rs Ruleset) error {
	return m.remove(ctx, rs, true)
}

func (m *Manager) remove(ctx context.Context, rs Ruleset, chains bool) error {
	if err := rs.Validate(); err != nil {
		return err
	}
	v, err := m.view(ctx, rs.Family)
	if err != nil {
		return err
	}
	var p payload
	for _, c := range rs.Chains {
		for _, h := range c.Hooks {
			all, _, err := v.chain(ctx, c.Table, h)
			if err != nil {
				return err
			}
			for _, r := range all {
				if target(r) == c.Name {
					p.rule(c.Table, append([]string{"-D", h}, r...)...)
				}
			}
		}
	}
	if chains {
		for _, c := range rs.Chains {
			_, exists, err := v.chain(ctx, c.Table, c.Name)
			if err != nil {
				return err
			}
			if exists {
				p.rule(c.Table, "-F", c.Name)
				p.rule(c.Table, "-X", c.Name)
			}
		}
	}
	if p.empty() {
		return nil
	}
	return m.restore(ctx, rs.Family, p.bytes())
}

// Inspect reads a whole table with iptables-save. Its cost grows with the table; it is for diagnostics and
// tests, not for every sync.
func (m *Manager) Inspect(ctx context.Context, fam Family, table Table) (TableState, error) {
	t, err := m.backend.Tools(fam)
	if err != nil {
		return TableState{}, err
	}
	out, err := m.run.run(ctx, nil, t.Save, "-t", string(table))
	if err != nil {
		return TableState{}, err
	}
	st, err := parseRules(out, table)
	if err != nil {
		return TableState{}, fmt.Errorf("parse %s -t %s: %w", t.Save, table, err)
	}
	return st, nil
}

func (m *Manager) restore(ctx context.Context, fam Family, in []byte) error {
	t, err := m.backend.Tools(fam)
	if err != nil {
		return err
	}
	if _, err := m.run.run(ctx, in, t.Restore, "-w", m.waitSeconds(ctx), "--noflush"); err != nil {
		return fmt.Errorf("restore %s rules%s: %w", fam, failedLine(err, in), err)
	}
	return nil
}

var restoreLine = regexp.MustCompile(`line (\d+) failed`)

// failedLine quotes the input line iptables-restore names in its complaint, if any.
func failedLine(err error, in []byte) string {
	ce, ok := err.(*CommandError)
	if !ok {
		return ""
	}
	m := restoreLine.FindStringSubmatch(ce.Stderr)
	if m == nil {
		return ""
	}
	n, _ := strconv.Atoi(m[1])
	lines := strings.Split(string(in), "\n")
	if n < 1 || n > len(lines) {
		return ""
	}
	return fmt.Sprintf(" (line %d: %s)", n, lines[n-1])
}

// waitSeconds is the -w argument: the lock wait, cut short by the context's deadline, at least 1 second
// (the unit iptables takes).
func (m *Manager) waitSeconds(ctx context.Context) string {
	wait := m.lockWait
	if d, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(d))
	}
	return strconv.Itoa(max(1, int(math.Ceil(wait.Seconds()))))
}

func sameRules(a, b []Rule) bool {
	return slices.EqualFunc(a, b, func(x, y Rule) bool { return slices.Equal(x, y) })
}

// view answers questions about current chains during one sync.
type view interface {
	// chain returns the rules of a chain and whether it exists.
	chain(ctx context.Context, t Table, name string) ([]Rule, bool, error)
	// first returns the first rule of a chain, or nil when it is empty.
	first(ctx context.Context, t Table, name string) (Rule, error)
}

func (m *Manager) view(_ context.Context, fam Family) (view, error) {
	t, err := m.backend.Tools(fam)
	if err != nil {
		return nil, err
	}
	if m.backend.Mode == Legacy {
		return &saveView{m: m, tools: t, tables: map[Table][]byte{}}, nil
	}
	return &listView{m: m, tools: t}, nil
}

// listView asks iptables for single chains: with nf_tables only the named chain is fetched.
type listView struct {
	m     *Manager
	tools *Tools
}

func (v *listView) list(ctx context.Context, t Table, name string, rule1 bool) ([]Rule, bool, error) {
	args := []string{"-w", v.m.waitSeconds(ctx), "-t", string(t), "-S", name}
	if rule1 {
		args = append(args, "1")
	}
	out, err := v.m.run.run(ctx, nil, v.tools.IPTables, args...)
	if err != nil {
		// Exit status 1 means the chain does not exist (the message differs between versions). A built-in
		// chain always exists, so for those this only ever means what it says.
		if ce, ok := err.(*CommandError); ok && ce.ExitStatus == 1 {
			return nil, false, nil
		}
		return nil, false, err
	}
	st, err := parseRules(out, "")
	if err != nil {
		return nil, false, fmt.Errorf("parse %s -S %s: %w", v.tools.IPTables, name, err)
	}
	return st.Chains[name], true, nil
}

func (v *listView) chain(ctx context.Context, t Table, name string) ([]Rule, bool, error) {
	return v.list(ctx, t, name, false)
}

func (v *listView) first(ctx context.Context, t Table, name string) (Rule, error) {
	rules, exists, err := v.list(ctx, t, name, true)
	if err != nil {
		return nil, err
	}
	if !exists {
		return nil, fmt.Errorf("%s: table %s has no chain %s", v.tools.IPTables, t, name)
	}
	if len(rules) == 0 {
		return nil, nil
	}
	return rules[0], nil
}

// saveView reads each table once with iptables-save: legacy iptables copies the whole table from the
// kernel for any command, so one read per table is the cheapest it gets. Only the lines of the chains
// asked for are parsed.
type saveView struct {
	m      *Manager
	tools  *Tools
	tables map[Table][]byte
}

func (v *saveView) table(ctx context.Context, t Table) ([]byte, error) {
	if out, ok := v.tables[t]; ok {
		return out, nil
	}
	out, err := v.m.run.run(ctx, nil, v.tools.Save, "-t", string(t))
	if err != nil {
		return nil, err
	}
	v.tables[t] = out
	return out, nil
}

func (v *saveView) chain(ctx context.Context, t Table, name string) ([]Rule, bool, error) {
	out, err := v.table(ctx, t)
	if err != nil {
		return nil, false, err
	}
	rules, ok, err := chainFromSave(out, t, name)
	if err != nil {
		return nil, false, fmt.Errorf("parse %s -t %s: %w", v.tools.Save, t, err)
	}
	return rules, ok, nil
}

func (v *saveView) first(ctx context.Context, t Table, name string) (Rule, error) {
	rules, ok, err := v.chain(ctx, t, name)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("%s -t %s lists no chain %s", v.tools.Save, t, name)
	}
	if len(rules) == 0 {
		return nil, nil
	}
	return rules[0], nil
}
