//go:build linux

package wirecache

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/nodelocaldns/nodelocaldns/nodelocal"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
)

// How the fast path keeps its address's reuseport groups steered to its sockets, and yields them.

// groupSocket is a socket of the fast path in one of its address's reuseport groups: the UDP socket its
// readers read, or the TCP listener of its tcpFront. keepSteered points each group at its socket, and keeps
// here what it learnt of the group.
type groupSocket struct {
	network string // "UDP" or "TCP"
	what    string // what the group sends the socket, for the log
	fd      int
	group   func() ([]nodelocal.ReuseportSocket, error)
	steerTo func(index uint32) error
	unsteer func() error
	// probe sends a probe to the address and reports whether it landed on this socket.
	probe func(ctx context.Context) (landed bool, err error)
	gauge prometheus.Gauge
	// steeredTo runs at each look that finds the group steered to the socket; nil for none.
	steeredTo func()

	steered, yielded bool
	lastGroup        string
	lastErr          string
}

// udpSocket returns the fast path's UDP socket as keepSteered steers it.
func (fp *fastPath) udpSocket() *groupSocket {
	return &groupSocket{
		network: "UDP", what: "UDP queries", fd: fp.fd,
		group:   func() ([]nodelocal.ReuseportSocket, error) { return nodelocal.UDPGroup(fp.local) },
		steerTo: func(index uint32) error { return nodelocal.SteerUDPGroup(fp.local, index) },
		unsteer: func() error { return nodelocal.UnsteerUDPGroup(fp.local) },
		probe:   fp.probeOnce,
		gauge:   fp.steered,
		// CoreDNS's own socket of the group gets nothing now: its read loop need not wake.
		steeredTo: fp.quietCoreDNS,
	}
}

// keepSteered steers each of the address's groups (UDP, and TCP with a tcpFront) to the fast path's socket
// in it, and checks who is in the groups whenever this process hears that they may have changed
// (nodelocal.ReuseportChanges: a successor queued or left, a takeover began or ended) and besides:
// steerCheck after a change, the wait doubling up to steerCheckMax while the groups stay as they were (each
// look put off to the clock's next multiple of steerCheck: untilLook), so
// that an idle node wakes it seldom (a group that changed unheard of, a stray process joining, leaves
// packets and connections to CoreDNS's own sockets, which answer them, until the next look). While this
// process takes the address over from an older one (nodelocal.UDPGroupTakenOver) it leaves the groups
// alone: the takeover owns the UDP group's program, and the older process's listeners are still in the TCP
// group. While another process has sockets in a group (a successor that must prove it answers, then takes
// the node over and steers the group itself), or a successor is queued at the node lock and about to join
// (nodelocal.SuccessorQueued), the fast path gives the group back to the kernel's hash once, if it was
// steered to the fast path, and leaves it alone. Otherwise it steers again, checking with a probe that
// packets come to it, when the group changed; a look at a group as it was is a read of its sockets and
// nothing else.
func (fp *fastPath) keepSteered(ctx context.Context) {
	defer close(fp.steerDone)
	changes, unsubscribe := nodelocal.ReuseportChanges()
	defer unsubscribe()
	t := time.NewTimer(steerCheck)
	defer t.Stop()
	// retry is the wait before the next look after a round that could not finish (a probe that got no
	// answer, a steering that failed): a second, doubling up to steerCheck. idle is the wait after one that
	// did: steerCheck after a change, doubling while the groups stay as they were, up to steerCheckMax.
	retry, idle := time.Duration(0), steerCheck
	checked := ""
	defer func() {
		for _, s := range fp.socks {
			fp.setSteered(s, false)
		}
	}()
	for {
		failed := false
		for _, s := range fp.socks {
			if !fp.lookAt(ctx, s) {
				failed = true
			}
			if ctx.Err() != nil {
				return
			}
		}
		seen := groupsSeen(fp.socks)
		if failed {
			retry = min(max(2*retry, time.Second), steerCheck)
			idle = steerCheck
			t.Reset(retry)
		} else {
			retry = 0
			if seen != checked {
				idle = steerCheck
			}
			t.Reset(untilLook(time.Now(), idle))
			idle = min(2*idle, steerCheckMax)
		}
		checked = seen
		select {
		case <-ctx.Done():
			return
		case <-changes:
			idle = steerCheck
		case <-t.C:
		}
	}
}

