//go:build linux

package main

import (
	"fmt"
	"net/netip"
	"os"

	"github.com/nodelocaldns/nodelocaldns/corefile"
)

// readCorefile reads the Corefile the cache serves into v.served, with a corefile row: a cache whose
// Corefile cannot be read is not healthy, and the other checks then follow the flags alone.
func (v *verifier) readCorefile() {
	data, err := os.ReadFile(v.confPath)
	if err == nil {
		v.served, err = corefile.Parse(data)
	}
	if err != nil {
		v.served = nil
		v.add("corefile", v.confPath, false, "reading the Corefile the cache serves: %v; the checks follow the flags", err)
		return
	}
	v.add("corefile", v.confPath, true, "%d server blocks", len(v.served.Blocks))
}

// serverFor is where the cache answers name on ip: ip and the port of the Corefile's block for name, or
// -dns.port when the Corefile could not be read. ok is false when no block answers name on ip.
func (v *verifier) serverFor(ip netip.Addr, name string) (netip.AddrPort, bool) {
	if v.served == nil {
		return netip.AddrPortFrom(ip, v.dnsPort), true
	}
	port, ok := v.served.Serving(name, ip, v.dnsPort)
	return netip.AddrPortFrom(ip, port), ok
}

// notrackSkip says why the checks of what notrack keeps do not apply, "" when they do: the Corefile has
// no notrack (something else holds the addresses and rules), or every notrack has option (no_interface,
// no_rules).
func (v *verifier) notrackSkip(option string) string {
	if v.served == nil {
		return ""
	}
	var with, without int
	for _, b := range v.served.Blocks {
		for _, d := range b.Find("notrack") {
			if d.Option(option) != nil {
				with++
			} else {
				without++
			}
		}
	}
	switch {
	case with+without == 0:
		return fmt.Sprintf("the Corefile (%s) has no notrack: the cache keeps no link or rules of its own", v.confPath)
	case without == 0:
		return fmt.Sprintf("every notrack of the Corefile (%s) has %s", v.confPath, option)
	}
	return ""
}
