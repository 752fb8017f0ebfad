//go:build linux

package nodelocal

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/nodelocaldns/nodelocaldns/nodelocal/internal/drain"
)

// Bounds and pauses of the sockets' part in a change of hands.
const (
	// drainTimeout bounds the wait for this process's sockets to empty at exit; drainQuietChecks checks
	// drainCheckEvery apart must find them idle in a row.
	drainTimeout     = 5 * time.Second
	drainQuietChecks = 3
	drainCheckEvery  = 20 * time.Millisecond
	// steerProbes probes, each from a source port of its own, must all reach this process for the steering
	// of a UDP group to count as working.
	steerProbes = 8
	// unsteerTimeout bounds the wait for the old process's sockets to leave the groups.
	unsteerTimeout = 10 * time.Minute
)

// reuseportSockets is what a Succession does with the reuseport groups of the server's endpoints, which
// the old and the new process share while the node changes hands. kernelSockets is the kernel's (package
// drain); tests without root fake it.
type reuseportSockets interface {
	// MigrateListeners lets closing TCP listeners hand their accept queues over (tcp_migrate_req), with
	// the value before kept in state; restore puts it back, and is nil when there is nothing to put back.
	MigrateListeners(state string) (restore func() error, err error)
	// TakeOver steers every new UDP packet for local to this process's sockets, and returns the group's
	// size. TakingOver reports whether the takeover holds the group; EndTakeOver gives the group back to the
	// kernel's hash.
	TakeOver(local netip.AddrPort) (int, error)
	TakingOver(local netip.AddrPort) bool
	EndTakeOver(local netip.AddrPort) error
	// Alone reports whether only this process has sockets of network in the group of local.
	Alone(network drain.Network, local netip.AddrPort) bool
	// Idle reports whether this process's sockets of network on endpoints have nothing queued.
	Idle(network drain.Network, endpoints []netip.AddrPort) (bool, error)
	// HandListenersOver stops this process's TCP listeners on endpoints from taking connections, so that
	// the successor's take them, and returns how many it stopped.
	HandListenersOver(endpoints []netip.AddrPort) (int, error)
}

// kernelSockets are the kernel's reuseport groups, through package drain.
type kernelSockets struct{}

func (kernelSockets) MigrateListeners(state string) (func() error, error) {
	return drain.MigrateListeners(state)
}
func (kernelSockets) TakeOver(local netip.AddrPort) (int, error) { return drain.TakeOver(local) }
func (kernelSockets) TakingOver(local netip.AddrPort) bool       { return drain.TakingOver(local) }
func (kernelSockets) EndTakeOver(local netip.AddrPort) error     { return drain.EndTakeOver(local) }
func (kernelSockets) Alone(network drain.Network, local netip.AddrPort) bool {
	group, err := drain.Group(network, local)
	return err == nil && drain.Others(group) == 0
}
func (kernelSockets) Idle(network drain.Network, endpoints []netip.AddrPort) (bool, error) {
	return drain.Idle(network, endpoints)
}
func (kernelSockets) HandListenersOver(endpoints []netip.AddrPort) (int, error) {
	return drain.HandListenersOver(endpoints)
}

// steerToThisProcess sends every new UDP packet for endpoints to this process's sockets (which
// wirecache's fast path then leaves alone), checks with probes that it works, and lets the old process's
// TCP listeners hand their accept queues over when they close. Once the old sockets have left the groups
// it ends the takeover and puts net.ipv4.tcp_migrate_req back as the node had it (the value before is
// kept beside the node lock, for the successor that ends a chain of them).
func (s *Succession) steerToThisProcess(ctx context.Context, endpoints []netip.AddrPort, probe ProbeFunc) {
	restore, err := s.sockets.MigrateListeners(s.cfg.LockPath + ".tcp_migrate_req")
	if err != nil {
		s.log.Warningf("TCP connections that wait in the old instance's accept queue will be reset when it stops: %v", err)
	} else if restore != nil {
		s.log.Infof("set net.ipv4.tcp_migrate_req to 1 until the old instance has stopped: a closing TCP listener hands its waiting connections to this one")
	}
	var steered []netip.AddrPort
	for _, local := range endpoints {
		size, err := s.sockets.TakeOver(local)
		if err != nil {
			s.log.Warningf("lookups queued at the old instance on %s may be lost when it stops: %v", local, err)
			continue
		}
		if !s.sockets.TakingOver(local) || size < 2 {
			_ = s.sockets.EndTakeOver(local) // nobody else is there any more
			continue
		}
		if err := probeEach(ctx, local, probe, steerProbes); err != nil {
			_ = s.sockets.EndTakeOver(local)
			s.log.Warningf("could not steer new lookups on %s to this instance (%v); lookups queued at the old instance may be lost when it stops", local, err)
			continue
		}
		steered = append(steered, local)
	}
	if len(steered) > 0 {
		s.log.Infof("steering new lookups on %s to this instance until the old one has stopped", endpointList(steered))
	}
	if len(steered) > 0 || restore != nil {
		go s.endTakeOverWhenAlone(ctx, endpoints, steered, restore)
	}
}

