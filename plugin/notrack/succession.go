//go:build linux

package notrack

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"

	"github.com/nodelocaldns/nodelocaldns/nodelocal"
)

// The node changes hands through nodelocal's Succession (see nodelocal's documentation for its states):
//
//   - Started while another process owns the node, this process queues as its successor instead of
//     failing: it touches nothing on the node, serves beside the owner on the same addresses
//     (SO_REUSEPORT), and once it answers there it says so and waits for the owner to let go. Then it
//     owns the node, steers new UDP packets to its own sockets and lets closing TCP listeners hand their
//     accept queues over, so that the old process's sockets only empty.
//   - The owner watches for a ready successor and lets go at once, leaving link, addresses and rules in
//     place. It keeps answering what reaches it; told to stop, it waits until its sockets are idle and
//     tears nothing down.
//   - Told to stop with no successor, and with `handover`, the owner hands the node to the cluster DNS
//     instead of tearing it down, waits until its sockets are idle, and leaves the rest for the next start,
//     which takes the node back once it answers.
//
// This file is the plugin's side of it: the hooks through which the Succession makes the process's
// instances own the node (own) or drop it (release), and the probes and endpoints it works with.

// newNode returns the process's view of the node, with its Succession.
func newNode() *node {
	n := &node{probe: nodelocal.NewProbeExemption(0)}
	succ, err := nodelocal.NewSuccession(nodelocal.SuccessionHooks{
		Lock:     &n.mu,
		Own:      n.own,
		Release:  n.release,
		InFlight: n.inflight.Load,
		Failed:   countSetupError,
	}, log)
	if err != nil {
		panic(err) // every hook is set
	}
	n.succ = succ
	return n
}

// startAsSuccessor starts an instance while another process owns the node (New failed with lockErr):
// it queues to take the node over (nodelocal.Succession.Queue), serving beside the owner until it can.
// n.mu is held; it is the process's first start.
func (n *node) startAsSuccessor(life context.Context, in *instance, lockErr error) error {
	targets := in.probeTargets()
	if err := n.succ.Queue(life, in.settings.reconcilerConfig(), lockErr, targetEndpoints(targets), proberOf(targets)); err != nil {
		countSetupError(err)
		return err
	}
	n.live[in] = struct{}{}
	n.settings = in.settings
	return nil
}

// own makes rec the process's Reconciler, which the Succession made the node's owner: the leases of every
// live instance are acquired, with their rules at once when the server answers already, or each once it
// answers (probeAndEnable) when the owner let go first; and the repair loop starts, unless the process is
// stopping. n.mu is held.
func (n *node) own(ctx context.Context, rec *nodelocal.Reconciler, how nodelocal.Ownership) error {
	n.rec, n.leases = rec, map[claimKey]*sharedLease{}
	var err error
	if how == nodelocal.OwnerLeftFirst {
		errs := make([]error, 0, len(n.live))
		for in := range n.live {
			actx, cancel := context.WithTimeout(in.ctx, acquireTimeout)
			_, err := n.acquire(actx, in)
			cancel()
			errs = append(errs, err)
		}
		err = errors.Join(errs...)
	} else {
		err = n.acquireAnswering(ctx)
	}
	if how != nodelocal.AtExit {
		n.ensureRepairLoop(ctx)
	}
	n.updateGauges()
	if how == nodelocal.OwnerLeftFirst && !n.settings.NoRules {
		for in := range n.live {
			go n.probeAndEnable(in)
		}
	}
	return err
}

// release drops the Reconciler a successor took the node from, and stops the repair loop. n.mu is held.
func (n *node) release() {
	if n.stopRepair != nil {
		n.stopRepair()
		n.stopRepair = nil
	}
	n.rec, n.leases = nil, nil
	rulesInPlace.Set(0)
	addressesInPlace.Set(0)
}

// acquireAnswering acquires the leases of every live instance, with their rules, in one sync: this server
// answers on their addresses. n.mu is held.
func (n *node) acquireAnswering(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, acquireTimeout)
	defer cancel()
	var keys []claimKey
	for in := range n.live {
		keys = append(keys, in.keys()...)
	}
	claims := make([]nodelocal.Claim, 0, len(keys))
	var unique []claimKey
	for _, k := range keys {
		if sl, ok := n.leases[k]; ok {
			sl.refs++
			continue
		}
		if i := slices.Index(unique, k); i >= 0 {
			continue
		}
		unique = append(unique, k)
		claims = append(claims, k.claim(false))
	}
	leases, err := n.rec.AcquireAll(ctx, claims)
	for i, l := range leases {
		n.leases[unique[i]] = &sharedLease{lease: l, rules: true}
	}
	for _, k := range keys {
		if sl := n.leases[k]; sl != nil && slices.Contains(unique, k) {
			sl.refs++
		}
	}
	return err
}

// probeTargets returns every endpoint of the instance with its probe name, sorted.
func (in *instance) probeTargets() []probeTarget {
	names := in.probeNames()
	keys := in.keys()
	targets := make([]probeTarget, 0, len(keys))
	for _, k := range keys {
		targets = append(targets, probeTarget{k.endpoint, names[k.endpoint]})
	}
	slices.SortFunc(targets, func(a, b probeTarget) int { return strings.Compare(a.String(), b.String()) })
	return slices.CompactFunc(targets, func(a, b probeTarget) bool { return a.endpoint == b.endpoint })
}

// handoverConfig returns the settings' hand-over to the cluster DNS, and whether there is one.
func (s nodeSettings) handoverConfig() (nodelocal.Handover, bool) {
	if !s.Handover {
		return nodelocal.Handover{}, false
	}
	return nodelocal.Handover{ServiceAddresses: parseAddrList(s.ServiceAddresses), Upstream: parseAddrList(s.HandoverUpstream)}, true
}

func parseAddrList(s string) []netip.Addr {
	var out []netip.Addr
	for f := range strings.FieldsSeq(s) {
		if a, err := netip.ParseAddr(f); err == nil {
			out = append(out, a.Unmap())
		}
	}
	return out
}

// liveEndpoints returns the DNS endpoints of every live instance. n.mu is held.
func (n *node) liveEndpoints() []netip.AddrPort {
	var eps []netip.AddrPort
	for in := range n.live {
		for _, k := range in.keys() {
			eps = append(eps, netip.AddrPortFrom(k.addr, k.port))
		}
	}
	slices.SortFunc(eps, netip.AddrPort.Compare)
	return slices.Compact(eps)
}
