package wirecache

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"
)

// maxShards bounds the number of shards; each has its own lock so concurrent hits rarely contend.
const maxShards = 64

// store holds at most capacity entries in shards of fixed size. When a shard is full, an expired entry
// is evicted if one is found among the first few looked at, otherwise a random one.
type store struct {
	seed   maphash.Seed
	mask   uint64
	shards []shard
	count  atomic.Int64
}

type shard struct {
	mu    sync.RWMutex
	items map[uint64]*entry
	limit int
}

// evictionProbes is how many entries of a full shard are looked at for an expired one.
const evictionProbes = 4

func newStore(capacity int) *store {
	n := 1
	for n*2 <= min(capacity, maxShards) {
		n *= 2
	}
	s := &store{seed: maphash.MakeSeed(), mask: uint64(n - 1), shards: make([]shard, n)}
	for i := range s.shards {
		// Spread capacity exactly: the first capacity%n shards hold one more.
		limit := capacity / n
		if i < capacity%n {
			limit++
		}
		s.shards[i] = shard{items: make(map[uint64]*entry), limit: limit}
	}
	return s
}

func (s *store) hash(key []byte) uint64 { return maphash.Bytes(s.seed, key) }

// get returns the entry stored for key, or nil. An entry found under the same hash but for another key is
// not returned.
func (s *store) get(h uint64, key []byte) *entry {
	sh := &s.shards[h&s.mask]
	sh.mu.RLock()
	e := sh.items[h]
	sh.mu.RUnlock()
	if e == nil || e.key != string(key) {
		return nil
	}
	return e
}

// add stores e under hash h, replacing what was there, and reports whether another entry was evicted.
func (s *store) add(h uint64, e *entry, now time.Time) (evicted bool) {
	sh := &s.shards[h&s.mask]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if _, ok := sh.items[h]; ok {
		sh.items[h] = e
		return false
	}
	if len(sh.items) >= sh.limit {
		victim, probes := uint64(0), 0
		for k, old := range sh.items { // map iteration starts at a random entry
			victim = k
			probes++
			if !now.Before(old.expires) || probes == evictionProbes {
				break
			}
		}
		delete(sh.items, victim)
		s.count.Add(-1)
		evicted = true
	}
	sh.items[h] = e
	s.count.Add(1)
	return evicted
}

// remove deletes the entry under h if it is still e, so a fresher entry stored meanwhile survives.
func (s *store) remove(h uint64, e *entry) {
	sh := &s.shards[h&s.mask]
	sh.mu.Lock()
	if sh.items[h] == e {
		delete(sh.items, h)
		s.count.Add(-1)
	}
	sh.mu.Unlock()
}

// len returns the number of entries held, expired ones included until they are replaced or evicted.
func (s *store) len() int { return int(s.count.Load()) }
