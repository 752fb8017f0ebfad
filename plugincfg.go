// Package nodelocaldns turns a CoreDNS build into a Kubernetes NodeLocal DNSCache.
//
// The work is split by what each part knows: package nodelocal binds the node-local addresses and keeps the
// NOTRACK rules (Linux only, no CoreDNS), the plugins under plugin/ adapt it to CoreDNS Corefile directives,
// package corefile renders and checks node-cache Corefiles, and cmd/node-cache wires everything into a
// CoreDNS binary.
//
// This root package carries plugin.cfg, the plugin order every build of ours uses, so that a CoreDNS
// checkout (through `go generate`) and a custom main (through [CompiledDirectives], as cmd/node-cache and
// examples/coredns do) cannot drift apart.
package nodelocaldns

import (
	"bufio"
	_ "embed"
	"fmt"
	"strings"
)

//go:embed plugin.cfg
var pluginCfg string

// Plugin is one line of plugin.cfg: a Corefile directive and the Go package that implements it.
type Plugin struct {
	// Name is the Corefile directive, e.g. "cache".
	Name string
	// Package is the import path, fully qualified even for CoreDNS's in-tree plugins.
	Package string
}

// corednsPluginPath is where CoreDNS's generator looks up a plugin.cfg entry that is not fully qualified.
const corednsPluginPath = "github.com/coredns/coredns/plugin/"

// Plugins returns plugin.cfg's entries in execution order.
func Plugins() ([]Plugin, error) { return parsePluginCfg(pluginCfg) }

// Directives returns plugin.cfg's directive names in execution order, the form dnsserver.SetDirectives takes.
func Directives() ([]string, error) {
	plugins, err := Plugins()
	if err != nil {
		return nil, err
	}
	names := make([]string, len(plugins))
	for i, p := range plugins {
		names[i] = p.Name
	}
	return names, nil
}

// parsePluginCfg reads plugin.cfg the way CoreDNS's directives generator does, but strictly: a line that the
// generator would silently drop is an error here, so a typo cannot remove a plugin from the build unnoticed.
func parsePluginCfg(text string) ([]Plugin, error) {
	var plugins []Plugin
	seen := map[string]int{}
	scanner := bufio.NewScanner(strings.NewReader(text))
	for lineno := 1; scanner.Scan(); lineno++ {
		raw := scanner.Text()
		line := strings.TrimSpace(raw)
		if line == "" || strings.HasPrefix(raw, "#") {
			continue
		}
		if strings.HasPrefix(line, "#") {
			return nil, fmt.Errorf("plugin.cfg line %d: a comment must start in the first column", lineno)
		}
		name, pkg, ok := strings.Cut(line, ":")
		if !ok || name == "" || pkg == "" || strings.Contains(pkg, ":") {
			return nil, fmt.Errorf("plugin.cfg line %d: %q is not <name>:<package>", lineno, line)
		}
		if first, dup := seen[name]; dup {
			return nil, fmt.Errorf("plugin.cfg line %d: directive %q already listed on line %d", lineno, name, first)
		}
		seen[name] = lineno
		if !strings.Contains(pkg, "/") {
			pkg = corednsPluginPath + pkg
		}
		plugins = append(plugins, Plugin{Name: name, Package: pkg})
	}
	if err := scanner.Err(); err != nil {
		return nil, fmt.Errorf("reading plugin.cfg: %w", err)
	}
	return plugins, nil
}
