//go:build linux

package nodelocal

import (
	"net/netip"

	"github.com/nodelocaldns/nodelocaldns/nodelocal/internal/drain"
)

// A UDP reuseport group has one program, which picks the socket for each new packet, and two users in a
// cache process: a Succession taking the node over steers every new packet to this process while an older
// one drains, and a DNS server's fast path (wirecache's) steers the group to a socket of its own while no
// other process shares the group. The takeover's wins: while it holds a group, SteerUDPGroup and
// UnsteerUDPGroup change nothing and return ErrTakenOver, checked and applied in one step. A TCP group's
// program picks the listener for each new connection, and has one user: the fast path, which steers it to a
// listener of its own that caps how many connections it accepts.

// ReuseportSocket is a socket of a reuseport group: its inode, and its descriptor in this process (FD),
// or -1 when it is another process's.
type ReuseportSocket = drain.Socket

// ErrTakenOver is returned while this process takes the address over from an older one.
var ErrTakenOver = drain.ErrTakenOver

// UDPGroup returns the UDP sockets bound to local, in the order they joined its group.
func UDPGroup(local netip.AddrPort) ([]ReuseportSocket, error) { return drain.Group(drain.UDP, local) }

// OthersInGroup returns how many sockets of group are another process's.
func OthersInGroup(group []ReuseportSocket) int { return drain.Others(group) }

// UDPGroupTakenOver reports whether this process steers the group of local to itself while an older process's
// sockets drain.
func UDPGroupTakenOver(local netip.AddrPort) bool { return drain.TakingOver(local) }

// SteerUDPGroup sends every new UDP packet for local to the socket at index in its group (indexes follow
// the order of joining, except that a socket leaving hands its index to the last one: check where packets
// land). It returns ErrTakenOver, changing nothing, while a takeover holds the group.
func SteerUDPGroup(local netip.AddrPort, index uint32) error { return drain.Prefer(local, index) }

// UnsteerUDPGroup gives the group of local back to the kernel's hash, unless a takeover holds it
// (ErrTakenOver).
func UnsteerUDPGroup(local netip.AddrPort) error { return drain.Yield(local) }

// TCPGroup returns the TCP listeners bound to local. A plain TCP listener of this process has its FD set;
// an MPTCP one is listed as another process's (the kernel lists its subflow under another inode).
func TCPGroup(local netip.AddrPort) ([]ReuseportSocket, error) { return drain.Group(drain.TCP, local) }

// SteerTCPGroup sends every new TCP connection for local to the listener at index in its group, as
// SteerUDPGroup does for packets. No takeover steers a TCP group (an older process hands its listeners
// over instead), so this only fails when no plain TCP listener of this process is in the group.
func SteerTCPGroup(local netip.AddrPort, index uint32) error {
	return drain.SteerTo(drain.TCP, local, index)
}

// UnsteerTCPGroup gives the TCP group of local back to the kernel's hash.
func UnsteerTCPGroup(local netip.AddrPort) error { return drain.Unsteer(drain.TCP, local) }

// ReuseportChanges returns a channel that gets a value whenever this process learns that another process
// may have joined or left its reuseport groups (a successor queued at the node lock, or left the line) or
// that a takeover began or ended, for a fast path that looks at its group then instead of polling; and a
// function that ends the subscription. A process that joins without queueing (not a cache) is not
// announced: a user still looks now and then.
func ReuseportChanges() (<-chan struct{}, func()) { return drain.Changes() }

// SuccessorQueued reports whether a successor waits to take this process's node over: its sockets join
// the groups as soon as it serves, so a fast path gives its group back to the kernel's hash meanwhile.
func SuccessorQueued() bool { return drain.SuccessorQueued() }
