package wirecache

import (
	"fmt"
	"testing"
	"time"
)

func TestStoreCapacity(t *testing.T) {
	for _, capacity := range []int{1, 3, 64, 100, 1000} {
		s := newStore(capacity)
		total := 0
		for i := range s.shards {
			total += s.shards[i].limit
		}
		if total != capacity {
			t.Errorf("capacity %d: shard limits add up to %d", capacity, total)
		}
		for i := range 20 * capacity {
			key := []byte(fmt.Sprintf("name-%d", i))
			s.add(s.hash(key), &entry{key: string(key), expires: t0.Add(time.Hour)}, t0)
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

func TestStoreGet(t *testing.T) {
	s := newStore(10)
	k := []byte("www.example.org.")
	h := s.hash(k)
	e := &entry{key: string(k), expires: t0.Add(time.Minute)}
	s.add(h, e, t0)
	if got := s.get(h, k); got != e {
		t.Errorf("get returned %v", got)
	}
	if got := s.get(h, []byte("other.example.org.")); got != nil {
		t.Error("an entry was returned for another key under the same hash")
	}
	fresh := &entry{key: string(k), expires: t0.Add(time.Hour)}
	s.add(h, fresh, t0)
	s.remove(h, e) // stale pointer: the fresher entry must survive
	if s.get(h, k) != fresh || s.len() != 1 {
		t.Error("removing a replaced entry removed its replacement")
	}
	s.remove(h, fresh)
	if s.get(h, k) != nil || s.len() != 0 {
		t.Error("remove left the entry")
	}
}

func TestStoreEvictsExpiredFirst(t *testing.T) {
	s := newStore(1) // one shard holding one entry
	old := []byte("old.")
	s.add(s.hash(old), &entry{key: string(old), expires: t0}, t0)
	k := []byte("new.")
	if evicted := s.add(s.hash(k), &entry{key: string(k), expires: t0.Add(time.Hour)}, t0.Add(time.Second)); !evicted {
		t.Error("a full store added without evicting")
	}
	if s.get(s.hash(old), old) != nil || s.get(s.hash(k), k) == nil {
		t.Error("the expired entry was not the one evicted")
	}
}
