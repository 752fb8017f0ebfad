package drain

import (
	"net/netip"
	"sync"
)

// A reuseport group has one program, and two users in a process may want to set it: a cache taking its
// node over from an older process steers every new packet to this process (TakeOver) until the older
// process's sockets are gone (EndTakeOver); wirecache's fast path steers the group to its own socket
// within this process, and gives it back to the kernel's hash when another process joins, so that the
// newcomer can prove that it answers. While this process takes an address over, the takeover owns the
// group's program and the fast path leaves it alone (TakingOver): giving the group back to the hash then
// would send new packets to the older process's sockets again, which drop what is queued on them when
// they close.
//
// The takeovers are the process's: the group's program is one per group whoever sets it, so whoever sets it
// in this process must know. They are the only state of this package.
var takeovers = struct {
	mu    sync.Mutex
	addrs map[netip.AddrPort]bool
}{addrs: map[netip.AddrPort]bool{}}

// TakeOver steers every new UDP packet for local to the calling process's socket that joined the group
// last (SteerToNewest) and, when the group has other sockets (an older process's), records that this
// process owns the group's program until EndTakeOver. It returns how many sockets the group had.
func TakeOver(local netip.AddrPort) (int, error) {
	size, err := SteerToNewest(UDP, local)
	if err != nil || size < 2 {
		return size, err
	}
	takeovers.mu.Lock()
	defer takeovers.mu.Unlock()
	takeovers.addrs[unmapped(local)] = true
	return size, nil
}

// EndTakeOver gives the group of local back to the kernel's hash and ends the takeover: the older
// process's sockets are gone (or the takeover failed), and the fast path may steer the group again.
func EndTakeOver(local netip.AddrPort) error {
	takeovers.mu.Lock()
	delete(takeovers.addrs, unmapped(local))
	takeovers.mu.Unlock()
	return Unsteer(UDP, local)
}

// TakingOver reports whether this process steers the group of local to itself while an older process's
// sockets drain.
func TakingOver(local netip.AddrPort) bool {
	takeovers.mu.Lock()
	defer takeovers.mu.Unlock()
	return takeovers.addrs[unmapped(local)]
}

func unmapped(a netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
}
