//go:build linux && nodecache_lean

package main

// fullOnlyDirectives are the directives the full build has and this lean build lacks.
var fullOnlyDirectives = leanLeavesOut
