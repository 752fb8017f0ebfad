//go:build linux

package drain

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// A reuseport group has one program, and two users in a process may want to set it: a cache taking its
// node over from an older process steers every new packet to this process (TakeOver) until the older
// process's sockets are gone (EndTakeOver); wirecache's fast path steers the group to its own socket
// within this process, and gives it back to the kernel's hash when another process joins, so that the
// newcomer can prove that it answers. While this process takes an address over, the takeover owns the
// group's program and the fast path's Prefer and Yield change nothing (ErrTakenOver), in the same step
// as they check: giving the group back to the hash then would send new packets to the older process's
// sockets again, which drop what is queued on them when they close.
//
// The takeovers are the process's: the group's program is one per group whoever sets it, so whoever sets it
// in this process must know. They, the subscribers to Changes and
// whether a successor is queued are the only state of this package.
var takeovers = struct {
	mu    sync.Mutex
	addrs map[netip.AddrPort]bool
}{addrs: map[netip.AddrPort]bool{}}

// changes are the subscribers to Changes.
var changes = struct {
	mu   sync.Mutex
	subs map[chan struct{}]struct{}
}{subs: map[chan struct{}]struct{}{}}

// Changes returns a channel that gets a value (at most one waits) whenever this process learns that
// another process may have joined or left its reuseport groups, or that a takeover began or ended (see
// Announce), so that a user that steers a group (the fast path) looks again at once instead of polling;
// and a function that ends the subscription.
func Changes() (<-chan struct{}, func()) {
	c := make(chan struct{}, 1)
	changes.mu.Lock()
	changes.subs[c] = struct{}{}
	changes.mu.Unlock()
	return c, func() {
		changes.mu.Lock()
		delete(changes.subs, c)
		changes.mu.Unlock()
	}
}

// successorQueued is set while a successor waits at this process's node lock (SetSuccessorQueued).
var successorQueued atomic.Bool

// SetSuccessorQueued records whether a successor waits to take this process's node over, and announces a
// change: its sockets join the groups as soon as it serves, and a fast path must give its group back to the
// kernel's hash before the successor's probes arrive, or they would land on the fast path's socket only.
func SetSuccessorQueued(queued bool) {
	if successorQueued.Swap(queued) != queued {
		Announce()
	}
}

// SuccessorQueued reports whether a successor waits to take this process's node over.
func SuccessorQueued() bool { return successorQueued.Load() }

// Announce tells the subscribers of Changes that the groups may have changed: a successor queued at the
// node lock or left it (nodelocal's Succession hears that), or a takeover began or ended (TakeOver and
// EndTakeOver announce it themselves).
func Announce() {
	changes.mu.Lock()
	defer changes.mu.Unlock()
	for c := range changes.subs {
		select {
		case c <- struct{}{}:
		default:
		}
	}
}

// TakeOver steers every new UDP packet for local to this process and, when the group has other sockets (an
// older process's), records that this process owns the group's program until EndTakeOver. It returns how
// many sockets the group had; the caller should check that it worked (probes that only this process
// answers, from several source ports, all answered).
//
// The program returns the index of this process's socket that joined first after every other process's,
// which is the count of the others' sockets: a socket leaving a group hands its index to the group's last
// socket, so the last socket's index goes out of range (and the kernel falls back to its hash, over the
// older sockets too) as soon as an older socket closes, while the first of ours keeps its index for as
// long as the older process has no more sockets than this one (the same configuration has as many).
func TakeOver(local netip.AddrPort) (int, error) {
	takeovers.mu.Lock()
	defer takeovers.mu.Unlock()
	group, err := Group(UDP, local)
	if err != nil {
		return 0, err
	}
	others := Others(group)
	if others == len(group) {
		return len(group), fmt.Errorf("no udp socket of this process is bound to %s", local)
	}
	if err := SteerTo(UDP, local, uint32(others)); err != nil {
		return len(group), fmt.Errorf("steer udp %s to this process: %w", local, err)
	}
	if others > 0 {
		takeovers.addrs[unmapped(local)] = true
		defer Announce()
	}
	return len(group), nil
}

// EndTakeOver gives the group of local back to the kernel's hash and ends the takeover: the older
// process's sockets are gone (or the takeover failed), and the fast path may steer the group again.
func EndTakeOver(local netip.AddrPort) error {
	defer Announce()
	takeovers.mu.Lock()
	defer takeovers.mu.Unlock()
	delete(takeovers.addrs, unmapped(local))
	return Unsteer(UDP, local)
}

// ErrTakenOver is returned by Prefer and Yield while this process takes the address over from an older
// one: the takeover steers the group until the older sockets are gone.
var ErrTakenOver = errors.New("this process takes the address over from an older one, whose takeover steers the group")

// Prefer steers the UDP group of local to the socket at index for a user of this process's that shares
// the group with no other process (wirecache's fast path), unless a takeover holds the group: then it
// changes nothing and returns ErrTakenOver. The check and the change are one step, so a takeover that
// starts meanwhile is never undone.
func Prefer(local netip.AddrPort, index uint32) error {
	takeovers.mu.Lock()
	defer takeovers.mu.Unlock()
	if takeovers.addrs[unmapped(local)] {
		return ErrTakenOver
	}
	return SteerTo(UDP, local, index)
}

// Yield gives the UDP group of local back to the kernel's hash for such a user, unless a takeover holds
// the group (ErrTakenOver).
func Yield(local netip.AddrPort) error {
	takeovers.mu.Lock()
	defer takeovers.mu.Unlock()
	if takeovers.addrs[unmapped(local)] {
		return ErrTakenOver
	}
	return Unsteer(UDP, local)
}

// TakingOver reports whether this process steers the group of local to itself while an older process's
// sockets drain.
func TakingOver(local netip.AddrPort) bool {
	takeovers.mu.Lock()
	defer takeovers.mu.Unlock()
	return takeovers.addrs[unmapped(local)]
}

// Others returns how many sockets of group are another process's.
func Others(group []Socket) int {
	n := 0
	for _, s := range group {
		if s.FD < 0 {
			n++
		}
	}
	return n
}

func unmapped(a netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
}

// HandListenersOver stops this process's TCP listeners on endpoints from taking new connections, in the
// groups where another process listens too: the kernel then gives new connections to the other listeners,
// and, with net.ipv4.tcp_migrate_req on (MigrateListeners), moves the connections waiting in these
// listeners' accept queues to them. This is how an older process stops taking TCP lookups: a program on
// the group (SteerTo) would need the successor to steer it, and would leave the older listeners' queues
// where they are. The listeners stay open for their owners to close as usual; their
// accept fails from now on. It returns how many listeners it stopped.
func HandListenersOver(endpoints []netip.AddrPort) (int, error) {
	stopped := 0
	for _, e := range endpoints {
		group, err := Group(TCP, e)
		if err != nil {
			return stopped, err
		}
		if Others(group) == 0 {
			continue // nobody to hand the connections to
		}
		for _, s := range group {
			if s.FD < 0 {
				continue
			}
			// shutdown(2) on a listener takes it out of its group and hands its accept queue over; the
			// descriptor stays its owner's.
			if err := unix.Shutdown(s.FD, unix.SHUT_RD); err != nil && !errors.Is(err, unix.ENOTCONN) {
				return stopped, fmt.Errorf("stop the listener on %s from taking connections: %w", e, err)
			}
			stopped++
		}
	}
	return stopped, nil
}
