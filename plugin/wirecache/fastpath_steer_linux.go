//go:build linux

package wirecache

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net"
	"slices"
	"time"

	"github.com/nodelocaldns/nodelocaldns/nodelocal"

	"github.com/miekg/dns"
)

// How the fast path keeps its address's reuseport group steered to its socket, and yields it.

// keepSteered steers the group to the fast path's socket, and checks who is in the group whenever this
// process hears that it may have changed (nodelocal.ReuseportChanges: a successor queued or left, a
// takeover began or ended) and besides: steerCheck after a change, the wait doubling up to steerCheckMax
// while the group stays as it was, so that an idle node wakes it seldom (a group that changed unheard of,
// a stray process joining, leaves packets to CoreDNS's own socket, which answers them, until the next look).
// While this process takes the address over from an older one (nodelocal.UDPGroupTakenOver) it leaves the group's
// program to the takeover. While another process has sockets there (a successor that must prove it answers, then takes the node
// over and steers the group itself), or a successor is queued at the node lock and about to join
// (nodelocal.SuccessorQueued), the fast path gives the group back to the kernel's hash once, if it was
// steered to the fast path, and leaves it alone. Otherwise it steers again when the group changed, and
// checks with a probe at each look that packets still come to it. Each round also ends the goroutines
// the chainServers keep beyond what the last round needed (trim).
func (fp *fastPath) keepSteered(ctx context.Context) {
	defer close(fp.steerDone)
	changes, unsubscribe := nodelocal.ReuseportChanges()
	defer unsubscribe()
	t := time.NewTimer(steerCheck)
	defer t.Stop()
	// retry is the wait before the next look after a round that could not finish (a probe that got no
	// answer, a steering that failed): a second, doubling up to steerCheck. idle is the wait after one that
	// did: steerCheck after a change, doubling while the group stays as it was, up to steerCheckMax.
	retry, idle := time.Duration(0), steerCheck
	checkedGroup := ""
	var (
		steered, yielded bool
		lastGroup        string
		lastErr          string
		lastVerified     time.Time
	)
	setSteered := func(now bool) {
		if now == steered {
			return
		}
		steered = now
		if steered {
			fp.steered.Inc()
			log.Infof("fast path on %s: the address's UDP queries come to it", fp.srv.Addr)
		} else {
			fp.steered.Dec()
		}
	}
	defer setSteered(false)
	for {
		failed := false
		if fp.servers != nil {
			fp.servers.trim()
		}
		group, err := nodelocal.UDPGroup(fp.local)
		switch {
		case err != nil:
			failed = true
			if msg := err.Error(); msg != lastErr {
				log.Warningf("fast path on %s: reading the sockets bound to %s: %v", fp.srv.Addr, fp.local, err)
				lastErr = msg
			}
		case nodelocal.UDPGroupTakenOver(fp.local):
			// This process takes the address over from an older one: the takeover owns the group's
			// program until the older sockets are gone (see nodelocal.Succession's takeover).
			setSteered(false)
		case nodelocal.OthersInGroup(group) > 0 || nodelocal.SuccessorQueued():
			if yielded {
				break
			}
			// Only a group steered to this socket is given back: a program another process attached is
			// that process's business.
			landed, err := fp.probeOnce(ctx)
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				failed = true // asked again soon
				break
			}
			setSteered(false)
			yielded = true
			if !landed {
				log.Infof("fast path on %s: another process listens on the address too; the group is left to it", fp.srv.Addr)
				break
			}
			if err := nodelocal.UnsteerUDPGroup(fp.local); err != nil {
				log.Warningf("fast path on %s: %v", fp.srv.Addr, err)
			}
			log.Infof("fast path on %s: another process listens on the address too; its packets are spread by the kernel's hash and the group is left to that process", fp.srv.Addr)
		default:
			yielded = false
			if sig := groupSignature(group); sig != lastGroup || !steered || time.Since(lastVerified) >= steerCheck {
				err := fp.steer(ctx, group, true)
				if ctx.Err() != nil {
					return
				}
				lastGroup, lastVerified = sig, time.Now()
				if err != nil {
					failed = true
					if msg := err.Error(); msg != lastErr {
						log.Infof("fast path on %s: %v; the plugin chain's socket answers meanwhile", fp.srv.Addr, err)
						lastErr = msg
					}
				} else {
					lastErr = ""
				}
				setSteered(err == nil)
			}
		}
		if failed {
			retry = min(max(2*retry, time.Second), steerCheck)
			idle = steerCheck
			t.Reset(retry)
		} else {
			retry = 0
			if lastGroup != checkedGroup {
				idle = steerCheck
			}
			t.Reset(idle)
			idle = min(2*idle, steerCheckMax)
		}
		checkedGroup = lastGroup
		select {
		case <-ctx.Done():
			return
		case <-changes:
			idle = steerCheck
		case <-t.C:
		}
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

// steer points the address's reuseport group at the fast path's socket (toUs) or at another socket of this
// process, and checks with a probe that packets land there. group is the group's sockets, all this
// process's: another process's group is not this one's to steer. Socket indexes move as sockets leave, so each
// index is tried until a probe lands where it should.
func (fp *fastPath) steer(ctx context.Context, group []nodelocal.ReuseportSocket, toUs bool) error {
	if !slices.ContainsFunc(group, func(s nodelocal.ReuseportSocket) bool { return s.FD == fp.fd }) {
		return fmt.Errorf("the fast path's socket is no longer bound to %s", fp.local)
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
		if err := nodelocal.SteerUDPGroup(fp.local, index); err != nil {
			return err
		}
		landed, err := fp.probeOnce(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			continue
		}
		if landed == toUs {
			return nil
		}
	}
	if err := nodelocal.UnsteerUDPGroup(fp.local); err != nil {
		return err
	}
	if toUs {
		return fmt.Errorf("no socket index of %s's group sends packets to the fast path; the kernel spreads them by hash", fp.local)
	}
	return fmt.Errorf("no socket index of %s's group keeps packets from the fast path; the kernel spreads them by hash", fp.local)
}

// probeOnce sends a query to the address and reports whether it landed on the fast path's socket. The query
// has EDNS version 1: the fast path does not answer it, and CoreDNS's server answers BADVERS before any
// plugin sees it, so a probe that lands elsewhere changes nothing and is answered at once.
func (fp *fastPath) probeOnce(ctx context.Context) (landed bool, err error) {
	var nonce [8]byte
	_, _ = rand.Read(nonce[:])
	q := new(dns.Msg)
	q.SetQuestion(fmt.Sprintf("%x.steer.wirecache.invalid.", nonce), dns.TypeTXT)
	q.Id = binary.BigEndian.Uint16(nonce[:])
	q.SetEdns0(dns.MinMsgSize, false)
	q.IsEdns0().SetVersion(1)
	wire, err := q.Pack()
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
	answered := make(chan error, 1)
	go func() {
		_ = conn.SetReadDeadline(time.Now().Add(probeWait))
		buf := make([]byte, dns.MinMsgSize)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				answered <- err
				return
			}
			if n >= 2 && binary.BigEndian.Uint16(buf) == q.Id {
				answered <- nil
				return
			}
		}
	}()
	if _, err := conn.Write(wire); err != nil {
		return false, fmt.Errorf("probe %s: %w", fp.local, err)
	}
	timer := time.NewTimer(probeWait)
	defer timer.Stop()
	select {
	case <-fp.probeSeen:
		return true, nil
	case err := <-answered:
		if err != nil {
			return false, fmt.Errorf("probe %s: no answer: %w", fp.local, err)
		}
		return false, nil
	case <-timer.C:
		return false, fmt.Errorf("probe %s: no answer within %v", fp.local, probeWait)
	case <-ctx.Done():
		return false, ctx.Err()
	}
}
