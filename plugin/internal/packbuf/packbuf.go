// Package packbuf packs DNS messages into buffers kept between uses, for the packs whose bytes are copied
// at once and never kept: a pipelined query (copied into its connection's write buffer) and a reply the
// fast path writes to a client (copied into the kernel by the send). Through dns.Msg.Pack each allocated a
// buffer of the message's size for every miss, and a buffer on the caller's stack escapes to the heap anyway:
// miekg/dns hands it to each record's pack method through an interface.
package packbuf

import (
	"sync"

	"github.com/miekg/dns"
)

const (
	// initialSize is a new buffer's size: a query, and most answers a node cache stores.
	initialSize = 512
	// maxKeptSize is the largest a buffer grows to: a larger message is packed into a buffer of its own,
	// so that a rare large answer (a long TXT record, a zone transfer) does not stay in every buffer kept.
	maxKeptSize = 4096
)

// Pool keeps packing buffers. The zero Pool is ready to use.
type Pool struct {
	pool sync.Pool
}

// Buffer is one packing buffer, taken from a Pool with Get and given back with Put, or kept by its owner
// between its packs. The zero Buffer is ready to use.
type Buffer struct {
	b []byte
}

// Get returns a buffer of the pool's, or a new one.
func (p *Pool) Get() *Buffer {
	if b, _ := p.pool.Get().(*Buffer); b != nil {
		return b
	}
	return new(Buffer)
}

// Put gives b back for a later Get. Nothing packed into b may be used after.
func (p *Pool) Put(b *Buffer) {
	p.pool.Put(b)
}

// Pack packs m as m.Pack does. The bytes returned are b's, and valid until b is packed into again or put
// back, unless m did not fit b: they are then a buffer of their own, which b keeps for the next packs when
// it is not larger than maxKeptSize.
func (b *Buffer) Pack(m *dns.Msg) ([]byte, error) {
	if b.b == nil {
		b.b = make([]byte, initialSize)
	}
	packed, err := m.PackBuffer(b.b)
	if err != nil {
		return nil, err
	}
	if c := cap(packed); c > cap(b.b) && c <= maxKeptSize {
		b.b = packed[:c]
	}
	return packed, nil
}