// untilLook is the wait from now until the next look, wait from now put off to the next whole multiple of
// steerCheck on the clock: the fast paths of a process (one per address) start at their first queries and
// double their waits from there, and so aligned their looks fall in the same wake-up of an idle process.
func untilLook(now time.Time, wait time.Duration) time.Duration {
	at := now.Add(wait)
	if aligned := at.Truncate(steerCheck); !aligned.Equal(at) {
		at = aligned.Add(steerCheck)
	}
	// Truncate reads the wall clock, which can be set: the wait stays between wait and wait+steerCheck.
	return min(max(at.Sub(now), wait), wait+steerCheck)
}

// groupsSeen names the groups of socks as keepSteered last steered them.
func groupsSeen(socks []*groupSocket) string {
	var b strings.Builder
	for _, s := range socks {
		b.WriteString(s.lastGroup)
		b.WriteByte(';')
	}
	return b.String()
}

// lookAt reads who is in the group of s and steers it, or yields it, as keepSteered says; it reports
// whether the round finished.
func (fp *fastPath) lookAt(ctx context.Context, s *groupSocket) bool {
	group, err := s.group()
	switch {
	case err != nil:
		if msg := err.Error(); msg != s.lastErr {
			log.Warningf("fast path on %s: reading the %s sockets bound to %s: %v", fp.srv.Addr, s.network, fp.local, err)
			s.lastErr = msg
		}
		return false
	case nodelocal.UDPGroupTakenOver(fp.local):
		// This process takes the address over from an older one: the takeover owns the UDP group's
		// program until the older sockets are gone (see nodelocal.Succession's takeover).
		fp.setSteered(s, false)
	case nodelocal.OthersInGroup(group) > 0 || nodelocal.SuccessorQueued():
		if s.yielded {
			break
		}
		// Only a group steered to this socket is given back: a program another process attached is
		// that process's business.
		landed, err := s.probe(ctx)
		if err != nil {
			return false // asked again soon
		}
		fp.setSteered(s, false)
		s.yielded = true
		if !landed {
			log.Infof("fast path on %s: another process listens on the address too; its %s group is left to it", fp.srv.Addr, s.network)
			break
		}
		if err := s.unsteer(); err != nil {
			log.Warningf("fast path on %s: %v", fp.srv.Addr, err)
		}
		log.Infof("fast path on %s: another process listens on the address too; its %s are spread by the kernel's hash and the group is left to that process", fp.srv.Addr, s.what)
	default:
		s.yielded = false
		// A group of the same sockets as at the last steering, all this process's, sends packets where
		// they went then: only a socket in the group can attach a program to it, and the kernel moves a
		// socket's index only when one leaves. So only a changed group is steered and probed again.
		if sig := groupSignature(group); sig != s.lastGroup || !s.steered {
			err := fp.steer(ctx, s, group, true)
			if ctx.Err() != nil {
				return false
			}
			s.lastGroup = sig
			fp.setSteered(s, err == nil)
			if err != nil {
				if msg := err.Error(); msg != s.lastErr {
					log.Infof("fast path on %s: %v; CoreDNS's own socket takes the %s meanwhile", fp.srv.Addr, err, s.what)
					s.lastErr = msg
				}
				return false
			}
			s.lastErr = ""
		}
		if s.steered && s.steeredTo != nil {
			s.steeredTo()
		}
	}
	return true
}

// setSteered notes whether the group of s is steered to it.
func (fp *fastPath) setSteered(s *groupSocket, now bool) {
	if now == s.steered {
		return
	}
	s.steered = now
	if s.steered {
		s.gauge.Inc()
		log.Infof("fast path on %s: the address's %s come to it", fp.srv.Addr, s.what)
	} else {
		s.gauge.Dec()
	}
}

// groupSignature names the sockets of a group, in any order.
func groupSignature(group []nodelocal.ReuseportSocket) string {
	inodes := make([]uint64, len(group))
	for i, s := range group {
		inodes[i] = s.Inode
	}
	slices.Sort(inodes)
	return fmt.Sprint(inodes)
}

