//go:build linux

package wirecache

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/nodelocaldns/nodelocaldns/nodelocal"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
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

// TestLookAtProbesOnlyAChangedGroup runs the fast path's looks at a fake group: the first steers it and
// probes, a look at the same sockets does neither (an idle node's looks cost a read of the group), and a
// group that changed, or a probe that got no answer, is steered and probed again.
func TestLookAtProbesOnlyAChangedGroup(t *testing.T) {
	const ours = 7
	group := []nodelocal.ReuseportSocket{{Inode: 11, FD: 6}, {Inode: 12, FD: ours}}
	steeredTo, probes := -1, 0
	var probeErr error
	s := &groupSocket{
		network: "UDP", what: "UDP queries", fd: ours,
		group:   func() ([]nodelocal.ReuseportSocket, error) { return group, nil },
		steerTo: func(index uint32) error { steeredTo = int(index); return nil },
		unsteer: func() error { steeredTo = -1; return nil },
		probe: func(context.Context) (bool, error) {
			probes++
			if probeErr != nil {
				return false, probeErr
			}
			// The fake kernel: the index of ours is its place in the group.
			return steeredTo >= 0 && group[steeredTo].FD == ours, nil
		},
		gauge: promauto.With(nil).NewGauge(prometheus.GaugeOpts{Name: "steered"}), // registered nowhere
	}
	fp := &fastPath{srv: &dnsserver.Server{Addr: "dns://127.0.0.1:53"}, local: netip.MustParseAddrPort("127.0.0.1:53")}
	look := func(step string, wantProbes int, wantSteered bool) {
		t.Helper()
		before := probes
		fp.lookAt(context.Background(), s)
		if got := probes - before; got != wantProbes {
			t.Errorf("%s: %d probes, want %d", step, got, wantProbes)
		}
		if s.steered != wantSteered {
			t.Errorf("%s: steered %v, want %v", step, s.steered, wantSteered)
		}
	}
	look("first look", 1, true)
	look("the same group", 0, true)
	look("the same group again", 0, true)

	// A socket of this process joins (a reload's new socket): the index of ours may have moved.
	group = append(group, nodelocal.ReuseportSocket{Inode: 13, FD: 8})
	look("a socket joined", 3, true) // the newest index first, then from 0: ours is 1
	look("the grown group", 0, true)

	// The probe gets no answer after a change: the next look tries again.
	group = group[1:]
	probeErr = errors.New("no answer")
	look("a socket left, no answer", 1, false)
	probeErr = nil
	look("a socket left, answered", 2, true)
	look("the shrunk group", 0, true)
}

// The looks of two fast paths that started apart fall on the same instants, each no sooner than its wait
// and less than steerCheck later.
func TestUntilLookAlignsTheFastPaths(t *testing.T) {
	start := time.Date(2026, 12, 4, 21, 0, 3, 123456789, time.UTC)
	a, b := start, start.Add(2345*time.Millisecond) // the second address's first query came later
	waitA, waitB := steerCheck, steerCheck
	for round := range 6 {
		dA, dB := untilLook(a, waitA), untilLook(b, waitB)
		for _, c := range []struct {
			name    string
			d, wait time.Duration
			at      time.Time
		}{{"first", dA, waitA, a.Add(dA)}, {"second", dB, waitB, b.Add(dB)}} {
			if c.d < c.wait || c.d >= c.wait+steerCheck {
				t.Errorf("round %d, %s: %v for a wait of %v", round, c.name, c.d, c.wait)
			}
			if !c.at.Truncate(steerCheck).Equal(c.at) {
				t.Errorf("round %d, %s: the look at %v is not on a multiple of %v", round, c.name, c.at, steerCheck)
			}
		}
		if !a.Add(dA).Equal(b.Add(dB)) {
			t.Errorf("round %d: looks at %v and %v", round, a.Add(dA), b.Add(dB))
		}
		a, b = a.Add(dA), b.Add(dB)
		waitA, waitB = min(2*waitA, steerCheckMax), min(2*waitB, steerCheckMax)
	}
}
