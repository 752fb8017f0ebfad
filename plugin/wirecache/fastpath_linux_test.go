//go:build linux

package wirecache

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/coredns/caddy"
	"github.com/nodelocaldns/nodelocaldns/nodelocal"
)

// TestFastPathStopLeavesTheSocket stops an instance and checks that the fast path's socket has left the
// group, leaving CoreDNS's, and that its metrics say it no longer takes queries.
func TestFastPathStopLeavesTheSocket(t *testing.T) {
	useDirectives(t)
	port := freePort(t)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	server := "dns://" + addr
	inst, err := caddy.Start(caddy.CaddyfileInput{Contents: fmt.Appendf(nil, fastPathCorefile, port), ServerTypeName: "dns"})
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Stop()
	waitFastPathSteered(t, server, addr)
	local := netip.MustParseAddrPort(addr)
	if n := ownSockets(t, local, 2); n != 2 {
		t.Fatalf("%d sockets on %s, want CoreDNS's and the fast path's", n, addr)
	}
	inst.ShutdownCallbacks()
	if n := ownSockets(t, local, 1); n != 1 {
		t.Fatalf("%d sockets on %s after the fast path stopped, want CoreDNS's alone", n, addr)
	}
	if got := gaugeValue(t, fastPathSteered, server); got != 0 {
		t.Errorf("fastpath_steered %v after the stop", got)
	}
	// CoreDNS's own socket answers, the group no longer steered to a socket that left.
	if got := askA(t, addr, "after.example.net."); got != "192.0.2.3" {
		t.Errorf("after the stop: %s", got)
	}
}

// ownSockets returns how many sockets this process has bound to local: want if one of a few reads of the
// group finds that many, else what the last read found. /proc/net/udp, which drain reads, skips sockets now
// and then while other sockets of the namespace open and close (14 of 2,000 reads under four loops of UDP
// dials on loopback), so a single read may count one too few.
func ownSockets(t *testing.T, local netip.AddrPort, want int) int {
	t.Helper()
	n := 0
	for range 5 {
		group, err := nodelocal.UDPGroup(local)
		if err != nil {
			t.Fatal(err)
		}
		inodes := map[uint64]bool{}
		for _, s := range group {
			if s.FD >= 0 {
				inodes[s.Inode] = true
			}
		}
		if n = len(inodes); n == want {
			break
		}
	}
	return n
}
