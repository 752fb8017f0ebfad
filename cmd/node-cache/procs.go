//go:build linux

package main

import (
	"os"
	"runtime"
)

// defaultProcs is the cache's GOMAXPROCS unless the environment sets one. With more than one P, Go wakes a
// second thread to look for work each time a goroutine is made ready while a P is idle, which at the rates a
// node's Pods ask (a few thousand queries a second, each finding the cache asleep) costs more than the
// answer. On a simulated 2-CPU node, not pinned to a core (SERVER_CPU=0,1 bench/cpu.sh; README,
// Performance), one P took the mix at 2,000 q/s from 34.0 to 18.6 µs of CPU per query (unbound 16.6), a miss
// at 2,000/s from 117 to 51 µs (unbound 45), and full-speed hits from 199,865 to 238,246 q/s (unbound
// 239,300). unbound runs one thread by default too. A node that needs more sets GOMAXPROCS in the cache's
// container.
const defaultProcs = 1

// applyProcs sets GOMAXPROCS to defaultProcs unless the environment sets it, which the runtime has already
// applied.
func applyProcs() {
	if procs, set := maxProcs(os.LookupEnv); set {
		runtime.GOMAXPROCS(procs)
	}
}

// maxProcs returns the GOMAXPROCS node-cache sets, and false when the environment (read through lookup) has
// one.
func maxProcs(lookup func(string) (string, bool)) (int, bool) {
	return unlessSet(lookup, "GOMAXPROCS", defaultProcs)
}
