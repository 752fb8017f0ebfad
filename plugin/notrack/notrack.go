//go:build linux

// Package notrack is a CoreDNS plugin that makes a server block a Kubernetes node-local DNS cache: it puts
// the block's addresses on a node-local link before CoreDNS listens on them, and, once the server answers
// there, installs iptables rules that exempt its traffic from connection tracking and kube-proxy's DNAT.
// See README.md.
package notrack

import (
	"context"

	"github.com/coredns/coredns/plugin"
	"github.com/miekg/dns"
	ot "github.com/opentracing/opentracing-go"
)

// Notrack is the handler of one server block. It answers the probes this process sends to its own
// addresses before it installs the rules, passes every other query on, and tells the ready plugin
// whether the block's rules are in place.
type Notrack struct {
	Next  plugin.Handler
	block *block
}

// Name implements plugin.Handler.
func (n *Notrack) Name() string { return pluginName }

// ServeDNS implements plugin.Handler.
func (n *Notrack) ServeDNS(ctx context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
	// Counted so that a process that stops waits for the answers in progress (see nodelocal.Succession.Drain).
	theNode.inflight.Add(1)
	defer theNode.inflight.Add(-1)
	if len(r.Question) == 1 && isProbe(r.Question[0]) {
		if err := w.WriteMsg(probeAnswer(r)); err != nil {
			return dns.RcodeServerFailure, plugin.Error(pluginName, err)
		}
		return dns.RcodeSuccess, nil
	}
	// plugin.cfg runs notrack ahead of trace and prometheus: no span to continue, no recorder to tell which
	// plugin answered. Without them, wrapping the writer as NextOrFailure does would cost every query an
	// allocation for nothing.
	if _, tracked := w.(plugin.PluginTracker); n.Next == nil || tracked || ot.SpanFromContext(ctx) != nil {
		return plugin.NextOrFailure(pluginName, n.Next, ctx, w, r)
	}
	return n.Next.ServeDNS(ctx, w, r)
}

// BypassedByCacheHits tells wirecache's fast path that it may answer a hit without running notrack: notrack
// answers only its own probes, which are never stored, and a stopping process waits for the fast path's
// socket to empty as it waits for the queries counted here.
func (n *Notrack) BypassedByCacheHits() bool { return true }

// Ready implements the ready plugin's Readiness: true once the block's rules are in place (or left to
// others with no_rules) and the last sync of the node succeeded.
func (n *Notrack) Ready() bool { return theNode.ready(n.block) }
