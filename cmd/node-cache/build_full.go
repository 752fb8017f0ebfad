//go:build linux && !nodecache_lean

package main

// The full build: everything upstream's node-cache image compiles in. It never execs another binary.

import (
	_ "github.com/coredns/coredns/plugin/trace"
)

// fullOnlyDirectives are the directives the full build has and this build lacks: none, this is the full build.
var fullOnlyDirectives []string
