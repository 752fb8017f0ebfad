//go:build linux

package main

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// maxTrackedPortDials bounds how many source ports dialUDP tries for one lookup before it sends the lookup
// from one conntrack already has an entry for.
const maxTrackedPortDials = 32

// udpFlow is the forward direction of a UDP conntrack entry, or a UDP lookup -verify sent: client to server.
type udpFlow struct {
	client netip.AddrPort
	server netip.AddrPort
}

// conntrackFamily is the family of the conntrack table that holds entries for addr.
func conntrackFamily(addr netip.Addr) netlink.InetFamily {
	if addr.Is4() || addr.Is4In6() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

// trackedUDP lists the forward direction of every UDP entry in fam's conntrack table whose destination is
// one of servers.
func trackedUDP(fam netlink.InetFamily, servers []netip.Addr) (map[udpFlow]bool, error) {
	flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, fam)
	if err != nil {
		return nil, fmt.Errorf("listing the conntrack table: %w", err)
	}
	out := map[udpFlow]bool{}
	for _, f := range flows {
		if f.Forward.Protocol != unix.IPPROTO_UDP {
			continue
		}
		src, _ := netip.AddrFromSlice(f.Forward.SrcIP)
		dst, _ := netip.AddrFromSlice(f.Forward.DstIP)
		if slices.Contains(servers, dst.Unmap()) {
			out[udpFlow{client: netip.AddrPortFrom(src.Unmap(), f.Forward.SrcPort), server: netip.AddrPortFrom(dst.Unmap(), f.Forward.DstPort)}] = true
		}
	}
	return out, nil
}

// conntrackListing is one family's UDP conntrack entries to the cache's addresses (trackedUDP), or why they
// could not be listed.
type conntrackListing struct {
	flows map[udpFlow]bool
	err   error
}

// listTracked lists the UDP conntrack entries to the cache's addresses, once for each family they are in.
func (v *verifier) listTracked() map[netlink.InetFamily]conntrackListing {
	listed := map[netlink.InetFamily]conntrackListing{}
	for _, ip := range v.listen {
		fam := conntrackFamily(ip)
		if _, ok := listed[fam]; ok {
			continue
		}
		var l conntrackListing
		l.flows, l.err = trackedUDP(fam, v.listen)
		listed[fam] = l
	}
	return listed
}

// noteTrackedBefore records the conntrack entries the cache's addresses have before -verify sends a
// lookup: entries left by the node's own lookups from before the NOTRACK rules were in place (the cache's
// probes of its own addresses, say), which dialUDP keeps its lookups' source ports clear of. A table that
// cannot be listed is left for checkConntrack to report.
func (v *verifier) noteTrackedBefore() {
	v.trackedBefore, v.uncheckable = map[udpFlow]bool{}, map[netip.Addr]int{}
	for _, l := range v.listTracked() {
		maps.Copy(v.trackedBefore, l.flows)
	}
}

// dialUDP connects a UDP socket to server from a source port conntrack has no entry for, so that an entry
// found afterwards is this lookup's, and returns it with its flow. A socket whose port has one stays open
// while it dials again, so the kernel picks another port. checkable is false when maxTrackedPortDials ports
// all had entries: the lookup then goes out from the last one, and the conntrack check leaves it out.
func (v *verifier) dialUDP(ctx context.Context, server netip.AddrPort) (conn net.Conn, flow udpFlow, checkable bool, err error) {
	var d net.Dialer
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	server = netip.AddrPortFrom(server.Addr().Unmap(), server.Port())
	for range maxTrackedPortDials {
		conn, err = d.DialContext(ctx, "udp", server.String())
		if err != nil {
			return nil, udpFlow{}, false, err
		}
		local := conn.LocalAddr().(*net.UDPAddr).AddrPort()
		flow = udpFlow{client: netip.AddrPortFrom(local.Addr().Unmap(), local.Port()), server: server}
		if !v.trackedBefore[flow] {
			return conn, flow, true, nil
		}
		held = append(held, conn)
	}
	held = held[:len(held)-1]
	return conn, flow, false, nil
}

// recordUDPLookup notes an answered UDP lookup for checkConntrack.
func (v *verifier) recordUDPLookup(flow udpFlow, checkable bool) {
	if checkable {
		v.lookups = append(v.lookups, flow)
	} else {
		v.uncheckable[flow.server.Addr()]++
	}
}

// checkConntrack looks for conntrack entries of the UDP lookups just made: with the NOTRACK rules in place
// there are none.
func (v *verifier) checkConntrack() {
	byAddr := map[netip.Addr]int{}
	for _, l := range v.lookups {
		byAddr[l.server.Addr()]++
	}
	listed := v.listTracked()
	for _, ip := range v.listen {
		tbl := listed[conntrackFamily(ip)]
		if tbl.err != nil {
			v.add("conntrack", ip.String(), false, "%v", tbl.err)
			continue
		}
		var tracked []string
		for _, l := range v.lookups {
			if l.server.Addr() == ip && tbl.flows[l] {
				tracked = append(tracked, strconv.Itoa(int(l.client.Port())))
			}
		}
		var leftOut string
		if n := v.uncheckable[ip]; n > 0 {
			leftOut = fmt.Sprintf("; %d left out, sent from ports conntrack had entries for before", n)
		}
		switch {
		case byAddr[ip] == 0 && v.uncheckable[ip] > 0:
			v.add("conntrack", ip.String(), false, "none of %d lookups could be checked: conntrack had entries for every source port tried", v.uncheckable[ip])
		case byAddr[ip] == 0:
			v.add("conntrack", ip.String(), false, "no lookup was answered, so none could be checked")
		case len(tracked) > 0:
			v.add("conntrack", ip.String(), false, "%d of %d lookups are tracked (source ports %s)%s: the NOTRACK rules do not apply",
				len(tracked), byAddr[ip], strings.Join(tracked, ", "), leftOut)
		default:
			v.add("conntrack", ip.String(), true, "none of %d lookups tracked%s", byAddr[ip], leftOut)
		}
	}
}
