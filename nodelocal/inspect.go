//go:build linux

package nodelocal

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/nodelocaldns/nodelocaldns/nodelocal/internal/rules"
)

// RuleCheck is one finding of InspectRules: what was checked ("rules", "fail-open"), where (a backend,
// family, table and chain), whether it is as a cache that serves the node leaves it, and the detail.
type RuleCheck struct {
	Check, Target string
	OK            bool
	Detail        string
}

// InspectRules reads the node's rules as a serving cache leaves them, and changes nothing: in the backend
// the cache uses (chosen as the cache chooses it from backend, see Config.Backend; the fallback at once on
// a node without kube-proxy rules, which is itself a finding), whether the cache's rules cover every
// address of addrs on dnsPort and see traffic first; whether the node has failed open; and whether a
// backend the cache does not use holds rules of the cache's. It is for checks after a rollout (-verify).
func InspectRules(ctx context.Context, backend string, addrs []netip.Addr, dnsPort uint16) []RuleCheck {
	choice, err := newFirewallChoice(backend, 0, 0, nil, "nodelocal inspect")
	if err != nil {
		return []RuleCheck{{Check: "rules", Target: "backend", Detail: err.Error()}}
	}
	fw, err := choice.get(ctx)
	if err != nil {
		return []RuleCheck{{Check: "rules", Target: "backend", Detail: fmt.Sprintf("choosing the backend: %v", err)}}
	}
	var out []RuleCheck
	if !choice.since.IsZero() {
		out = append(out, RuleCheck{Check: "rules", Target: "backend", Detail: fw.Reason()})
	}
	out = append(out, fw.Inspect(ctx, rules.Endpoints(addrs, dnsPort, nil))...)
	return append(out, cacheRulesElsewhere(ctx, fw.Mode())...)
}

// cacheRulesElsewhere finds rules of the cache's in the backends other than used: an earlier cache chose
// another backend, and its rules order with nothing of kube-proxy's.
func cacheRulesElsewhere(ctx context.Context, used rules.Mode) []RuleCheck {
	var out []RuleCheck
	for _, other := range []rules.Mode{rules.Legacy, rules.NFT} {
		if other == used {
			continue
		}
		ob, err := rules.NewBackend(other, "another backend")
		if err != nil {
			continue
		}
		om := rules.NewManager(ob, rules.ManagerOptions{})
		for _, fam := range rules.Families {
			st, err := om.Inspect(ctx, fam, rules.Raw)
			if err != nil {
				continue // that backend's tools or tables are absent: nothing of ours can be there
			}
			if st.ChainExists(rules.DefaultChain) {
				out = append(out, RuleCheck{Check: "rules", Target: fmt.Sprintf("iptables-%s %s raw", other, fam),
					Detail: fmt.Sprintf("chain %s is in a backend the cache does not use (it uses %s): delete it there", rules.DefaultChain, used)})
			}
		}
	}
	if used != rules.NFTables {
		if ok, err := rules.NewNFTablesManager().TableExists(ctx, rules.NFTablesTable); err == nil && ok {
			out = append(out, RuleCheck{Check: "rules", Target: "nftables inet " + rules.NFTablesTable,
				Detail: fmt.Sprintf("the table is there, but the cache uses iptables-%s: delete it (nft delete table inet %s)", used, rules.NFTablesTable)})
		}
	}
	return out
}
