package wirecache

import (
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
)

// turnEvery is how many units of a burst's work (a connection accepted, closed or reset) one goroutine does
// before it gives the hits a turn: a few microseconds each, so a hit waits some tens of microseconds at most.
const turnEvery = 16

// hitTurns gives the hits queued on an instance's fast paths a turn during a long run of other work on one
// goroutine: a burst of TCP connections to accept or to reset, hundreds at once when a client's idle
// connections end together and it opens them again. On one P (node-cache's default) the reader a datagram
// wakes through the network poller waits until nothing else is ready to run, since the runtime polls the
// network only when its run queues are empty (or every 10 ms, from its monitor thread): hits queued behind a
// 5 ms burst of accepts waited 5 ms. Every turnEvery units of such work, the worker wakes each fast path's
// helper (fastReader.help), which reads what its socket holds without the poller, and yields to it.
type hitTurns struct {
	work atomic.Uint64

	mu      sync.Mutex
	helpers []chan struct{} // each fast path's helpWanted
}

// worked counts one unit of a burst's work, and gives the hits a turn every turnEvery of them. A nil
// hitTurns gives none.
func (t *hitTurns) worked() {
	if t == nil || t.work.Add(1)%turnEvery != 0 {
		return
	}
	t.give()
}

// give wakes the helpers that wait, and yields the P: a goroutine woken runs next.
func (t *hitTurns) give() {
	t.mu.Lock()
	n := len(t.helpers)
	for _, help := range t.helpers {
		select {
		case help <- struct{}{}:
		default: // busy, or already woken
		}
	}
	t.mu.Unlock()
	if n > 0 {
		runtime.Gosched()
	}
}

// add lets the helpers waiting on help take turns.
func (t *hitTurns) add(help chan struct{}) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.helpers = append(t.helpers, help)
}

// remove undoes add.
func (t *hitTurns) remove(help chan struct{}) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.helpers = slices.DeleteFunc(t.helpers, func(c chan struct{}) bool { return c == help })
}
