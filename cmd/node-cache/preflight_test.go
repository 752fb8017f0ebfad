//go:build linux

package main

import (
	"io"
	"strings"
	"testing"
)

func TestPreflightNeedsLocalIP(t *testing.T) {
	fs := newSideModeFlagSet("preflight")
	m := newPreflightMode(fs)
	if err := fs.Parse([]string{"-preflight"}); err != nil {
		t.Fatal(err)
	}
	if err := runPreflight(io.Discard, m.cache, m.preflight); err == nil || !strings.Contains(err.Error(), "-localip") {
		t.Errorf("got %v, want an error naming -localip", err)
	}
	if err := fs.Parse([]string{"-preflight", "-localip", "169.254.20.10,nope"}); err != nil {
		t.Fatal(err)
	}
	if err := runPreflight(io.Discard, m.cache, m.preflight); err == nil || !strings.Contains(err.Error(), `"nope"`) {
		t.Errorf("got %v, want an error naming the bad address", err)
	}
}
