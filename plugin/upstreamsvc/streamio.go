package upstreamsvc

import (
	"encoding/binary"
	"net"

	"github.com/miekg/dns"
)

// frameReader splits the DNS messages of a TCP stream, each after its length (RFC 1035 4.2.2), out of the
// bytes read into it.
type frameReader struct {
	buf        []byte // the largest message and its length fit whole
	start, end int    // buf[start:end] was read and is not handed on yet
}

func newFrameReader() *frameReader { return &frameReader{buf: make([]byte, 2+dns.MaxMsgSize)} }

// room returns where the next read goes, after moving what was read of a message to the buffer's start; it
// is never empty.
func (f *frameReader) room() []byte {
	f.end = copy(f.buf, f.buf[f.start:f.end])
	f.start = 0
	return f.buf[f.end:]
}

// add takes n more bytes read into room, and hands each message they complete to deliver, which must not
// keep it.
func (f *frameReader) add(n int, deliver func(msg []byte)) {
	f.end += n
	for f.end-f.start >= 2 {
		size := int(binary.BigEndian.Uint16(f.buf[f.start:]))
		if f.end-f.start-2 < size {
			return
		}
		deliver(f.buf[f.start+2 : f.start+2+size])
		f.start += 2 + size
	}
}

// connIO reads and writes a pipelined connection through its net.Conn.
type connIO struct{ net.Conn }

// shutdown closes the connection: its reader hands answers on outside its reads, so closing, which waits
// for the reads under way, waits for none that needs the caller.
func (c connIO) shutdown() { _ = c.Close() }

func (c connIO) readMessages(deliver func(msg []byte)) error {
	f := newFrameReader()
	for {
		n, err := c.Read(f.room())
		f.add(n, deliver)
		if err != nil {
			return err
		}
	}
}
