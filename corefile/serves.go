package corefile

import (
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// Serving returns the port of the server block that answers name on addr, as CoreDNS picks it: among the
// blocks of the dns transport whose bind holds addr (or that have no bind, and so listen on every address),
// the one whose zone is the longest match of name. A key without a port is on defaultPort (CoreDNS's
// -dns.port); of two blocks with the same zone, the one on defaultPort wins, then the lower port. ok is
// false when no block answers name on addr.
func (f *File) Serving(name string, addr netip.Addr, defaultPort uint16) (port uint16, ok bool) {
	name = strings.TrimSuffix(strings.ToLower(name), ".")
	best := -1
	for _, b := range f.Blocks {
		if !b.binds(addr) {
			continue
		}
		for _, k := range b.Keys {
			zone, p, isDNS := splitKey(k)
			if !isDNS {
				continue
			}
			kp := defaultPort
			if p != "" {
				n, err := strconv.ParseUint(p, 10, 16)
				if err != nil {
					continue
				}
				kp = uint16(n)
			}
			l, match := zoneMatch(zone, name)
			if !match {
				continue
			}
			better := l > best || (l == best && port != defaultPort && (kp == defaultPort || kp < port))
			if better {
				best, port = l, kp
			}
		}
	}
	return port, best >= 0
}

// zoneMatch reports whether name (lower case, no trailing dot) is in zone, and the zone's length as the
// measure of how close the match is.
func zoneMatch(zone, name string) (int, bool) {
	if zone == "." {
		return 0, true
	}
	if name == zone || strings.HasSuffix(name, "."+zone) {
		return len(zone), true
	}
	return 0, false
}

// binds reports whether the block listens on addr: it has no bind, or a bind that names addr. A bind that
// names an interface is taken to hold addr, since which addresses an interface has is the node's to say.
func (b *Block) binds(addr netip.Addr) bool {
	binds := b.Find("bind")
	if len(binds) == 0 {
		return true
	}
	for _, d := range binds {
		for _, a := range d.Args {
			if a == "except" {
				break
			}
			ip, err := netip.ParseAddr(a)
			if err != nil || ip.Unmap() == addr {
				return true
			}
		}
	}
	return false
}

// ListenAddress returns the HOST:PORT the first directive called name (health, ready, prometheus) listens
// on: its argument, or defaultAddr when it has none; a host left empty becomes first, the address a client
// on the node reaches the listener at. ok is false when no block has the directive.
func (f *File) ListenAddress(name, defaultAddr string, first netip.Addr) (addr string, ok bool) {
	for _, b := range f.Blocks {
		ds := b.Find(name)
		if len(ds) == 0 {
			continue
		}
		addr = defaultAddr
		if len(ds[0].Args) > 0 {
			addr = ds[0].Args[0]
		}
		if host, port, err := net.SplitHostPort(addr); err == nil && host == "" && first.IsValid() {
			addr = net.JoinHostPort(first.String(), port)
		}
		return addr, true
	}
	return "", false
}
