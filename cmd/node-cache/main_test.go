//go:build linux

package main

import (
	"os/exec"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/nodelocaldns/nodelocaldns"
)

// upstreamNodeCachePlugins are the plugins upstream's k8s-dns-node-cache image compiles in (the blank
// imports of cmd/node-cache/main.go in kubernetes/dns), by directive name: metrics registers "prometheus". A
// node-local-dns ConfigMap may use any of them, so the drop-in must have them all.
var upstreamNodeCachePlugins = []string{
	"bind", "bufsize", "cache", "debug", "dns64", "errors", "forward", "health", "hosts", "loadbalance", "log",
	"loop", "prometheus", "pprof", "reload", "rewrite", "template", "timeouts", "trace", "whoami",
}

// nodeCachePlugins is what this node cache compiles in, listed apart from main.go's imports so that dropping
// or adding a plugin there is a decision this test makes visible.
var nodeCachePlugins = []string{
	"bind", "bufsize", "cache", "debug", "dns64", "errors", "file", "forward", "health", "hosts", "loadbalance",
	"log", "loop", "multisocket", "pprof", "prometheus", "ready", "reload", "rewrite", "template", "timeouts", "trace",
	"whoami", "clamp", "notrack", "upstreamsvc", "wirecache",
	// Registered because the plugins above import them: forward imports dnstap, file imports transfer,
	// and cache, forward, log, rewrite and template all import metadata.
	"dnstap", "metadata", "transfer",
}

// TestUpstreamImagePluginsCompiledIn is the drop-in promise for ConfigMaps: every directive upstream's image
// accepts is registered here, so a node-local-dns ConfigMap written for it does not stop node-cache with
// "directive ... is not compiled into this CoreDNS".
func TestUpstreamImagePluginsCompiledIn(t *testing.T) {
	registered := nodelocaldns.RegisteredPlugins()
	directives, err := nodelocaldns.CompiledDirectives()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range upstreamNodeCachePlugins {
		if !registered[name] || !slices.Contains(directives, name) {
			t.Errorf("%s, compiled into upstream's node-cache image, is not compiled in here (registered %v, ordered %v)",
				name, registered[name], slices.Contains(directives, name))
		}
	}
}

func TestCompiledDirectivesFollowPluginCfg(t *testing.T) {
	got, err := nodelocaldns.CompiledDirectives()
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
	for name := range nodelocaldns.RegisteredPlugins() {
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
