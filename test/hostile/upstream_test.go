//go:build linux

package hostile

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/test/simnode"
)

// brokenZone is where brokenUpstream breaks replies: the first label of a name under it says how.
const brokenZone = ".broken.default.svc.cluster.local."

// Ways brokenUpstream breaks the reply to a name <kind>.broken.default.svc.cluster.local.
var brokenKinds = []string{
	"garbage",   // the query's ID, then 40 bytes of noise
	"wrongid",   // the right reply with another ID
	"truncated", // the right reply cut in the middle, framed (over TCP) with the cut length
	"tc",        // the right reply with TC set and its records gone
	"otherq",    // the right reply to another question
	"empty",     // a zero-length message
	"notqr",     // the right reply with its QR bit clear, as if it were a query
	"cut",       // over TCP the length of the right reply, half of it, and the connection closed
}

// brokenUpstream stands where the cluster DNS Pod is (ClusterDNSPodIP:53, UDP and TCP, so behind both
// kube-dns and kube-dns-upstream) and relays every message, as it came, to the cluster DNS's CoreDNS on
// backendAddr in the same namespace, and its reply back; for the names under brokenZone it breaks the reply
// as the name's first label says. Over TCP it answers a connection's queries concurrently, in the order
// their replies come, as RFC 7766 allows.
//
// It keeps its connections to the cluster DNS's CoreDNS between queries: a connection opened for each query
// (a hop to the goroutine that dials in the DNS namespace, a handshake, a close) is work no cluster DNS
// does, on the cores the benchmark's Pods and the cache share.
type brokenUpstream struct {
	open   func() (net.Conn, error)
	kept   chan net.Conn // connections to the cluster DNS's CoreDNS, idle, for the next query
	broken sync.Map      // kind -> *atomic.Int64, the replies broken so
	asked  sync.Map      // question name, in lower case -> *atomic.Int64, the queries relayed for it
}

// keptConns is how many idle connections to the cluster DNS's CoreDNS brokenUpstream keeps; more in use at
// once are closed after their query.
const keptConns = 64

func startBrokenUpstream(tb testing.TB, n *simnode.Node) *brokenUpstream {
	tb.Helper()
	addr := net.JoinHostPort(simnode.ClusterDNSPodIP, "53")
	var udp net.PacketConn
	var tcp net.Listener
	err := n.Do(n.DNSNS, func() (err error) {
		if udp, err = net.ListenPacket("udp", addr); err != nil {
			return err
		}
		tcp, err = net.Listen("tcp", addr)
		return err
	})
	if err != nil {
		tb.Fatalf("the cluster DNS's relay: %v", err)
	}
	open, stop := simnode.OpenerIn(n, n.DNSNS, func() (net.Conn, error) {
		return net.DialTimeout("tcp", backendAddr, 2*time.Second)
	})
	u := &brokenUpstream{open: open, kept: make(chan net.Conn, keptConns)}
	var wg sync.WaitGroup
	wg.Go(func() { u.serveUDP(udp) })
	wg.Go(func() { u.serveTCP(tcp, &wg) })
	tb.Cleanup(func() {
		udp.Close()
		tcp.Close()
		wg.Wait()
		stop()
		for {
			select {
			case c := <-u.kept:
				c.Close()
			default:
				return
			}
		}
	})
	return u
}

// askedFor returns how many queries for name (in any case) the relay passed on or answered.
func (u *brokenUpstream) askedFor(name string) int64 {
	v, ok := u.asked.Load(strings.ToLower(name))
	if !ok {
		return 0
	}
	return v.(*atomic.Int64).Load()
}

// count returns how many replies were broken as kind.
func (u *brokenUpstream) count(kind string) int64 {
	v, ok := u.broken.Load(kind)
	if !ok {
		return 0
	}
	return v.(*atomic.Int64).Load()
}

func (u *brokenUpstream) serveUDP(c net.PacketConn) {
	buf := make([]byte, 65535)
	for {
		n, from, err := c.ReadFrom(buf)
		if err != nil {
			return
		}
		query := append([]byte(nil), buf[:n]...)
		go func() {
			reply, _ := u.reply(query, false)
			if reply != nil {
				_, _ = c.WriteTo(reply, from)
			}
		}()
	}
}

func (u *brokenUpstream) serveTCP(l net.Listener, wg *sync.WaitGroup) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		wg.Go(func() { u.serveConn(c) })
	}
}

