package wirecache

import "sync/atomic"

// doorkeeper remembers which questions the chain answered recently, so that with repeats_only an answer is
// stored only when its question comes a second time: names asked once (search-path expansions, one-off
// lookups) then stay with the cache plugin alone instead of being held twice. It is a direct-mapped table of
// question hashes, about one slot per four entries the store may hold: a question is remembered until another
// one lands in its slot, so a repeat that comes after many other new names may be missed once, and is then
// stored at its next ask. Lock-free: a lost race only costs one store or one chain pass.
type doorkeeper struct {
	slots []atomic.Uint64
	mask  uint64
}

// newDoorkeeper returns a table for a store of capacity entries: a power of two from 1024 to 16Ki slots
// (8 bytes each; 32 KiB for the default capacity).
func newDoorkeeper(capacity int) *doorkeeper {
	n := 1024
	for n < capacity/4 && n < 1<<14 {
		n *= 2
	}
	return &doorkeeper{slots: make([]atomic.Uint64, n), mask: uint64(n - 1)}
}

// seen reports whether the question with hash h was asked since its slot was last taken by another
// question, and remembers h otherwise.
func (d *doorkeeper) seen(h uint64) bool {
	slot := &d.slots[h&d.mask]
	if slot.Load() == h {
		return true
	}
	slot.Store(h)
	return false
}