// steer points the group of s at s (toUs) or at another socket of this process, and checks with a probe
// that packets land there. group is the group's sockets, all this process's: another process's group is
// not this one's to steer. Socket indexes move as sockets leave, so each index is tried until a probe lands
// where it should; a probe without an answer ends the try.
func (fp *fastPath) steer(ctx context.Context, s *groupSocket, group []nodelocal.ReuseportSocket, toUs bool) error {
	if !slices.ContainsFunc(group, func(m nodelocal.ReuseportSocket) bool { return m.FD == s.fd }) {
		return fmt.Errorf("the fast path's %s socket is no longer bound to %s", s.network, fp.local)
	}
	n := len(group)
	if n < 2 {
		return nil // nobody to share with, nothing to steer
	}
	order := make([]uint32, 0, n)
	order = append(order, uint32(n-1)) // the socket that joined last: ours, unless one left since
	for i := range n - 1 {
		order = append(order, uint32(i))
	}
	for _, index := range order {
		if err := s.steerTo(index); err != nil {
			return err
		}
		landed, err := s.probe(ctx)
		if err != nil {
			// Nothing says where packets land (a busy process answers a probe late): the program stays
			// as it is, which is most likely where it should point, and the round is tried again.
			return err
		}
		if landed == toUs {
			return nil
		}
	}
	if err := s.unsteer(); err != nil {
		return err
	}
	if toUs {
		return fmt.Errorf("no socket index of %s's %s group sends them to the fast path; the kernel spreads them by hash", fp.local, s.network)
	}
	return fmt.Errorf("no socket index of %s's %s group keeps them from the fast path; the kernel spreads them by hash", fp.local, s.network)
}

// probeQuery returns the query a probe sends, and its wire form. It has EDNS version 1: the fast path does
// not answer it, and CoreDNS's server answers BADVERS before any plugin sees it, so a probe that lands
// elsewhere changes nothing and is answered at once.
func probeQuery() (*dns.Msg, []byte, error) {
	var nonce [8]byte
	_, _ = rand.Read(nonce[:])
	q := new(dns.Msg)
	q.SetQuestion(fmt.Sprintf("%x.steer.wirecache.invalid.", nonce), dns.TypeTXT)
	q.Id = binary.BigEndian.Uint16(nonce[:])
	q.SetEdns0(dns.MinMsgSize, false)
	q.IsEdns0().SetVersion(1)
	wire, err := q.Pack()
	return q, wire, err
}

// probeOnce sends a probe query (probeQuery) to the address and reports whether it landed on the fast
// path's socket.
func (fp *fastPath) probeOnce(ctx context.Context) (landed bool, err error) {
	q, wire, err := probeQuery()
	if err != nil {
		return false, err
	}
	select {
	case <-fp.probeSeen:
	default:
	}
	fp.probe.Store(&wire)
	defer fp.probe.Store(nil)

	conn, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(fp.local))
	if err != nil {
		return false, fmt.Errorf("probe %s: %w", fp.local, err)
	}
	defer conn.Close()
	_ = conn.SetReadDeadline(time.Now().Add(probeWait))
	answered := probeAnswer(&dns.Conn{Conn: conn}, q.Id)
	if _, err := conn.Write(wire); err != nil {
		return false, fmt.Errorf("probe %s: %w", fp.local, err)
	}
	return awaitProbe(ctx, fp.probeSeen, answered, "probe "+fp.local.String())
}

// probeAnswer reads messages on conn, datagrams or length-prefixed, until one has the probe's id, and then
// sends nil on the channel it returns, or the error a read ended with.
func probeAnswer(conn *dns.Conn, id uint16) <-chan error {
	answered := make(chan error, 1)
	go func() {
		buf := make([]byte, dns.MinMsgSize)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				answered <- err
				return
			}
			if n >= 2 && binary.BigEndian.Uint16(buf) == id {
				answered <- nil
				return
			}
		}
	}()
	return answered
}

// awaitProbe waits for a probe to be seen by the fast path's socket (seen), which means it landed there, or
// answered by another socket (answered gets nil; an error when the probe's socket failed), for probeWait at
// most. A probe the fast path saw and then closed may also fail to read: seen wins.
func awaitProbe(ctx context.Context, seen <-chan struct{}, answered <-chan error, what string) (landed bool, err error) {
	timer := time.NewTimer(probeWait)
	defer timer.Stop()
	select {
	case <-seen:
		return true, nil
	case err := <-answered:
		select {
		case <-seen:
			return true, nil
		default:
		}
		if err != nil {
			return false, fmt.Errorf("%s: no answer: %w", what, err)
		}
		return false, nil
	case <-timer.C:
		return false, fmt.Errorf("%s: no answer within %v", what, probeWait)
	case <-ctx.Done():
		return false, ctx.Err()
	}
}
