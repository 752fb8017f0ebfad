package wirecache

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// plenty is a byte budget no test entry comes near.
const plenty = 1 << 30

// testEntry returns an entry with only a key, counting bytes, fresh until expires.
func testEntry(name string, bytes int64, expires time.Time) *entry {
	return &entry{data: []byte(name), keyEnd: uint16(len(name)), stored: expires.Sub(clockBase) - time.Hour, lifetime: time.Hour, bytes: uint32(bytes)}
}

func TestStoreCapacity(t *testing.T) {
	for _, capacity := range []int{1, 3, 64, 100, 1000} {
		s := newStore(capacity, plenty)
		total := 0
		for i := range s.shards {
			total += s.shards[i].limit
		}
		if total != capacity {
			t.Errorf("capacity %d: shard limits add up to %d", capacity, total)
		}
		for i := range 20 * capacity {
			key := []byte(fmt.Sprintf("name-%d", i))
			s.add(s.hash(key), testEntry(string(key), 100, t0.Add(time.Hour)), t0)
			if s.len() > capacity {
				t.Fatalf("capacity %d: %d entries after %d adds", capacity, s.len(), i+1)
			}
		}
		held := 0
		for i := range s.shards {
			held += len(s.shards[i].items)
		}
		if held != s.len() || held != capacity {
			t.Errorf("capacity %d: count %d, held %d, want both %d", capacity, s.len(), held, capacity)
		}
	}
}

// TestStoreByteBudget fills a store with entries of random sizes: the bytes held never pass the budget, the
// count of bytes is exact, and an entry larger than a shard's share is not stored.
func TestStoreByteBudget(t *testing.T) {
	for _, budget := range []int64{maxEntryBytes, 3 * maxEntryBytes, 64 * maxEntryBytes, 100*maxEntryBytes + 7} {
		s := newStore(100000, budget)
		var shareSum int64
		for i := range s.shards {
			shareSum += s.shards[i].byteLimit
			if s.shards[i].byteLimit < maxEntryBytes {
				t.Errorf("budget %d: shard %d of %d gets %d bytes, less than the largest entry (%d)",
					budget, i, len(s.shards), s.shards[i].byteLimit, maxEntryBytes)
			}
		}
		if shareSum != budget {
			t.Errorf("budget %d: shard shares add up to %d", budget, shareSum)
		}
		rng := rand.New(rand.NewPCG(1, uint64(budget)))
		for i := range 5000 {
			key := []byte(fmt.Sprintf("name-%d", i%700)) // replacements too
			s.add(s.hash(key), testEntry(string(key), 200+rng.Int64N(maxEntryBytes-200), t0.Add(time.Hour)), t0)
			if s.size() > budget {
				t.Fatalf("budget %d: %d bytes held after %d adds", budget, s.size(), i+1)
			}
		}
		var held int64
		count := 0
		for i := range s.shards {
			var inShard int64
			for _, e := range s.shards[i].items {
				inShard += int64(e.bytes)
			}
			if inShard != s.shards[i].bytes {
				t.Errorf("budget %d: shard %d counts %d bytes, holds %d", budget, i, s.shards[i].bytes, inShard)
			}
			held += inShard
			count += len(s.shards[i].items)
		}
		if held != s.size() || count != s.len() {
			t.Errorf("budget %d: store counts %d bytes in %d entries, holds %d in %d", budget, s.size(), s.len(), held, count)
		}
		if s.len() == 0 {
			t.Errorf("budget %d: nothing held", budget)
		}
	}

	s := newStore(10, maxEntryBytes)
	key := []byte("too-big.")
	if s.add(s.hash(key), testEntry(string(key), maxEntryBytes+1, t0.Add(time.Hour)), t0); s.get(s.hash(key), key) != nil || s.size() != 0 {
		t.Error("an entry larger than the budget was stored")
	}
}

