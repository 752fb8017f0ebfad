package simnode

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// Load is a Pod-side DNS client that sends lookups at a steady rate and accounts for every one of them, as a
// Pod's resolver would see it: each lookup is one UDP query with its own timeout, answered or lost.
type Load struct {
	// Server is where the lookups go, ip:port.
	Server string
	// Name is the question (type A); it should have an answer wherever the lookups may land.
	Name string
	// Rate is the lookups per second; Duration how long they are sent for (at least, with Until), Timeout
	// what each waits.
	Rate     int
	Duration time.Duration
	Timeout  time.Duration
	// Until, when not nil, keeps the load going after Duration until it is closed.
	Until <-chan struct{}
	// Workers is how many lookups may wait at once; each worker takes a fresh socket (a fresh source
	// port, as a resolver does) every SocketReuse lookups.
	Workers     int
	SocketReuse int
}

// LoadResult counts what happened to the lookups.
type LoadResult struct {
	// Sent lookups were each answered, or failed: timed out, refused (ICMP), or answered with an rcode
	// other than NOERROR.
	Sent, Answered int
	TimedOut       int
	Refused        int
	BadRcode       int
	// Failures are the times, since the start, of the failed lookups.
	Failures []time.Duration
	// Elapsed is how long sending took; Rate the lookups per second achieved.
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
		s += fmt.Sprintf(", failures from %v to %v", r.Failures[0].Round(time.Millisecond), r.Failures[len(r.Failures)-1].Round(time.Millisecond))
	}
	return s
}

// RunLoad sends l's lookups from namespace ns until l.Duration has passed or ctx ends (the lookups due
// until then are sent), and returns the
// count once every lookup sent was answered or timed out. A test runs it in a goroutine of its own and
// replaces the cache meanwhile.
func (n *Node) RunLoad(ctx context.Context, ns string, l Load) (LoadResult, error) {
	if l.Rate <= 0 || l.Duration <= 0 || l.Timeout <= 0 || l.Workers <= 0 {
		return LoadResult{}, errors.New("load: rate, duration, timeout and workers must be positive")
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

	// Sockets are made by one goroutine that lives in ns; the workers use them from anywhere.
	dial := make(chan chan dialResult)
	dialerDone := make(chan error, 1)
	dialCtx, stopDialer := context.WithCancel(context.Background())
	defer stopDialer()
	go func() {
		dialerDone <- n.Do(ns, func() error {
			for {
				select {
				case <-dialCtx.Done():
					return nil
				case reply := <-dial:
					c, err := net.Dial("udp", l.Server)
					if err != nil {
						reply <- dialResult{err: err}
						continue
					}
					reply <- dialResult{conn: c.(*net.UDPConn)}
				}
			}
		})
	}()
	newConn := func() (*net.UDPConn, error) {
		reply := make(chan dialResult, 1)
		select {
		case dial <- reply:
		case err := <-dialerDone:
			return nil, fmt.Errorf("load: the socket maker in %s ended: %v", ns, err)
		}
		r := <-reply
		return r.conn, r.err
	}

	// The pacer hands out one token per lookup at l.Rate, in batches, so that a busy machine that wakes it
	// late still sends the lookups that were due; a worker takes a token and makes one lookup.
	tokens := make(chan time.Duration, l.Rate)
	start := time.Now()
	go func() {
		defer close(tokens)
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		minimum := int64(float64(l.Rate) * l.Duration.Seconds())
		until := l.Until
		for issued := int64(0); ; {
			stop := false
			select {
			case <-ctx.Done():
				stop = true // after the lookups due until now
			case <-until:
				until = nil // closed: the minimum alone counts from now on
			case <-t.C:
			}
			due := int64(time.Since(start).Seconds() * float64(l.Rate))
			if until == nil {
				due = min(due, minimum)
			}
			for ; issued < due; issued++ {
				tokens <- time.Since(start)
			}
			if stop || (until == nil && issued >= minimum) {
				return
			}
		}
	}()

	var (
		mu     sync.Mutex
		res    LoadResult
		wg     sync.WaitGroup
		werrMu sync.Mutex
		werr   error
	)
	for w := range l.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 1500)
			msg := slices.Clone(query)
			var conn *net.UDPConn
			used := 0
			id := uint16(w) << 8
			defer func() {
				if conn != nil {
					conn.Close()
				}
			}()
			for at := range tokens {
				if conn == nil || used >= l.SocketReuse {
					if conn != nil {
						conn.Close()
					}
					c, err := newConn()
					if err != nil {
						werrMu.Lock()
						werr = errors.Join(werr, err)
						werrMu.Unlock()
						return
					}
					conn, used = c, 0
				}
				used++
				id++
				msg[0], msg[1] = byte(id>>8), byte(id)
				outcome := lookup(conn, msg, buf, id, l.Timeout)
				mu.Lock()
				res.Sent++
				switch outcome {
				case answered:
					res.Answered++
				case timedOut:
					res.TimedOut++
				case refused:
					res.Refused++
				case badRcode:
					res.BadRcode++
				}
				if outcome != answered {
					res.Failures = append(res.Failures, at)
				}
				mu.Unlock()
				if outcome == refused || outcome == timedOut {
					// A refused socket stays in error; a late answer would confuse the next lookup.
					conn.Close()
					conn = nil
				}
			}
		}()
	}
	wg.Wait()
	res.Elapsed = time.Since(start)
	stopDialer()
	if werr != nil {
		return res, werr
	}
	slices.Sort(res.Failures)
	return res, nil
}

type dialResult struct {
	conn *net.UDPConn
	err  error
}

type outcome int

const (
	answered outcome = iota
	timedOut
	refused
	badRcode
)

// lookup sends msg on conn and waits up to timeout for the response with id, skipping anything else.
func lookup(conn *net.UDPConn, msg, buf []byte, id uint16, timeout time.Duration) outcome {
	deadline := time.Now().Add(timeout)
	if err := conn.SetDeadline(deadline); err != nil {
		return refused
	}
	if _, err := conn.Write(msg); err != nil {
		return refused
	}
	for {
		n, err := conn.Read(buf)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return timedOut
			}
			return refused
		}
		if n < 12 || uint16(buf[0])<<8|uint16(buf[1]) != id || buf[2]&0x80 == 0 {
			continue // not the response to this lookup
		}
		if rcode := buf[3] & 0x0f; rcode != dns.RcodeSuccess {
			return badRcode
		}
		return answered
	}
}
