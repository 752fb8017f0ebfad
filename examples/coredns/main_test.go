package main

import (
	"slices"
	"testing"

	"github.com/nodelocaldns/nodelocaldns"
)

// TestDirectives checks what main hands to dnsserver.SetDirectives: every plugin imported here is in
// plugin.cfg, and this repository's four are among them.
func TestDirectives(t *testing.T) {
	directives, err := nodelocaldns.CompiledDirectives()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"notrack", "wirecache", "clamp", "upstreamsvc"} {
		if !slices.Contains(directives, name) {
			t.Errorf("%s is not in the directive order %v", name, directives)
		}
	}
}
