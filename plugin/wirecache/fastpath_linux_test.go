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
	if group, err := nodelocal.UDPGroup(local); err != nil || len(group)-nodelocal.OthersInGroup(group) != 2 {
		t.Fatalf("sockets on %s: %v %v, want CoreDNS's and the fast path's", addr, group, err)
	}
	inst.ShutdownCallbacks()
	if group, err := nodelocal.UDPGroup(local); err != nil || len(group)-nodelocal.OthersInGroup(group) != 1 {
		t.Fatalf("sockets on %s after the fast path stopped: %v %v, want CoreDNS's alone", addr, group, err)
	}
	if got := gaugeValue(t, fastPathSteered, server); got != 0 {
		t.Errorf("fastpath_steered %v after the stop", got)
	}
	// CoreDNS's own socket answers, the group no longer steered to a socket that left.
	if got := askA(t, addr, "after.example.net."); got != "192.0.2.3" {
		t.Errorf("after the stop: %s", got)
	}
}