// serveConn answers one TCP connection's queries, each as soon as its reply is there.
func (u *brokenUpstream) serveConn(c net.Conn) {
	defer c.Close()
	var mu sync.Mutex // one reply written at a time
	var replies sync.WaitGroup
	defer replies.Wait()
	for {
		query, err := readFramed(c)
		if err != nil {
			return
		}
		replies.Go(func() {
			reply, cut := u.reply(query, true)
			if reply == nil {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if cut {
				var prefix [2]byte
				binary.BigEndian.PutUint16(prefix[:], uint16(len(reply)))
				_, _ = c.Write(append(prefix[:], reply[:len(reply)/2]...))
				c.Close()
				return
			}
			_ = writeFramed(c, reply)
		})
	}
}

// reply is the reply to query: the cluster DNS's, broken when the query names a name under brokenZone.
// With cut, the caller sends half of it and closes the connection. It is nil when there is no reply.
//
// A NOTIFY (which the caches pass on as CoreDNS does) is answered NOTIMP at once: CoreDNS's file plugin drops
// it, and the caches' answer would then be a SERVFAIL once their upstream timeouts ran out, which a
// comparison of answers within a client's timeout cannot tell from no answer.
func (u *brokenUpstream) reply(query []byte, tcp bool) (reply []byte, cut bool) {
	q := new(dns.Msg)
	parsed := q.Unpack(query) == nil
	if parsed && len(q.Question) > 0 {
		name := strings.ToLower(q.Question[0].Name)
		n, ok := u.asked.Load(name)
		if !ok {
			n, _ = u.asked.LoadOrStore(name, new(atomic.Int64))
		}
		n.(*atomic.Int64).Add(1)
	}
	if parsed && q.Opcode == dns.OpcodeNotify {
		m := new(dns.Msg)
		m.SetRcode(q, dns.RcodeNotImplemented)
		b, err := m.Pack()
		if err != nil {
			return nil, false
		}
		return b, false
	}
	reply, err := u.ask(query)
	if err != nil {
		return nil, false
	}
	if !parsed || len(q.Question) != 1 {
		return reply, false
	}
	name := strings.ToLower(q.Question[0].Name)
	if !strings.HasSuffix(name, brokenZone) {
		return reply, false
	}
	kind := strings.TrimSuffix(name, brokenZone)
	counter, _ := u.broken.LoadOrStore(kind, new(atomic.Int64))
	counter.(*atomic.Int64).Add(1)
	m := new(dns.Msg)
	if m.Unpack(reply) != nil {
		return reply, false
	}
	switch kind {
	case "garbage":
		noise := make([]byte, 42)
		copy(noise, query[:2])
		for i := 2; i < len(noise); i++ {
			noise[i] = byte(i*37 + 11)
		}
		return noise, false
	case "wrongid":
		m.Id ^= 0x8000
	case "truncated":
		return reply[:12+(len(reply)-12)/2], false
	case "tc":
		m.Truncated = true
		m.Answer, m.Ns, m.Extra = nil, nil, nil
	case "otherq":
		m.Question[0].Name = "kubernetes.default.svc.cluster.local."
	case "empty":
		return []byte{}, false
	case "notqr":
		m.Response = false
	case "cut":
		return reply, tcp
	}
	b, err := m.Pack()
	if err != nil {
		return nil, false
	}
	return b, false
}

// ask relays query to the cluster DNS's CoreDNS over TCP and returns its reply as it came: on a kept
// connection when there is one, and on a new one if there is none or the kept one fails (CoreDNS closes a
// connection that has been idle for a few seconds).
func (u *brokenUpstream) ask(query []byte) ([]byte, error) {
	select {
	case c := <-u.kept:
		if reply, err := u.exchange(c, query); err == nil {
			return reply, nil
		}
	default:
	}
	c, err := u.open()
	if err != nil {
		return nil, err
	}
	return u.exchange(c, query)
}

// exchange writes query to c, a connection to the cluster DNS's CoreDNS, and reads its reply, within 5 s; it
// keeps c for the next query if it answered, and closes it otherwise.
func (u *brokenUpstream) exchange(c net.Conn, query []byte) ([]byte, error) {
	reply, err := func() ([]byte, error) {
		if err := c.SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
			return nil, err
		}
		if err := writeFramed(c, query); err != nil {
			return nil, err
		}
		return readFramed(c)
	}()
	if err != nil {
		c.Close()
		return nil, err
	}
	select {
	case u.kept <- c:
	default:
		c.Close()
	}
	return reply, nil
}

// readFramed reads one DNS message from a TCP stream: its two-byte length, then the message.
func readFramed(r io.Reader) ([]byte, error) {
	var prefix [2]byte
	if _, err := io.ReadFull(r, prefix[:]); err != nil {
		return nil, err
	}
	m := make([]byte, binary.BigEndian.Uint16(prefix[:]))
	if _, err := io.ReadFull(r, m); err != nil {
		return nil, err
	}
	return m, nil
}

// writeFramed writes m to a TCP stream with its two-byte length, in one write.
func writeFramed(w io.Writer, m []byte) error {
	if len(m) > 65535 {
		return errors.New("message longer than 65535 bytes")
	}
	b := make([]byte, 2+len(m))
	binary.BigEndian.PutUint16(b, uint16(len(m)))
	copy(b[2:], m)
	_, err := w.Write(b)
	return err
}
