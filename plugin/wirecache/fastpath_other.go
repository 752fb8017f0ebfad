//go:build !linux

package wirecache

import (
	"errors"
	"net"
	"net/netip"

	"github.com/coredns/coredns/core/dnsserver"
)

// fastPath is Linux's alone: it needs recvmmsg, sendmmsg and reuseport BPF.
type fastPath struct{}

func startFastPath(*dnsserver.Server, netip.AddrPort, fastRouting, *connLimits, *hitTurns, func()) (*fastPath, error) {
	return nil, errors.New("the fast path needs Linux")
}

func (*fastPath) stop() {}

// readsWhole returns c: only Linux's fast path has a TCP listener of its own (wholeReadConn).
func readsWhole(c net.Conn) net.Conn { return c }
