// Command coredns is your own CoreDNS with this repository's plugins: a main that compiles in the plugins it
// wants, CoreDNS's and ours, and runs them in the order of the repository's plugin.cfg, as a CoreDNS checkout
// built with `go generate` from that plugin.cfg would.
//
// CoreDNS's own main is coremain.Run with the directive order generated into dnsserver.Directives; here
// nodelocaldns.CompiledDirectives gives the same order from the embedded plugin.cfg, restricted to the
// plugins imported below, and refuses a compiled-in plugin that plugin.cfg does not list. Add or drop blank
// imports to change the build; the order stays plugin.cfg's. From the repository root it serves the demo:
//
//	go run ./examples/coredns -conf examples/demo/Corefile
//
// cmd/node-cache is the same idea with every plugin upstream's node-cache image has, plus its flags and modes.
package main

import (
	"log"

	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	// The CoreDNS plugins examples/demo/Corefile uses, and forward and log.
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/file"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"

	// And those of kubeadm's CoreDNS Corefile, so that this build can be a cluster's DNS too: the
	// conformance tier (test/conformance) runs it as the cluster DNS against a real kube-apiserver.
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/reload"

	_ "github.com/nodelocaldns/nodelocaldns/plugin/clamp"
	_ "github.com/nodelocaldns/nodelocaldns/plugin/health"
	_ "github.com/nodelocaldns/nodelocaldns/plugin/notrack"
	_ "github.com/nodelocaldns/nodelocaldns/plugin/upstreamsvc"
	_ "github.com/nodelocaldns/nodelocaldns/plugin/wirecache"

	"github.com/nodelocaldns/nodelocaldns"
)

func main() {
	directives, err := nodelocaldns.CompiledDirectives()
	if err != nil {
		log.Fatalf("coredns: %v", err)
	}
	if err := dnsserver.SetDirectives(directives); err != nil {
		log.Fatalf("coredns: setting the directive order: %v", err)
	}
	coremain.Run()
}
