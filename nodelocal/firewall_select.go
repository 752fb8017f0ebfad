//go:build linux

package nodelocal

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nodelocaldns/nodelocaldns/nodelocal/internal/rules"
)

// firewallChoice picks a node's rules backend the same way for every user on the node, so that the cache,
// its guard, its probe exemption and a successor all find one another's rules:
//
//   - a configured backend (legacy, nft, nftables) is that one;
//   - auto is where kube-proxy's rules are (rules.Select);
//   - on a node with no kube-proxy rules, it is where the cache's own rules are (an earlier cache fell
//     back to it);
//   - with neither, it waits up to wait from the first try (kube-proxy is likely starting beside us, and
//     its rules tell where ours belong; until then get fails with a *rules.NoKubeProxyRulesError) and
//     then falls back to what the node's other rules suggest, and says so.
//
// Once chosen, the backend stays for the chooser's life.
type firewallChoice struct {
	mode     rules.Mode
	wait     time.Duration
	lockWait time.Duration
	log      Logger
	// who starts each line logged ("nodelocal", "nodelocal guard").
	who string
	// since is when the first try found no kube-proxy rules on the node.
	since time.Time
	// chosen is the firewall once chosen; tests set it to a fake.
	chosen firewall
}

// newFirewallChoice returns a chooser for the backend named by backend ("auto" or empty, "legacy", "nft",
// "nftables").
func newFirewallChoice(backend string, wait, lockWait time.Duration, log Logger, who string) (*firewallChoice, error) {
	mode, err := rules.ParseMode(backend)
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = discard{}
	}
	return &firewallChoice{mode: mode, wait: wait, lockWait: lockWait, log: log, who: who}, nil
}

// openFirewall returns the real firewall of b.
func openFirewall(b *rules.Backend, lockWait time.Duration, log Logger) firewall {
	if b.Mode == rules.NFTables {
		return newNFTablesFirewall(b, log)
	}
	return newIPTablesFirewall(b, lockWait, log)
}

// get returns the chosen firewall, choosing it first if need be. While it waits for kube-proxy's rules
// the error holds a *rules.NoKubeProxyRulesError (see backendPending).
func (c *firewallChoice) get(ctx context.Context) (firewall, error) {
	if c.chosen != nil {
		return c.chosen, nil
	}
	b, err := c.choose(ctx)
	if err != nil {
		return nil, rulesError("select rules backend", err)
	}
	c.log.Infof("%s: using rules backend %s (%s)", c.who, b.Mode, b.Reason)
	c.chosen = openFirewall(b, c.lockWait, c.log)
	return c.chosen, nil
}

// current returns the chosen firewall, or nil before one was chosen.
func (c *firewallChoice) current() firewall { return c.chosen }

func (c *firewallChoice) choose(ctx context.Context) (*rules.Backend, error) {
	if c.mode != rules.Auto {
		return rules.NewBackend(c.mode, "configured")
	}
	b, err := rules.Select(ctx, rules.Auto)
	none, ok := errors.AsType[*rules.NoKubeProxyRulesError](err)
	if !ok {
		return b, err
	}
	if own, err := cacheRulesBackend(ctx, none, c.lockWait); err != nil || own != nil {
		return own, err
	}
	now := time.Now()
	if c.since.IsZero() {
		c.since = now
		c.log.Warningf("%s: %v; waiting up to %v for kube-proxy's rules before falling back", c.who, none, c.wait)
	}
	if waited := now.Sub(c.since); waited < c.wait {
		return nil, fmt.Errorf("%w; waited %v of %v", none, waited.Round(time.Second), c.wait)
	}
	c.log.Warningf("%s: still no kube-proxy rules after %v: falling back to %s (%s); set the backend explicitly if kube-proxy uses another",
		c.who, c.wait, none.Fallback, none.Reason)
	none.Backend.Reason = "no kube-proxy rules after " + c.wait.String() + ": fallback, " + none.Reason
	return none.Backend, nil
}

// cacheRulesBackend finds the backend that holds the cache's own rules on a node without kube-proxy
// rules: its nftables tables, or its chains in the iptables flavour the node suggests. It returns nil when
// there are none.
func cacheRulesBackend(ctx context.Context, none *rules.NoKubeProxyRulesError, lockWait time.Duration) (*rules.Backend, error) {
	nft := rules.NewNFTablesManager()
	for _, table := range []string{rules.NFTablesTable, rules.NFTablesGuardTable} {
		ok, err := nft.TableExists(ctx, table)
		if err != nil && !rules.NFTablesUnsupported(err) {
			return nil, err
		}
		if ok {
			return rules.NewBackend(rules.NFTables, "no kube-proxy rules; the cache's table inet "+table+" is there")
		}
	}
	if none.Fallback == rules.NFTables {
		return nil, nil
	}
	m := rules.NewManager(none.Backend, rules.ManagerOptions{LockWait: lockWait})
	for _, fam := range rules.Families {
		if _, err := none.Backend.Tools(fam); err != nil {
			continue // no tools for the family: no chain of ours in it
		}
		ok, err := m.ChainExists(ctx, fam, rules.Raw, rules.DefaultChain)
		if err != nil {
			return nil, err
		}
		if ok {
			none.Backend.Reason = "no kube-proxy rules; the cache's chains are there, " + none.Reason
			return none.Backend, nil
		}
	}
	return nil, nil
}

// backendPending reports whether err is a choice still waiting for kube-proxy's rules: nothing of the
// cache's can be on the node yet.
func backendPending(err error) bool {
	_, ok := errors.AsType[*rules.NoKubeProxyRulesError](err)
	return ok
}
