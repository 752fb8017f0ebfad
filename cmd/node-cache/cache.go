//go:build linux

package main

import (
	"flag"

	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	"github.com/nodelocaldns/nodelocaldns"
)

// registerCacheFlags defines the cache's flags on fs, next to CoreDNS's: the mode flags, so that
// "-guard=false" is accepted as it always was, and upstream node-cache's (flags.go).
func registerCacheFlags(fs *flag.FlagSet) *nodeCacheFlags {
	registerModeFlags(fs)
	return registerNodeCacheFlags(fs)
}

// runCache is the cache, the mode without a mode flag: a plain CoreDNS, or with -localip a drop-in for
// upstream's node-cache binary (flags.go, dropin.go). Its flag set is the command line, where coremain defines
// CoreDNS's flags. It returns when CoreDNS stops.
func runCache(args []string) {
	nc := registerCacheFlags(flag.CommandLine)
	_ = flag.CommandLine.Parse(args) // flag.ExitOnError: it returns no error
	directives, err := nodelocaldns.CompiledDirectives()
	if err != nil {
		log.Fatalf("node-cache: %v", err)
	}
	if err := dnsserver.SetDirectives(directives); err != nil {
		log.Fatalf("node-cache: setting the directive order: %v", err)
	}
	if err := startDropIn(flag.CommandLine, nc, directives); err != nil {
		log.Fatalf("node-cache: %v", err)
	}
	if err := watchForUninstall(nc.uninstall); err != nil { // -daemonset (uninstall.go)
		log.Fatalf("node-cache: %v", err)
	}
	registerStartupTrim() // trim.go: the binary's pages touched only while starting leave RSS
	// tcpwrite.go: a TCP client that stops reading its answers is dropped, as CoreDNS's write timeout means,
	// and one that sends nothing is not accepted until the deferral ends.
	if err := registerListenerOptions(); err != nil {
		log.Fatalf("node-cache: %v", err)
	}
	// coremain.Run parses the command line again, as CoreDNS's own main does: the values above, and -conf as
	// the drop-in set it when -conf was not given.
	coremain.Run()
}