// probeEach sends count probes to local, and fails unless this server answered every one: with the group
// steered, none may land at another process.
func probeEach(ctx context.Context, local netip.AddrPort, probe ProbeFunc, count int) error {
	for i := range count {
		if err := probe(ctx, local); err != nil {
			return fmt.Errorf("probe %d of %d: %w", i+1, count, err)
		}
	}
	return nil
}

// endTakeOverWhenAlone ends the takeover of each steered group once only this process's sockets are in it,
// giving it back to the kernel's hash, so that the next successor starts from the usual spreading; and once
// the old process's TCP listeners on every endpoint are gone too, it turns tcp_migrate_req back to what it
// was (restore, when it changed it).
func (s *Succession) endTakeOverWhenAlone(ctx context.Context, all, steered []netip.AddrPort, restore func() error) {
	deadline := time.Now().Add(unsteerTimeout)
	t := time.NewTicker(orphanPoll)
	defer t.Stop()
	listeners := slices.Clone(all)
	for len(steered) > 0 || len(listeners) > 0 {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		steered = slices.DeleteFunc(steered, func(local netip.AddrPort) bool {
			if !s.sockets.Alone(drain.UDP, local) {
				return false
			}
			if err := s.sockets.EndTakeOver(local); err != nil {
				s.log.Warningf("%v", err)
			}
			return true
		})
		listeners = slices.DeleteFunc(listeners, func(local netip.AddrPort) bool { return s.sockets.Alone(drain.TCP, local) })
		if len(listeners) == 0 && restore != nil {
			if err := restore(); err != nil {
				s.log.Warningf("turning net.ipv4.tcp_migrate_req back off: %v", err)
			}
			restore = nil
		}
		if time.Now().After(deadline) {
			s.log.Warningf("the old instance still listens on %s after %v; new lookups stay steered to this one", endpointList(append(steered, listeners...)), unsteerTimeout)
			return
		}
	}
}

// Drain waits, up to drainTimeout, until this process's sockets on endpoints have nothing queued and no
// query is being answered (SuccessionHooks.InFlight), drainQuietChecks times in a row: what was queued
// when new traffic went elsewhere gets its answer before the listeners close. reason starts its logs.
func (s *Succession) Drain(reason string, endpoints []netip.AddrPort) {
	start := time.Now()
	deadline := start.Add(drainTimeout)
	quiet := 0
	for quiet < drainQuietChecks {
		udpIdle, err := s.sockets.Idle(drain.UDP, endpoints)
		if err != nil {
			s.log.Warningf("%s: cannot tell whether the sockets are idle: %v", reason, err)
			return
		}
		tcpIdle, err := s.sockets.Idle(drain.TCP, endpoints)
		if err != nil {
			s.log.Warningf("%s: cannot tell whether the listeners are idle: %v", reason, err)
			return
		}
		if udpIdle && tcpIdle && s.inFlight() == 0 {
			quiet++
		} else {
			quiet = 0
		}
		if time.Now().After(deadline) {
			s.log.Warningf("%s: lookups still reach this instance after %v; closing its sockets anyway", reason, drainTimeout)
			return
		}
		time.Sleep(drainCheckEvery)
	}
	s.log.Infof("%s: drained the sockets in %v", reason, time.Since(start).Round(time.Millisecond))
}

func (s *Succession) inFlight() int64 {
	if s.hooks.InFlight == nil {
		return 0
	}
	return s.hooks.InFlight()
}

// HandOverAtExit hands the node rec owns to the cluster DNS (Reconciler.HandOver), drains the sockets on
// endpoints, and takes the Service addresses off the link (Reconciler.CompleteHandOver), within timeout
// for each of the two. It returns false when the hand-over failed and the caller should tear down
// instead; the caller closes rec.
func (s *Succession) HandOverAtExit(reason string, rec *Reconciler, h Handover, endpoints []netip.AddrPort, timeout time.Duration) bool {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	diverted, err := rec.HandOver(ctx, h)
	if err != nil {
		s.failed(err, "%s: handing the node to the cluster DNS failed, tearing down instead: %v", reason, err)
		return false
	}
	s.Drain(reason, endpoints)
	lctx, lcancel := context.WithTimeout(context.Background(), timeout)
	defer lcancel()
	removed, err := rec.CompleteHandOver(lctx, h)
	if err != nil {
		s.failed(err, "%s: %v", reason, err)
	}
	var via []string
	for _, d := range diverted {
		via = append(via, fmt.Sprintf("%s to %s", d.From, d.To))
	}
	s.log.Infof("%s: handed the node to the cluster DNS in %v: jumps out, %v off %s, diverting %s; the next start takes it back once it answers",
		reason, time.Since(start).Round(time.Millisecond), removed, rec.cfg.Interface, strings.Join(via, ", "))
	return true
}
