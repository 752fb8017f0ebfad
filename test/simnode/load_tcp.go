//go:build linux

package simnode

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// RunTCPLoad is RunLoad over TCP: each lookup opens a connection of its own (as a resolver falling back to
// TCP does), sends the query, reads the answer within l.Timeout and closes. A connection refused or reset,
// or an answer not read in time, is a lost lookup. l.Sockets bounds the lookups in flight; SocketReuse is
// not used.
func (n *Node) RunTCPLoad(ctx context.Context, ns string, l Load) (LoadResult, error) {
	if l.Rate <= 0 || l.Duration <= 0 || l.Timeout <= 0 || l.Sockets <= 0 {
		return LoadResult{}, errors.New("tcp load: rate, duration, timeout and sockets must be positive")
	}
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(l.Name), dns.TypeA)
	q.RecursionDesired = true
	query, err := q.Pack()
	if err != nil {
		return LoadResult{}, fmt.Errorf("tcp load: pack the query: %w", err)
	}
	framed := binary.BigEndian.AppendUint16(nil, uint16(len(query)))
	framed = append(framed, query...)

	// Connections are opened by one goroutine that lives in ns; they are used from anywhere.
	d := net.Dialer{Timeout: l.Timeout}
	open, stopDialer := dialerIn(n, ns, func() (net.Conn, error) { return d.Dial("tcp", l.Server) })
	defer stopDialer()

	var (
		mu       sync.Mutex
		res      LoadResult
		inflight sync.WaitGroup
	)
	slots := make(chan struct{}, l.Sockets)
	start := time.Now()
	lookup := func(sent time.Time) outcome {
		conn, err := open()
		if err != nil {
			return refused
		}
		defer conn.Close()
		_ = conn.SetDeadline(sent.Add(l.Timeout))
		if _, err := conn.Write(framed); err != nil {
			return refused
		}
		var size [2]byte
		if _, err := io.ReadFull(conn, size[:]); err != nil {
			return timedOut
		}
		buf := make([]byte, binary.BigEndian.Uint16(size[:]))
		if _, err := io.ReadFull(conn, buf); err != nil || len(buf) < 12 || buf[0] != query[0] || buf[1] != query[1] {
			return timedOut
		}
		if buf[3]&0x0f != dns.RcodeSuccess {
			return badRcode
		}
		return answered
	}

	minimum := int64(float64(l.Rate) * l.Duration.Seconds())
	until := l.Until
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for issued := int64(0); ; {
		stop := false
		select {
		case <-ctx.Done():
			stop = true
		case <-until:
			until = nil
		case <-tick.C:
		}
		due := int64(time.Since(start).Seconds() * float64(l.Rate))
		if until == nil {
			due = min(due, minimum)
		}
		for ; issued < due; issued++ {
			slots <- struct{}{}
			sent := time.Now()
			mu.Lock()
			res.Sent++
			mu.Unlock()
			inflight.Go(func() {
				defer func() { <-slots }()
				o := lookup(sent)
				mu.Lock()
				defer mu.Unlock()
				res.record(sent.Sub(start), o)
			})
		}
		if stop || (until == nil && issued >= minimum) {
			break
		}
	}
	res.Elapsed = time.Since(start)
	inflight.Wait()
	stopDialer()
	slices.Sort(res.Failures)
	return res, nil
}