func TestStoreGet(t *testing.T) {
	s := newStore(10, plenty)
	k := []byte("www.example.org.")
	h := s.hash(k)
	e := testEntry(string(k), 300, t0.Add(time.Minute))
	s.add(h, e, t0)
	if got := s.get(h, k); got != e {
		t.Errorf("get returned %v", got)
	}
	if got := s.get(h, []byte("other.example.org.")); got != nil {
		t.Error("an entry was returned for another key under the same hash")
	}
	fresh := testEntry(string(k), 500, t0.Add(time.Hour))
	s.add(h, fresh, t0)
	if s.size() != 500 {
		t.Errorf("after a replacement the store counts %d bytes, want 500", s.size())
	}
	s.remove(h, e) // stale pointer: the fresher entry must survive
	if s.get(h, k) != fresh || s.len() != 1 {
		t.Error("removing a replaced entry removed its replacement")
	}
	s.remove(h, fresh)
	if s.get(h, k) != nil || s.len() != 0 || s.size() != 0 {
		t.Error("remove left the entry")
	}
}

// TestStoreEvictsExpiredFirst fills one shard with live entries and one expired one, in random order, and
// adds one more: the expired entry must be the one to go. A policy that evicts at random keeps it three
// times in four, so over the rounds it cannot pass.
func TestStoreEvictsExpiredFirst(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for round := range 64 {
		s := newStore(evictionProbes, maxEntryBytes) // a budget for one largest entry: one shard
		if len(s.shards) != 1 || s.shards[0].limit != evictionProbes {
			t.Fatalf("want one shard of %d entries, got %d shards", evictionProbes, len(s.shards))
		}
		expiredAt := rng.IntN(evictionProbes)
		var live [][]byte
		for i := range evictionProbes {
			k := []byte(fmt.Sprintf("r%d-e%d.", round, i))
			expires := t0.Add(time.Hour)
			if i == expiredAt {
				expires = t0
			} else {
				live = append(live, k)
			}
			s.add(s.hash(k), testEntry(string(k), 100, expires), t0)
		}
		k := []byte(fmt.Sprintf("r%d-new.", round))
		if evicted := s.add(s.hash(k), testEntry(string(k), 100, t0.Add(time.Hour)), t0.Add(time.Second)); !evicted {
			t.Fatal("a full store added without evicting")
		}
		for _, l := range append(live, k) {
			if s.get(s.hash(l), l) == nil {
				t.Fatalf("round %d: live entry %s was evicted while an expired one was held", round, l)
			}
		}
	}
}

// TestStoreEvictsForBytes: a large entry evicts as many entries as it needs room for.
func TestStoreEvictsForBytes(t *testing.T) {
	s := newStore(100, maxEntryBytes)
	for i := range 10 {
		k := []byte(fmt.Sprintf("small-%d.", i))
		s.add(s.hash(k), testEntry(string(k), maxEntryBytes/10, t0.Add(time.Hour)), t0)
	}
	if s.len() != 10 {
		t.Fatalf("%d entries, want 10", s.len())
	}
	k := []byte("large.")
	if !s.add(s.hash(k), testEntry(string(k), maxEntryBytes/2, t0.Add(time.Hour)), t0) {
		t.Error("no entry evicted for a large one")
	}
	if s.get(s.hash(k), k) == nil || s.size() > maxEntryBytes || s.len() > 6 {
		t.Errorf("after the large entry: %d entries, %d bytes", s.len(), s.size())
	}
}

// TestFootprint checks the byte count of real entries against their parts, and that the bound every store
// is sized for holds for the largest answer stored.
// TestEntryData: an entry keeps its key, its packed answer and the TTL offsets in one allocation of exactly
// their size, with the question name as the answer spells it only when that is not the key's lowered name,
// and counts that allocation against the budget.
func TestEntryData(t *testing.T) {
	z := testZone(t)
	for _, tc := range []struct{ asked, spelled string }{
		{"www.example.org.", ""},
		{"WWW.Example.org.", "WWW.Example.org."},
	} {
		req := newQuery(tc.asked, dns.TypeA, 0, false)
		e, q := mustEntry(t, req, z.reply(req), 0, time.Hour)
		wire, err := z.reply(req).Pack()
		if err != nil {
			t.Fatal(err)
		}
		key := strings.ToLower(tc.asked) + string(e.key()[len(tc.asked):])
		if want := len(key) + len(tc.spelled) + len(wire) + 2*len(z.reply(req).Answer); cap(e.data) != want || len(e.data) != want {
			t.Errorf("%s: %d bytes of data (capacity %d), want %d", tc.asked, len(e.data), cap(e.data), want)
		}
		if string(e.key()) != key || string(e.qname()) != q.name || string(e.wire(e.plain)) != string(wire) {
			t.Errorf("%s: key %q, name %q, answer %x; want %q, %q, %x", tc.asked, e.key(), e.qname(), e.wire(e.plain), key, q.name, wire)
		}
		if want := entryOverhead + int64(cap(e.data)); int64(e.bytes) != want {
			t.Errorf("%s: %d bytes counted, want %d", tc.asked, e.bytes, want)
		}
	}
}

