// Command node-cache is a CoreDNS build for a Kubernetes NodeLocal DNSCache.
//
// It compiles in only the plugins a node cache needs plus the nodelocaldns plugins, and executes them in
// the order of the repository's plugin.cfg. Without -localip it is plain CoreDNS (-conf, -dns.port,
// -pidfile, SIGUSR1 reload, SIGTERM shutdown). With -localip it is a drop-in for upstream's node-cache
// binary: its flags expand a base Corefile and the kube-dns ConfigMap into the Corefile it serves (see
// flags.go and dropin.go).
//
// It comes in two builds that ship side by side (see full.go): the lean one (-tags nodecache_lean, the
// image's /node-cache) leaves out trace, whose tracing libraries cost several MiB of memory per node
// (README, Memory), and runs the full one (/node-cache-full, the default build) in its place when the
// Corefile uses trace.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	// Every plugin upstream's k8s-dns-node-cache image compiles in (upstreamNodeCachePlugins in main_test.go),
	// so that its ConfigMaps work unchanged, plus file and ready; nodeCachePlugins in main_test.go lists them
	// again on purpose.
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/bufsize"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/debug"
	_ "github.com/coredns/coredns/plugin/dns64"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/file"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/hosts"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/pprof"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
	_ "github.com/coredns/coredns/plugin/rewrite"
	_ "github.com/coredns/coredns/plugin/template"
	_ "github.com/coredns/coredns/plugin/timeouts"
	// trace is imported by build_full.go only: the lean build leaves it out and execs the full one for it.
	_ "github.com/coredns/coredns/plugin/whoami"

	_ "github.com/nodelocaldns/nodelocaldns/plugin/clamp"
	_ "github.com/nodelocaldns/nodelocaldns/plugin/notrack"
	_ "github.com/nodelocaldns/nodelocaldns/plugin/upstreamsvc"
	_ "github.com/nodelocaldns/nodelocaldns/plugin/wirecache"
)

func main() {
	applyMemoryLimit() // GOMEMLIMIT from the container's cgroup limit (memlimit.go), for every mode
	applyGCPercent()   // GOGC=50 unless set (memlimit.go)
	runSideMode()      // -guard and -preflight (guard.go, preflight.go) run here and exit
	directives, err := compiledDirectives()
	if err != nil {
		log.Fatalf("node-cache: %v", err)
	}
	if err := dnsserver.SetDirectives(directives); err != nil {
		log.Fatalf("node-cache: setting the directive order: %v", err)
	}
	if err := startDropIn(directives); err != nil {
		log.Fatalf("node-cache: %v", err)
	}
	if err := watchForUninstall(); err != nil { // -daemonset (uninstall.go)
		log.Fatalf("node-cache: %v", err)
	}
	registerStartupTrim() // trim.go: the binary's pages touched only while starting leave RSS
	coremain.Run()
}
