//go:build linux

package hostile

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/miekg/dns"
)

// transport is how a query is sent: over UDP, or over TCP with the bytes (length prefix included) written
// in pieces that end at splits (a negative split counts from the end), each piece its own segment (Go's
// TCP sockets send with TCP_NODELAY, and the writer pauses between pieces).
type transport struct {
	name   string
	tcp    bool
	splits []int
}

var (
	udp = transport{name: "udp"}
	tcp = transport{name: "tcp", tcp: true}
	// tcpSplit splits the length prefix itself, then the header, then the rest, and sends the last byte
	// alone: a server that waits for more than the bytes still to come (a receive low-water mark set too
	// high) would never answer.
	tcpSplit = transport{name: "tcp-split", tcp: true, splits: []int{1, 2, 7, -1}}
)

// splitPause is how long a split writer waits between pieces: long enough that each goes out on its own.
const splitPause = 5 * time.Millisecond

// exchange sends query to server and returns the reply, nil when none came within timeout (or, over
// TCP, when the server closed the connection first: closed says so). It must run on a thread inside the
// namespace to ask from.
func exchange(tr transport, server string, query []byte, timeout time.Duration) (reply []byte, closed bool, err error) {
	network := "udp"
	if tr.tcp {
		network = "tcp"
	}
	c, err := net.DialTimeout(network, server, timeout)
	if err != nil {
		return nil, false, fmt.Errorf("dialing %s/%s: %w", server, network, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	if !tr.tcp {
		if _, err := c.Write(query); err != nil {
			return nil, false, err
		}
		buf := make([]byte, 65535)
		n, err := c.Read(buf)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, false, nil
		}
		if err != nil {
			return nil, false, err
		}
		return buf[:n], false, nil
	}
	framed := make([]byte, 2+len(query))
	binary.BigEndian.PutUint16(framed, uint16(len(query)))
	copy(framed[2:], query)
	if err := writeSplit(c, framed, tr.splits); err != nil {
		return nil, false, err
	}
	reply, err = readFramed(c)
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return nil, false, nil
	case err != nil && isClosed(err):
		return nil, true, nil
	}
	return reply, false, err
}

// writeSplit writes b in pieces ending at splits, pausing between them.
func writeSplit(c net.Conn, b []byte, splits []int) error {
	from := 0
	for _, at := range splits {
		if at < 0 {
			at += len(b)
		}
		if at <= from || at >= len(b) {
			continue
		}
		if _, err := c.Write(b[from:at]); err != nil {
			return err
		}
		time.Sleep(splitPause)
		from = at
	}
	_, err := c.Write(b[from:])
	return err
}

// isClosed reports whether err is the peer closing or resetting a connection.
func isClosed(err error) bool {
	s := err.Error()
	return errors.Is(err, net.ErrClosed) || strings.Contains(s, "EOF") || strings.Contains(s, "connection reset")
}

// answer is a reply as the comparison sees it: text that differs between two replies exactly when they
// are different answers (the ID aside, which must be the query's, and the TTLs, compared separately).
type answer struct {
	text string
	ttls []uint32
}

// What describe says of an ask that got no reply.
const (
	noReply       = "no reply"
	closedNoReply = "connection closed, no reply"
)

// describe reads reply, the answer to a query with ID id.
func describe(reply []byte, closed bool, err error, id uint16) answer {
	switch {
	case err != nil:
		return answer{text: "error: " + err.Error()}
	case closed:
		return answer{text: closedNoReply}
	case reply == nil:
		return answer{text: noReply}
	case len(reply) < 2:
		return answer{text: fmt.Sprintf("%d bytes: %x", len(reply), reply)}
	}
	got := binary.BigEndian.Uint16(reply)
	prefix := ""
	if got != id {
		prefix = fmt.Sprintf("ID %d to query %d; ", got, id)
	}
	m := new(dns.Msg)
	if err := m.Unpack(reply); err != nil {
		return answer{text: fmt.Sprintf("%sunreadable %d bytes (%v): %x", prefix, len(reply), err, reply[2:])}
	}
	a := answer{}
	for _, section := range [][]dns.RR{m.Answer, m.Ns, m.Extra} {
		for _, rr := range section {
			if rr.Header().Rrtype == dns.TypeOPT {
				continue
			}
			a.ttls = append(a.ttls, rr.Header().Ttl)
			rr.Header().Ttl = 0
		}
	}
	m.Id = 0
	a.text = prefix + m.String()
	return a
}

