//go:build linux

package simnode

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"time"
	"unsafe"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// Load is a Pod-side DNS client that sends lookups at a steady rate and accounts for every one of them, as a
// Pod's resolvers would see them: each lookup is one UDP query with its own timeout, answered or lost. It
// keeps sending at the rate whatever happens to earlier lookups, as a Pod's many clients do.
type Load struct {
	// Server is where the lookups go, ip:port.
	Server string
	// Name is the question (type A); it should have an answer wherever the lookups may land.
	Name string
	// Rate is the lookups per second; Duration how long they are sent for (at least, with Until); Timeout
	// what each waits for its answer.
	Rate     int
	Duration time.Duration
	Timeout  time.Duration
	// Until, when not nil, keeps the load going after Duration until it is closed.
	Until <-chan struct{}
	// Sockets is how many sockets send at once; each sends SocketReuse lookups and is then replaced by a
	// fresh one (a fresh source port, as resolvers take), and closed once its lookups are settled.
	Sockets     int
	SocketReuse int
}

// LoadResult counts what happened to the lookups.
type LoadResult struct {
	// Sent lookups were each answered (NOERROR), or failed: timed out, refused (the send failed after an
	// ICMP error), or answered with another rcode.
	Sent, Answered int
	TimedOut       int
	Refused        int
	BadRcode       int
	// Failures are the times, since the start, at which the failed lookups were sent.
	Failures []time.Duration
	// Elapsed is how long sending took.
	Elapsed time.Duration
}

// Failed is the number of lookups that got no good answer.
func (r LoadResult) Failed() int { return r.TimedOut + r.Refused + r.BadRcode }

// Rate is the lookups sent per second.
func (r LoadResult) Rate() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Sent) / r.Elapsed.Seconds()
}

func (r LoadResult) String() string {
	s := fmt.Sprintf("%d lookups in %v (%.0f/s): %d answered, %d timed out, %d refused, %d bad rcode",
		r.Sent, r.Elapsed.Round(time.Millisecond), r.Rate(), r.Answered, r.TimedOut, r.Refused, r.BadRcode)
	if len(r.Failures) > 0 {
		s += fmt.Sprintf(", failures sent from %v to %v", r.Failures[0].Round(time.Millisecond), r.Failures[len(r.Failures)-1].Round(time.Millisecond))
	}
	return s
}

// loadSocket is one socket of a load and its lookups that wait for an answer.
type loadSocket struct {
	conn    *net.UDPConn
	nextID  uint16
	used    int
	pending map[uint16]time.Time // query ID: when it was sent
}

