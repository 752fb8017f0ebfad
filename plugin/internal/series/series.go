// Package series keeps the children of Prometheus metric vectors that the plugins update on every query.
// client_golang's WithLabelValues hashes every label value byte by byte and takes the vector's lock; at
// 2,000 misses a second upstreamsvc's three such lookups per miss took 2.9 % of the cache's CPU time (perf),
// as much as the prometheus plugin's five. A child here is resolved from its label values once, on first
// use, and kept: a query then loads a pointer, or scans a short list of servers.
//
// No child of the vectors whose children are kept here is ever deleted (neither these plugins nor CoreDNS
// delete any), so a kept child is the one the vector exports.
package series

import (
	"slices"
	"sync"
	"sync/atomic"
)

// Slot holds one child, resolved on first use. The zero Slot is empty.
type Slot[T any] struct {
	p atomic.Pointer[T]
}

// Get returns the slot's child, resolving it with resolve the first time. Two callers racing on an empty
// slot resolve the same child (a vector has one child per label values), so either store is right.
func (s *Slot[T]) Get(resolve func() T) T {
	if p := s.p.Load(); p != nil {
		return *p
	}
	v := resolve()
	s.p.Store(&v)
	return v
}

// PerServer holds one value per CoreDNS server (a listen address, "dns://169.254.20.10:53"), made on
// first use and kept. A server block has one or a few servers, so a lookup scans a short copy-on-write
// list, without a lock. The zero PerServer is empty.
type PerServer[T any] struct {
	list atomic.Pointer[[]perServer[T]]
	mu   sync.Mutex // serializes additions to list
}

type perServer[T any] struct {
	server string
	v      T
}

// Get returns server's value, making it with make the first time; make runs once per server.
func (s *PerServer[T]) Get(server string, make func() T) T {
	if v, ok := s.lookup(server); ok {
		return v
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if v, ok := s.lookup(server); ok {
		return v
	}
	var list []perServer[T]
	if p := s.list.Load(); p != nil {
		list = *p
	}
	v := make()
	list = append(slices.Clip(list), perServer[T]{server: server, v: v})
	s.list.Store(&list)
	return v
}

func (s *PerServer[T]) lookup(server string) (T, bool) {
	if p := s.list.Load(); p != nil {
		for _, e := range *p {
			if e.server == server {
				return e.v, true
			}
		}
	}
	var zero T
	return zero, false
}
