package main

import (
	"os/exec"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/nodelocaldns/nodelocaldns"
)

// nodeCachePlugins is what a node cache needs, listed apart from main.go's imports so that dropping or
// adding a plugin there is a decision this test makes visible.
var nodeCachePlugins = []string{
	"bind", "bufsize", "cache", "debug", "errors", "file", "forward", "health", "hosts", "loadbalance", "log",
	"loop", "prometheus", "ready", "reload", "rewrite", "template", "timeouts", "whoami",
	"clamp", "notrack", "upstreamsvc", "wirecache",
	// Registered because the plugins above import them: forward imports dnstap, file imports transfer,
	// and cache, forward, log, rewrite and template all import metadata.
	"dnstap", "metadata", "transfer",
}

func TestCompiledDirectivesFollowPluginCfg(t *testing.T) {
	got, err := compiledDirectives()
	if err != nil {
		t.Fatal(err)
	}
	order, err := nodelocaldns.Directives()
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, name := range order {
		if slices.Contains(nodeCachePlugins, name) {
			want = append(want, name)
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("directive order:\n got %s\nwant %s", strings.Join(got, " "), strings.Join(want, " "))
	}
	var registered []string
	for name := range registeredDNSPlugins() {
		registered = append(registered, name)
	}
	sort.Strings(registered)
	wantRegistered := slices.Sorted(slices.Values(nodeCachePlugins))
	if !slices.Equal(registered, wantRegistered) {
		t.Errorf("plugins compiled in:\n got %s\nwant %s", strings.Join(registered, " "), strings.Join(wantRegistered, " "))
	}
}

// TestImportsAreThePluginCfgPackages checks that each directive comes from the package plugin.cfg names for
// it, so that a CoreDNS built with `go generate` from plugin.cfg and this binary run the same code.
func TestImportsAreThePluginCfgPackages(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := map[string]bool{}
	for pkg := range strings.FieldsSeq(string(out)) {
		deps[pkg] = true
	}
	plugins, err := nodelocaldns.Plugins()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range plugins {
		if slices.Contains(nodeCachePlugins, p.Name) && !deps[p.Package] {
			t.Errorf("%s is compiled in, but not from plugin.cfg's package %s", p.Name, p.Package)
		}
	}
}