func TestFootprint(t *testing.T) {
	z := testZone(t)
	for _, name := range []string{"www.example.org.", "big.example.org.", "huge.example.org."} {
		for _, qtype := range []uint16{dns.TypeA, dns.TypeTXT} {
			req := newQuery(name, qtype, 4096, false)
			var key [keyLen]byte
			q, n, _ := parseQuery(req, &key)
			e, err := newEntry(z.reply(req), &q, string(key[:n]), t0, lifetimes{max: time.Hour}, nil)
			if err != nil {
				continue
			}
			low := entryOverhead + int64(n+len(e.wire(e.plain))+len(e.ttlOffsets(e.plain)))
			if int64(e.bytes) < low || int64(e.bytes) > maxEntryBytes {
				t.Errorf("%s %s: %d bytes counted, want at least %d and at most %d", name, dns.TypeToString[qtype], e.bytes, low, maxEntryBytes)
			}
		}
	}
	// The largest answer stored: 4096 bytes of small records, in two forms (the owner names compress).
	req := newQuery("x.", dns.TypeA, 0, false)
	m := new(dns.Msg)
	m.SetReply(req)
	for m.Len() < maxEntryWire-17 {
		m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: "x.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: []byte{192, 0, 2, byte(len(m.Answer))}})
	}
	var key [keyLen]byte
	q, n, _ := parseQuery(req, &key)
	e, err := newEntry(m, &q, string(key[:n])+string(make([]byte, keyLen-n)), t0, lifetimes{max: time.Hour}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !e.hasCompressed() || len(e.wire(e.compressed)) == len(e.wire(e.plain)) {
		t.Fatal("the largest answer was not stored in two forms")
	}
	if int64(e.bytes) > maxEntryBytes {
		t.Errorf("an entry of %d bytes, %d records counts %d bytes, above maxEntryBytes %d", m.Len(), len(e.ttlOffsets(e.plain))/2, e.bytes, maxEntryBytes)
	}
}

// TestStoreRemembersAsks: an answer stored again keeps its asks, whether it replaces its older self (a refresh)
// or comes back after an eviction, so an answer asked for often is not put on probation by either.
func TestStoreRemembersAsks(t *testing.T) {
	s := newStore(1, maxEntryBytes) // one shard, one entry
	hot, other := []byte("hot."), []byte("other.")
	add := func(k []byte) *entry {
		e := testEntry(string(k), 100, t0.Add(time.Hour))
		s.add(s.hash(k), e, t0)
		return e
	}
	add(hot)
	for range 3 {
		s.get(s.hash(hot), hot)
	}
	if got := add(hot).asked.Load(); got != 3 {
		t.Errorf("a refresh of an entry asked 3 times has %d asks", got)
	}
	add(other) // evicts hot, the only entry, taking one ask
	if asked, ok := s.ghost(s.hash(hot)); !ok || asked != 2 {
		t.Fatalf("the evicted entry's ghost: %d asks, %v; want 2", asked, ok)
	}
	if got := add(hot).asked.Load(); got != 3 || got < protectedAsks {
		t.Errorf("an entry stored again after its eviction has %d asks, want 3 (its 2 and this one)", got)
	}
	if got := add(other).asked.Load(); got != 1 {
		t.Errorf("an entry evicted without asks and stored again has %d asks, want 1", got)
	}
}
