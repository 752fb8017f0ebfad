//go:build linux

package notrack

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/coredns/caddy"
)

// Bounds of the final teardown.
const (
	// teardownTimeout bounds the final teardown of rules, addresses and link; linkTeardownTimeout is added
	// for the link alone when the rules used it all up.
	teardownTimeout     = 4 * time.Second
	linkTeardownTimeout = time.Second
)

// finalShutdown hands the node over (to a successor that owns it already, or with handover to the cluster
// DNS; see succession.go), or removes the rules, then the addresses and the link (unless skip_teardown), or,
// in an uninstall (SetUninstalling), everything of the cache's and its guard's (uninstall.go), within
// teardownTimeout plus linkTeardownTimeout whatever else is shutting down (a drain adds drainTimeout). It runs from the first of: the
// shutdown event (emitted before any shutdown callback), the last instance's OnShutdown, OnFinalShutdown.
func (n *node) finalShutdown(reason string) error {
	n.stopLife() // ends probes and repairs, killing any iptables they run, so that mu is free soon
	n.mu.Lock()
	defer n.mu.Unlock()
	for in := range n.live {
		in.cancel()
	}
	endpoints := n.liveEndpoints()
	clear(n.live)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), teardownTimeout)
	defer cancel()
	var errs []error
	if n.probe.Active() {
		errs = append(errs, n.probe.RemoveAll(ctx))
	}
	if n.succ.Leave(ctx, reason, endpoints) {
		return errors.Join(errs...)
	}
	if n.rec == nil {
		err := errors.Join(errs...)
		if err != nil {
			countSetupError(err)
			log.Errorf("%s: %v", reason, err)
		}
		return err
	}
	if uninstalling.Load() {
		errs = append(errs, n.uninstallAtExit(reason, endpoints))
		n.closeLocked()
		n.rulesLogged = false
		return errors.Join(errs...)
	}
	name := n.settings.Interface
	if h, ok := n.settings.handoverConfig(); ok && !n.settings.NoRules && n.succ.HandOverAtExit(reason, n.rec, h, endpoints, teardownTimeout) {
		n.closeLocked()
		n.rulesLogged = false
		return errors.Join(errs...)
	}
	if n.settings.SkipTeardown {
		log.Infof("%s: skip_teardown: leaving the rules and the addresses on %s in place", reason, name)
		if err := errors.Join(errs...); err != nil {
			log.Errorf("%s: %v", reason, err)
		}
	} else {
		err := n.rec.Teardown(ctx)
		if err != nil {
			countSetupError(err)
			errs = append(errs, err)
			if !n.settings.NoInterface && ctx.Err() != nil {
				// The rules took the whole deadline; the link still goes, so that it does not attract
				// traffic nobody serves.
				lctx, lcancel := context.WithTimeout(context.Background(), linkTeardownTimeout)
				errs = append(errs, n.rec.TeardownLink(lctx))
				lcancel()
			}
		}
		if err := errors.Join(errs...); err != nil {
			log.Errorf("%s: teardown incomplete after %v: %v", reason, time.Since(start).Round(time.Millisecond), err)
		} else {
			log.Infof("%s: removed the rules and the addresses on %s in %v", reason, name, time.Since(start).Round(time.Millisecond))
		}
	}
	n.closeLocked()
	n.rulesLogged = false
	return errors.Join(errs...)
}

// hookName names notrack's caddy event hook.
const hookName = "notrack"

// registerShutdownHook makes the shutdown event (SIGTERM, SIGINT) tear the node down before any shutdown
// callback runs, so that a plugin whose callback hangs cannot keep the rules in place. A SIGUSR1 reload
// drops every hook, so each start registers it again; caddy panics when a name is registered twice, which
// is how a hook still in place shows.
func registerShutdownHook() {
	defer func() {
		if r := recover(); r != nil {
			if s, ok := r.(string); ok && strings.Contains(s, "already registered") {
				return
			}
			panic(r)
		}
	}()
	caddy.RegisterEventHook(hookName, func(event caddy.EventName, info any) error {
		if event != caddy.ShutdownEvent {
			return nil
		}
		return theNode.finalShutdown(fmt.Sprint(info))
	})
}
