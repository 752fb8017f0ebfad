package upstreamsvc

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin/pkg/transport"
)

// ownListeners is where the server block holding this plugin listens for plain DNS. An upstream
// among these addresses sends every query straight back into the same block, and on to itself
// again until the client gives up or *loop* stops the process. That happens when the Service named
// is the one the cache takes over (kube-dns, whose ClusterIP the cache binds in iptables mode)
// instead of the one in front of the cluster DNS (kube-dns-upstream).
type ownListeners struct {
	port  uint16       // 0: unknown (a port chosen by the kernel), nothing is refused
	hosts []netip.Addr // the bound addresses
	// wildcard is set when the block listens on every address. Then the loopback addresses are
	// refused; other local addresses are not, since in IPVS mode every ClusterIP sits on a local
	// link (kube-ipvs0) and IPVS, not this server, receives what is sent there.
	wildcard bool
	listen   string // for messages: what the block binds
}

// listenersOf reads the block's listen addresses; bind, which sets them, is set up before this plugin.
func listenersOf(cfg *dnsserver.Config) ownListeners {
	if cfg.Transport != "" && cfg.Transport != transport.DNS {
		return ownListeners{} // TLS, gRPC, HTTPS: a plain-DNS upstream there is not this server
	}
	port, err := strconv.ParseUint(cfg.Port, 10, 16)
	if err != nil || port == 0 {
		return ownListeners{}
	}
	own := ownListeners{port: uint16(port)}
	var shown []string
	for _, h := range cfg.ListenHosts {
		if h == "" {
			own.wildcard = true
			shown = append(shown, "every address")
			continue
		}
		ip, err := netip.ParseAddr(h)
		if err != nil {
			continue // a zoned or otherwise odd host never equals an upstream address
		}
		if ip.IsUnspecified() {
			own.wildcard = true
		}
		own.hosts = append(own.hosts, ip.Unmap())
		shown = append(shown, ip.String())
	}
	own.listen = fmt.Sprintf("%s port %d", strings.Join(shown, " "), own.port)
	return own
}

// owns reports whether a query sent to ap reaches this server block.
func (o ownListeners) owns(ap netip.AddrPort) bool {
	if o.port == 0 || ap.Port() != o.port {
		return false
	}
	ip := ap.Addr().Unmap()
	if o.wildcard && ip.IsLoopback() {
		return true
	}
	return slices.Contains(o.hosts, ip)
}

// refuse returns an error when set has an address this server block listens on; what says where
// the set came from (the API, an environment variable, the fallback).
func (o ownListeners) refuse(set upstreamSet, what string) error {
	for _, a := range set.addrs {
		ap, err := netip.ParseAddrPort(a)
		if err != nil || !o.owns(ap) {
			continue
		}
		return fmt.Errorf("%s is %s, where this server listens (%s): forwarding there would loop back into this server; "+
			"name the Service in front of the cluster DNS (such as kube-dns-upstream), not the one this cache takes over",
			what, a, o.listen)
	}
	return nil
}

// origin names where set came from, for refuse's message.
func (cfg *Config) origin(set upstreamSet) string {
	switch set.source {
	case sourceAPI:
		return fmt.Sprintf("the ClusterIP of Service %s/%s", cfg.Namespace, cfg.Service)
	case sourceEnv:
		return "the address in environment variable " + HostEnvVar(cfg.Service)
	default:
		return "the fallback address"
	}
}