// RunLoad sends l's lookups from namespace ns until l.Duration has passed (and l.Until is closed) or ctx
// ends, the lookups due until then included, and returns the count once every lookup sent was answered
// or timed out. A test runs it in a goroutine of its own and replaces the cache meanwhile.
func (n *Node) RunLoad(ctx context.Context, ns string, l Load) (LoadResult, error) {
	if l.Rate <= 0 || l.Duration <= 0 || l.Timeout <= 0 || l.Sockets <= 0 {
		return LoadResult{}, errors.New("load: rate, duration, timeout and sockets must be positive")
	}
	if l.SocketReuse <= 0 {
		l.SocketReuse = 1
	}
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(l.Name), dns.TypeA)
	q.RecursionDesired = true
	query, err := q.Pack()
	if err != nil {
		return LoadResult{}, fmt.Errorf("load: pack the query: %w", err)
	}

	// Sockets are made by one goroutine that lives in ns; they are used from anywhere.
	newConn, stopDialer := dialerIn(n, ns, func() (*net.UDPConn, error) {
		c, err := net.Dial("udp", l.Server)
		if err != nil {
			return nil, err
		}
		if err := stampArrivals(c.(*net.UDPConn)); err != nil {
			c.Close()
			return nil, err
		}
		return c.(*net.UDPConn), nil
	})
	defer stopDialer()

	var (
		mu      sync.Mutex
		res     LoadResult
		readers sync.WaitGroup
	)
	start := time.Now()
	// settle records the outcome of a lookup sent at sentAt; mu is held.
	settle := res.record
	read := func(s *loadSocket) {
		defer readers.Done()
		buf := make([]byte, 1500)
		oob := make([]byte, 128)
		for {
			nr, noob, _, _, err := s.conn.ReadMsgUDP(buf, oob)
			if errors.Is(err, net.ErrClosed) {
				return
			}
			if err != nil || nr < 12 || buf[2]&0x80 == 0 {
				continue // an ICMP error, or not a response: the lookup it belongs to times out
			}
			// When the kernel got the answer, not when this busy test got round to reading it.
			arrived, ok := arrival(oob[:noob])
			if !ok {
				arrived = time.Now()
			}
			id := uint16(buf[0])<<8 | uint16(buf[1])
			mu.Lock()
			sent, ok := s.pending[id]
			if ok {
				delete(s.pending, id)
				sentAt := sent.Sub(start)
				// An answer after the timeout is a lost lookup: the client gave up on it.
				switch {
				case arrived.Sub(sent) > l.Timeout:
					settle(sentAt, timedOut)
				case buf[3]&0x0f != dns.RcodeSuccess:
					settle(sentAt, badRcode)
				default:
					settle(sentAt, answered)
				}
			}
			mu.Unlock()
		}
	}
	open := func() (*loadSocket, error) {
		c, err := newConn()
		if err != nil {
			return nil, err
		}
		s := &loadSocket{conn: c, pending: map[uint16]time.Time{}}
		readers.Add(1)
		go read(s)
		return s, nil
	}

	pool := make([]*loadSocket, l.Sockets)
	var retired []*loadSocket
	for i := range pool {
		if pool[i], err = open(); err != nil {
			return res, fmt.Errorf("load: %w", err)
		}
	}
	// sweep times out what waited too long and closes retired sockets with nothing pending; mu is held.
	// A lookup counts as timed out only once its answer could not have arrived in time and still be
	// unread: the readers may be late, the kernel's timestamps are not.
	sweep := func(now time.Time, all []*loadSocket) {
		for _, s := range all {
			for id, sent := range s.pending {
				if now.Sub(sent) > l.Timeout+readGrace {
					delete(s.pending, id)
					settle(sent.Sub(start), timedOut)
				}
			}
		}
		retired = slices.DeleteFunc(retired, func(s *loadSocket) bool {
			if len(s.pending) > 0 {
				return false
			}
			s.conn.Close()
			return true
		})
	}

	minimum := int64(float64(l.Rate) * l.Duration.Seconds())
	until := l.Until
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	msg := slices.Clone(query)
	next := 0
	var sendErr error
	for issued := int64(0); ; {
		stop := false
		select {
		case <-ctx.Done():
			stop = true // after the lookups due until now
		case <-until:
			until = nil
		case <-tick.C:
		}
		elapsed := time.Since(start)
		due := int64(elapsed.Seconds() * float64(l.Rate))
		if until == nil {
			due = min(due, minimum)
		}
		mu.Lock()
		for ; issued < due && sendErr == nil; issued++ {
			s := pool[next]
			if s.used >= l.SocketReuse {
				retired = append(retired, s)
				mu.Unlock()
				fresh, err := open()
				mu.Lock()
				if err != nil {
					sendErr = err
					break
				}
				pool[next], s = fresh, fresh
			}
			next = (next + 1) % len(pool)
			s.used++
			s.nextID++
			id := s.nextID
			msg[0], msg[1] = byte(id>>8), byte(id)
			sent := time.Now()
			s.pending[id] = sent
			res.Sent++
			if _, err := s.conn.Write(msg); err != nil {
				// Refused at once (an ICMP error from an earlier lookup): the lookup fails now.
				delete(s.pending, id)
				settle(sent.Sub(start), refused)
			}
		}
		sweep(time.Now(), append(slices.Clone(pool), retired...))
		mu.Unlock()
		if sendErr != nil || stop || (until == nil && issued >= minimum) {
			break
		}
	}
	res.Elapsed = time.Since(start)

	// Every lookup sent is answered or times out; then the sockets close.
	for {
		mu.Lock()
		waiting := 0
		for _, s := range append(slices.Clone(pool), retired...) {
			waiting += len(s.pending)
		}
		sweep(time.Now(), append(slices.Clone(pool), retired...))
		mu.Unlock()
		if waiting == 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	for _, s := range append(slices.Clone(pool), retired...) {
		s.conn.Close()
	}
	mu.Unlock()
	readers.Wait()
	stopDialer()
	slices.Sort(res.Failures)
	if sendErr != nil {
		return res, fmt.Errorf("load: %w", sendErr)
	}
	return res, nil
}

// dialerIn opens connections with dial in namespace ns, on one goroutine that lives there, for callers
// anywhere: open asks it for one, and fails once the goroutine has ended; stop ends it.
func dialerIn[C any](n *Node, ns string, dial func() (C, error)) (open func() (C, error), stop func()) {
	type dialed struct {
		conn C
		err  error
	}
	requests := make(chan chan dialed)
	ctx, cancel := context.WithCancel(context.Background())
	ended := make(chan struct{})
	var endErr error
	go func() {
		defer close(ended)
		endErr = n.Do(ns, func() error {
			for {
				select {
				case <-ctx.Done():
					return nil
				case reply := <-requests:
					c, err := dial()
					reply <- dialed{c, err}
				}
			}
		})
	}()
	open = func() (C, error) {
		reply := make(chan dialed, 1)
		select {
		case requests <- reply:
		case <-ended:
			var zero C
			return zero, fmt.Errorf("load: the socket maker in %s ended: %v", ns, endErr)
		}
		d := <-reply
		return d.conn, d.err
	}
	return open, cancel
}

type outcome int

// record counts the outcome of a lookup sent at sentAt, since the start of the load.
func (r *LoadResult) record(sentAt time.Duration, o outcome) {
	switch o {
	case answered:
		r.Answered++
		return
	case timedOut:
		r.TimedOut++
	case refused:
		r.Refused++
	case badRcode:
		r.BadRcode++
	}
	r.Failures = append(r.Failures, sentAt)
}

const (
	answered outcome = iota
	timedOut
	refused
	badRcode
)

// readGrace is how long past a lookup's timeout its answer may still sit unread in the socket.
const readGrace = 2 * time.Second

// stampArrivals makes the kernel note when each datagram arrived (SO_TIMESTAMPNS).
func stampArrivals(c *net.UDPConn) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1)
	}); err != nil {
		return err
	}
	return serr
}

// arrival reads the kernel's arrival time from a datagram's control messages.
func arrival(oob []byte) (time.Time, bool) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return time.Time{}, false
	}
	for _, m := range msgs {
		if m.Header.Level == unix.SOL_SOCKET && m.Header.Type == unix.SCM_TIMESTAMPNS && len(m.Data) >= int(unsafe.Sizeof(unix.Timespec{})) {
			ts := (*unix.Timespec)(unsafe.Pointer(&m.Data[0]))
			return time.Unix(ts.Sec, ts.Nsec), true
		}
	}
	return time.Time{}, false
}