// maxTTL is the largest TTL an answer of this tier's cluster DNS can carry through either Corefile, as both
// clamp its 3600 s records: corefile.Config's default success TTL.
const maxTTL = 30

// differs says how got, the cache's answer, differs from want, the reference's: "" when it is the same
// answer. A TTL may differ by what the seconds between the two asks and the caches' rounding give, or by the
// different ages of the two caches' entries: the cache under test keys some odd queries apart (an OPT with an
// owner name, say) and asks the cluster DNS for them, while the reference's *cache* answers them from the
// entry an earlier case's query left, or the other way round. That is one age for every record of the
// answer, so such TTLs differ from the reference's by the same number of seconds (within a second of
// rounding), and none is above maxTTL; a record whose TTL the cache handled otherwise stands out.
func differs(got, want answer) string {
	if got.text != want.text {
		return fmt.Sprintf("the cache's answer:\n%s\nthe reference's:\n%s", got.text, want.text)
	}
	if len(got.ttls) == 0 {
		return ""
	}
	age := int64(got.ttls[0]) - int64(want.ttls[0])
	for i := range got.ttls {
		d := int64(got.ttls[i]) - int64(want.ttls[i])
		if d-age > 1 || d-age < -1 || got.ttls[i] > maxTTL {
			return fmt.Sprintf("TTLs %v, the reference's %v, in:\n%s", got.ttls, want.ttls, got.text)
		}
	}
	return ""
}

// msg packs a query for name, qtype and qclass with RD set, shaped by the edits.
func msg(name string, qtype, qclass uint16, edits ...func(*dns.Msg)) func(id uint16) []byte {
	return func(id uint16) []byte {
		m := new(dns.Msg)
		m.Id = id
		m.RecursionDesired = true
		m.Question = []dns.Question{{Name: name, Qtype: qtype, Qclass: qclass}}
		for _, edit := range edits {
			edit(m)
		}
		b, err := m.Pack()
		if err != nil {
			panic(fmt.Sprintf("packing a query for %s: %v", name, err))
		}
		return b
	}
}

// raw is a query of literal bytes, the ID (its first two bytes) set to the ask's.
func raw(b []byte) func(id uint16) []byte {
	return func(id uint16) []byte {
		q := append([]byte(nil), b...)
		if len(q) >= 2 {
			binary.BigEndian.PutUint16(q, id)
		}
		return q
	}
}

// packed is what msg packs, then changed by patch.
func packed(query func(uint16) []byte, patch func([]byte) []byte) func(id uint16) []byte {
	return func(id uint16) []byte { return patch(query(id)) }
}

// edns adds an OPT record with a payload size of size, then applies the edits to it.
func edns(size uint16, edits ...func(*dns.OPT)) func(*dns.Msg) {
	return func(m *dns.Msg) {
		o := &dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT}}
		o.SetUDPSize(size)
		for _, edit := range edits {
			edit(o)
		}
		m.Extra = append(m.Extra, o)
	}
}

func option(o dns.EDNS0) func(*dns.OPT) {
	return func(opt *dns.OPT) { opt.Option = append(opt.Option, o) }
}

// padTo pads the query with an EDNS padding option to total bytes.
func padTo(total int) func(*dns.Msg) {
	return func(m *dns.Msg) {
		b, _ := m.Pack()
		pad := total - len(b) - 4 // the option's code and length
		if m.IsEdns0() == nil {
			pad -= 11 // the OPT record itself
			m.SetEdns0(1232, false)
		}
		o := m.IsEdns0()
		o.Option = append(o.Option, &dns.EDNS0_PADDING{Padding: make([]byte, max(pad, 0))})
	}
}
