package nodelocaldns

import (
	"fmt"
	"maps"
	"sort"
	"strings"

	"github.com/coredns/caddy"
)

// CompiledDirectives returns plugin.cfg's order restricted to the plugins this binary registered: what a main
// of its own hands to dnsserver.SetDirectives before coremain.Run.
//
// A plugin that is compiled in but missing from plugin.cfg is an error rather than a warning: CoreDNS would
// reject its directive as unknown at the first Corefile that uses it, long after the build looked fine.
func CompiledDirectives() ([]string, error) {
	order, err := Directives()
	if err != nil {
		return nil, err
	}
	return compiledDirectives(order, RegisteredPlugins())
}

// compiledDirectives returns the names of order that are in registered, in order, and fails on a registered
// name order lacks.
func compiledDirectives(order []string, registered map[string]bool) ([]string, error) {
	left := maps.Clone(registered)
	var directives []string
	for _, name := range order {
		if left[name] {
			directives = append(directives, name)
			delete(left, name)
		}
	}
	if len(left) > 0 {
		missing := make([]string, 0, len(left))
		for name := range left {
			missing = append(missing, name)
		}
		sort.Strings(missing)
		return nil, fmt.Errorf("plugins compiled in but absent from plugin.cfg: %s", strings.Join(missing, ", "))
	}
	return directives, nil
}

// RegisteredPlugins returns the names of the plugins registered with caddy for the "dns" server type: the
// plugins compiled into this binary, by directive name.
func RegisteredPlugins() map[string]bool {
	registered := map[string]bool{}
	for _, name := range caddy.ListPlugins()["others"] {
		if plugin, ok := strings.CutPrefix(name, "dns."); ok {
			registered[plugin] = true
		}
	}
	return registered
}
