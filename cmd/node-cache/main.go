//go:build linux

// Command node-cache is a CoreDNS build for a Kubernetes NodeLocal DNSCache.
//
// It compiles in only the plugins a node cache needs plus the nodelocaldns plugins, and executes them in
// the order of the repository's plugin.cfg. Without -localip it is plain CoreDNS (-conf, -dns.port,
// -pidfile, SIGUSR1 reload, SIGTERM shutdown). With -localip it is a drop-in for upstream's node-cache
// binary: its flags expand a base Corefile and the kube-dns ConfigMap into the Corefile it serves (see
// flags.go and dropin.go). That is the cache (cache.go); -guard, -preflight, -verify and -cleanup select the
// other modes (guard.go, preflight.go, verify.go, cleanup.go), each with a flag set of its own that takes the
// cache's flags too (modes.go). main only selects the mode and runs it.
//
// It comes in two builds that ship side by side (see full.go): the lean one (-tags nodecache_lean, the
// image's /node-cache) leaves out trace, whose tracing libraries cost several MiB of memory per node
// (README, Memory), and runs the full one (/node-cache-full, the default build) in its place when the
// Corefile uses trace.
package main

import (
	"flag"
	"os"

	// Every plugin upstream's k8s-dns-node-cache image compiles in (upstreamNodeCachePlugins in main_test.go),
	// so that its ConfigMaps work unchanged, plus file and ready; nodeCachePlugins in main_test.go lists them
	// again on purpose. health is ours (plugin/health): CoreDNS's, with a self-check that lets an idle node
	// sleep.
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/bufsize"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/debug"
	_ "github.com/coredns/coredns/plugin/dns64"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/file"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/hosts"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/multisocket"
	_ "github.com/coredns/coredns/plugin/pprof"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
	_ "github.com/coredns/coredns/plugin/rewrite"
	_ "github.com/coredns/coredns/plugin/template"
	_ "github.com/coredns/coredns/plugin/timeouts"
	// trace is imported by build_full.go only: the lean build leaves it out and execs the full one for it.
	_ "github.com/coredns/coredns/plugin/whoami"

	_ "github.com/nodelocaldns/nodelocaldns/plugin/clamp"
	_ "github.com/nodelocaldns/nodelocaldns/plugin/health"
	_ "github.com/nodelocaldns/nodelocaldns/plugin/notrack"
	_ "github.com/nodelocaldns/nodelocaldns/plugin/upstreamsvc"
	_ "github.com/nodelocaldns/nodelocaldns/plugin/wirecache"
)

func main() {
	applyMemoryLimit() // GOMEMLIMIT from the container's cgroup limit (memlimit.go), for every mode
	applyGCPercent()   // GOGC=50 unless set (memlimit.go)
	applyProcs()       // GOMAXPROCS=1 unless set (procs.go)
	args := os.Args[1:]
	mode, err := selectMode(args, flag.CommandLine) // modes.go
	if err != nil {
		log.Errorf("%v", err)
		os.Exit(2)
	}
	if mode == nil {
		runCache(args) // cache.go
		return
	}
	os.Exit(mode.main(args, flag.CommandLine)) // -guard, -preflight, -verify, -cleanup
}
