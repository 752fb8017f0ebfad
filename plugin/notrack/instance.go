//go:build linux

package notrack

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/coredns/caddy"

	"github.com/nodelocaldns/nodelocaldns/nodelocal"
)

// block is what one server block's notrack claims.
type block struct {
	// zone is the block's first zone; probes ask for a name in it, so that this block's handler answers.
	zone string
	// port is the DNS port; extra the extra TCP ports.
	port  uint16
	extra []uint16
	addrs []netip.Addr
	// listen are the host:port pairs CoreDNS listens on for this block.
	listen  []string
	handler *Notrack
}

// endpoint is an address and DNS port.
type endpoint struct {
	addr netip.Addr
	port uint16
}

func (e endpoint) String() string { return netip.AddrPortFrom(e.addr, e.port).String() }

// claimKey identifies a lease: an address, its DNS port and the extra TCP ports (sorted, comma separated).
// Leases are shared by key between server blocks and between the Corefiles before and after a reload, so
// that a reload that changes nothing changes nothing on the node.
type claimKey struct {
	endpoint
	extra string
}

func (k claimKey) String() string {
	if k.extra == "" {
		return k.endpoint.String()
	}
	return k.endpoint.String() + " (and TCP " + k.extra + ")"
}

func (k claimKey) claim(deferRules bool) nodelocal.Claim {
	c := nodelocal.Claim{Addresses: []netip.Addr{k.addr}, DNSPort: k.port, DeferRules: deferRules}
	for p := range strings.SplitSeq(k.extra, ",") {
		if n, err := strconv.ParseUint(p, 10, 16); err == nil {
			c.ExtraTCPPorts = append(c.ExtraTCPPorts, uint16(n))
		}
	}
	return c
}

// instance is the notrack side of one caddy instance: one load of the Corefile.
type instance struct {
	blocks []*block
	opts   nodeOptions
	// settings are opts resolved, once every block is set up.
	settings   nodeSettings
	controller *caddy.Controller

	// The fields below are set by node.start.
	seq    uint64
	ctx    context.Context
	cancel context.CancelFunc
}

type instanceKey struct{}

// instanceOf returns the notrack state of c's caddy instance, creating it (and registering the instance's
// callbacks) in the first notrack block.
func instanceOf(c *caddy.Controller) *instance {
	if in, ok := c.Get(instanceKey{}).(*instance); ok {
		return in
	}
	in := &instance{controller: c}
	c.Set(instanceKey{}, in)
	// notrack comes right after bind, so these run ahead of the callbacks of most plugins: the addresses are
	// in place before health, ready or prometheus listen on them, and a shutdown reaches the node early.
	c.OnStartup(in.start)
	c.OnShutdown(in.shutdown)
	c.OnRestartFailed(in.restartFailed)
	c.OnFinalShutdown(func() error { return theNode.finalShutdown("final shutdown") })
	return in
}

func (in *instance) add(b *block, o nodeOptions) error {
	if err := in.opts.merge(o); err != nil {
		return err
	}
	in.blocks = append(in.blocks, b)
	return nil
}

// keys returns the instance's claims: one per address and DNS port, with the union of the extra TCP ports
// of the blocks that serve it.
func (in *instance) keys() []claimKey {
	extra := map[endpoint][]uint16{}
	for _, b := range in.blocks {
		for _, a := range b.addrs {
			e := endpoint{a, b.port}
			extra[e] = append(extra[e], b.extra...)
		}
	}
	keys := make([]claimKey, 0, len(extra))
	for e, ports := range extra {
		slices.Sort(ports)
		ports = slices.Compact(ports)
		s := make([]string, len(ports))
		for i, p := range ports {
			s[i] = strconv.Itoa(int(p))
		}
		keys = append(keys, claimKey{e, strings.Join(s, ",")})
	}
	slices.SortFunc(keys, func(a, b claimKey) int {
		if c := a.addr.Compare(b.addr); c != 0 {
			return c
		}
		return int(a.port) - int(b.port)
	})
	return keys
}

// probeNames returns, for every endpoint, the probe name that reaches a notrack handler behind it.
func (in *instance) probeNames() map[endpoint]string {
	names := map[endpoint]string{}
	for _, b := range in.blocks {
		for _, a := range b.addrs {
			e := endpoint{a, b.port}
			if _, ok := names[e]; !ok {
				names[e] = probeName(b.zone)
			}
		}
	}
	return names
}

// listenAddrs returns the host:port pairs the instance's notrack blocks listen on for DNS, over UDP and
// TCP, and the addresses and extra ports that other plugins (health, ready) listen on over TCP.
func (in *instance) listenAddrs() (dns, tcp []string) {
	for _, b := range in.blocks {
		dns = append(dns, b.listen...)
		for _, a := range b.addrs {
			for _, p := range b.extra {
				tcp = append(tcp, netip.AddrPortFrom(a, p).String())
			}
		}
	}
	slices.Sort(dns)
	slices.Sort(tcp)
	return slices.Compact(dns), slices.Compact(tcp)
}

// shutdown runs at every stop of the instance, a reload's included. It never fails: caddy takes an error
// from a shutdown callback for a failed reload, after the new instance already serves. What went wrong is
// logged (and counted) where it happened.
func (in *instance) shutdown() error {
	if in.cancel != nil {
		in.cancel()
	}
	theNode.stop(in)
	return nil
}

func (in *instance) restartFailed() error { return theNode.restartFailed(in) }

func (in *instance) start() error {
	in.settings = in.opts.settings()
	registerShutdownHook()
	if err := theNode.start(in); err != nil {
		return fmt.Errorf("plugin/%s: %w", pluginName, err)
	}
	return nil
}
