package main

import (
	"fmt"
	"sort"
	"strings"

	"github.com/coredns/caddy"

	"github.com/nodelocaldns/nodelocaldns"
)

// compiledDirectives returns plugin.cfg's order restricted to the plugins this binary registered.
//
// A plugin that is compiled in but missing from plugin.cfg is an error rather than a warning: CoreDNS would
// reject its directive as unknown at the first Corefile that uses it, long after the build looked fine.
func compiledDirectives() ([]string, error) {
	order, err := nodelocaldns.Directives()
	if err != nil {
		return nil, err
	}
	registered := registeredDNSPlugins()
	var directives []string
	for _, name := range order {
		if registered[name] {
			directives = append(directives, name)
			delete(registered, name)
		}
	}
	if len(registered) > 0 {
		missing := make([]string, 0, len(registered))
		for name := range registered {
			missing = append(missing, name)
		}
		sort.Strings(missing)
		return nil, fmt.Errorf("plugins compiled in but absent from plugin.cfg: %s", strings.Join(missing, ", "))
	}
	return directives, nil
}

// registeredDNSPlugins returns the names of the plugins registered with caddy for the "dns" server type.
func registeredDNSPlugins() map[string]bool {
	registered := map[string]bool{}
	for _, name := range caddy.ListPlugins()["others"] {
		if plugin, ok := strings.CutPrefix(name, "dns."); ok {
			registered[plugin] = true
		}
	}
	return registered
}
