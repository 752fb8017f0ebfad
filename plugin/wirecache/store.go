package wirecache

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"
)

// maxShards bounds the number of shards; each has its own lock so concurrent hits rarely contend.
const maxShards = 64

// store holds at most capacity entries and maxBytes bytes of them (entry.bytes), in shards that each get an
// equal share of both. When a new entry does not fit its shard, entries are evicted until it does: expired ones
// and those few lookups found first, those asked for often last (see victim). A flood of names asked once or
// twice therefore evicts its own entries, not the ones other clients keep asking for.
type store struct {
	seed   maphash.Seed
	mask   uint64
	shards []shard
	count  atomic.Int64
	bytes  atomic.Int64
	// ghosts remembers the asks of entries evicted lately, one slot per hash (see ghost), so that an answer
	// asked for often and evicted anyway is stored again protected, not on probation.
	ghosts    []atomic.Uint64
	ghostMask uint64
}

// askBits is how many low bits of a ghost slot hold the asks; the others are the evicted entry's hash.
const askBits = 4

type shard struct {
	mu        sync.RWMutex
	items     map[uint64]*entry
	limit     int   // entries
	byteLimit int64 // sum of entry.bytes
	bytes     int64
}

// evictionProbes is how many entries of a full shard are looked at for an expired one before an entry on
// probation is evicted.
const evictionProbes = 4

// protectedAsks is how many lookups must find an entry before evictions spare it while entries on probation
// remain (see victim), and maxAsked the most asks an entry keeps (entry.asked): how many rounds in which every
// protected entry loses one it survives without being asked again.
const (
	protectedAsks = 2
	maxAsked      = 8
)

// newStore splits capacity and maxBytes over up to maxShards shards: fewer when capacity is small, or when
// maxBytes could not give every shard room for the largest entry, so that any storable answer fits a shard.
func newStore(capacity int, maxBytes int64) *store {
	n := 1
	for n*2 <= min(capacity, maxShards) && int64(n*2)*maxEntryBytes <= maxBytes {
		n *= 2
	}
	g := 256 // one ghost per four entries, 2 to 128 KiB
	for g < capacity/4 && g < 1<<14 {
		g *= 2
	}
	s := &store{seed: maphash.MakeSeed(), mask: uint64(n - 1), shards: make([]shard, n),
		ghosts: make([]atomic.Uint64, g), ghostMask: uint64(g - 1)}
	for i := range s.shards {
		// Spread both limits exactly: the first capacity%n (maxBytes%n) shards get one more.
		limit, byteLimit := capacity/n, maxBytes/int64(n)
		if i < capacity%n {
			limit++
		}
		if int64(i) < maxBytes%int64(n) {
			byteLimit++
		}
		s.shards[i] = shard{items: make(map[uint64]*entry), limit: limit, byteLimit: byteLimit}
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
	if e == nil || string(e.key()) != string(key) {
		return nil
	}
	if asked := e.asked.Load(); asked < maxAsked { // a hot entry is written once per eviction, not per hit
		e.asked.Store(asked + 1) // a lost update between concurrent lookups costs an ask, no more
	}
	return e
}

// add stores e under hash h, replacing what was there, and reports whether other entries were evicted to
// make room. An entry larger than a shard's share of the bytes is not stored.
func (s *store) add(h uint64, e *entry, now time.Time) (evicted bool) {
	sh := &s.shards[h&s.mask]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if int64(e.bytes) > sh.byteLimit {
		return false
	}
	if old, ok := sh.items[h]; ok {
		// A refreshed answer keeps the asks of the one it replaces.
		e.asked.Store(old.asked.Load())
		s.drop(sh, h, old)
	} else if asked, ok := s.ghost(h); ok {
		// Asked for again after an eviction: this ask counts too.
		e.asked.Store(min(asked+1, maxAsked))
	}
	for len(sh.items) >= sh.limit || sh.bytes+int64(e.bytes) > sh.byteLimit {
		victim := sh.victim(now)
		s.ghosts[victim&s.ghostMask].Store(victim&^(1<<askBits-1) | uint64(sh.items[victim].asked.Load()))
		s.drop(sh, victim, nil)
		evicted = true
	}
	sh.items[h] = e
	sh.bytes += int64(e.bytes)
	s.count.Add(1)
	s.bytes.Add(int64(e.bytes))
	return evicted
}

// victim returns the hash of the entry to evict from the full shard sh, whose lock is held. An entry found by
// fewer than protectedAsks lookups since it was stored is on probation, the others are protected:
//   - the first expired entry looked at, if one is among the first evictionProbes, else the first entry on
//     probation, looking further until one is found (at most one pass of the shard);
//   - when every entry is protected, each loses one ask, and the one that had the fewest goes.
//
// So answers asked once or twice (the first ask stores, the second is a hit) leave before any answer asked for
// more; protected answers leave by how little they were asked since the last time every entry lost an ask,
// and an expired one leaves as soon as an eviction meets it.
func (sh *shard) victim(now time.Time) uint64 {
	victim, found, probes := uint64(0), false, 0
	for k, e := range sh.items { // map iteration starts at a random entry
		probes++
		if e.expired(now) {
			return k
		}
		if !found && e.asked.Load() < protectedAsks {
			victim, found = k, true
		}
		if found && probes >= evictionProbes {
			return victim
		}
	}
	if found {
		return victim
	}
	least := uint32(maxAsked + 1)
	for k, e := range sh.items {
		asked := e.asked.Load()
		if asked < least {
			victim, least = k, asked
		}
		e.asked.Store(asked - 1) // every entry here has protectedAsks or more
	}
	return victim
}

// ghost returns the asks of the entry last evicted under hash h, if its slot still holds it.
func (s *store) ghost(h uint64) (uint32, bool) {
	g := s.ghosts[h&s.ghostMask].Load()
	if g&^(1<<askBits-1) != h&^(1<<askBits-1) {
		return 0, false
	}
	return uint32(g & (1<<askBits - 1)), true
}

// drop deletes the entry under h in sh (e, or whatever is there when e is nil); sh.mu is held.
func (s *store) drop(sh *shard, h uint64, e *entry) {
	if e == nil {
		e = sh.items[h]
	}
	delete(sh.items, h)
	sh.bytes -= int64(e.bytes)
	s.count.Add(-1)
	s.bytes.Add(-int64(e.bytes))
}

// remove deletes the entry under h if it is still e, so a fresher entry stored meanwhile survives.
func (s *store) remove(h uint64, e *entry) {
	sh := &s.shards[h&s.mask]
	sh.mu.Lock()
	if sh.items[h] == e {
		s.drop(sh, h, e)
	}
	sh.mu.Unlock()
}

// len returns the number of entries held, expired ones included until they are replaced or evicted.
func (s *store) len() int { return int(s.count.Load()) }

// size returns the bytes the entries held account for (entry.bytes).
func (s *store) size() int64 { return s.bytes.Load() }
