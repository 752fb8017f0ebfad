//go:build linux

package rules

import (
	"context"
	"slices"
	"strconv"
)

// ProbeComment is the comment of the probe exemption rule.
const ProbeComment = DefaultComment + ": probe of the node-local DNS cache"

// ProbeExemption is the rule, in the raw table's OUTPUT chain, that exempts packets carrying mark from
// connection tracking: a cache probing its own addresses before its NOTRACK rules are in place reaches
// itself, not whatever kube-proxy's nat rules would DNAT the address to (they never see untracked packets).
func ProbeExemption(mark uint32) Rule {
	return Rule{"-m", "mark", "--mark", "0x" + strconv.FormatUint(uint64(mark), 16), "-m", "comment", "--comment", ProbeComment, "-j", "NOTRACK"}
}

// AddProbeExemption puts ProbeExemption(mark) first in raw OUTPUT, where no earlier rule that ends the
// table's walk (an ACCEPT, say) can keep probes from reaching it; when our own jump (DefaultChain) holds
// position 1 it goes right after it, as our chain only exempts traffic and never ends the walk. It does
// nothing when the rule is there already.
func (m *Manager) AddProbeExemption(ctx context.Context, fam Family, mark uint32) error {
	v, err := m.view(ctx, fam)
	if err != nil {
		return err
	}
	rule := ProbeExemption(mark)
	all, _, err := v.chain(ctx, Raw, "OUTPUT")
	if err != nil {
		return err
	}
	pos := 1
	if len(all) > 0 && target(all[0]) == DefaultChain {
		pos = 2
	}
	if i := slices.IndexFunc(all, func(r Rule) bool { return slices.Equal(r, rule) }); i >= 0 && i < pos {
		return nil
	}
	var p payload
	// Copies further down (left by a process killed while probing, or pushed down by another's insert) go
	// first: a delete takes the first copy, and they all sit below pos.
	for _, r := range all {
		if slices.Equal(r, rule) {
			p.rule(Raw, append([]string{"-D", "OUTPUT"}, r...)...)
		}
	}
	p.rule(Raw, append([]string{"-I", "OUTPUT", strconv.Itoa(pos)}, rule...)...)
	return m.restore(ctx, fam, p.bytes())
}

// RemoveProbeExemption deletes every copy of ProbeExemption(mark) from raw OUTPUT; none is not an error.
func (m *Manager) RemoveProbeExemption(ctx context.Context, fam Family, mark uint32) error {
	v, err := m.view(ctx, fam)
	if err != nil {
		return err
	}
	rule := ProbeExemption(mark)
	all, _, err := v.chain(ctx, Raw, "OUTPUT")
	if err != nil {
		return err
	}
	var p payload
	for _, r := range all {
		if slices.Equal(r, rule) {
			p.rule(Raw, append([]string{"-D", "OUTPUT"}, r...)...)
		}
	}
	if p.empty() {
		return nil
	}
	return m.restore(ctx, fam, p.bytes())
}
