//go:build linux

package nodelocal

import (
	"context"
	"errors"
	"time"

	"github.com/nodelocaldns/nodelocaldns/nodelocal/internal/rules"
)

// Cleanup removes from the node everything a node cache and its guard may have left there: the cache's
// jumps and chains in both families, the guard's divert, and the link (when this package created it) or
// the addresses (see Reconciler.RemoveAll). It is for an uninstall: a cache that stops hands the node to the
// cluster DNS, or to a successor, and leaves things in place on purpose. It takes the node lock first, so it
// fails with KindNodeLock while a cache runs.
func Cleanup(ctx context.Context, cfg Config) error {
	r, err := New(cfg)
	if err != nil {
		return err
	}
	defer r.Close()
	return r.RemoveAll(ctx)
}

// RemoveAll is Teardown followed by the removal of the fail-open guard's divert and its marks, which a
// hand-over or the guard left: after it, nothing of the cache's or its guard's is on the node. It is how a
// cache that is being uninstalled ends, and what Cleanup does.
func (r *Reconciler) RemoveAll(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return ErrClosed
	}
	errs := []error{r.teardownLocked(ctx)}
	if !r.cfg.NoRules {
		// Teardown chose the backend, unless nothing of the cache's nor of kube-proxy's is on the node.
		if fw := r.fw.current(); fw != nil {
			if _, err := fw.DeleteDivert(ctx, rules.Families); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// NewGuardWhenFree is NewGuard for a guard that may start while another one runs on the node (the guard of
// a rolling update's new Pod, started beside the old one): while the guard lock is held it waits, polling
// every poll, and logs once whom it waits for. Any other error is returned at once.
func NewGuardWhenFree(ctx context.Context, cfg GuardConfig, poll time.Duration) (*Guard, error) {
	logged := false
	t := time.NewTicker(poll)
	defer t.Stop()
	for {
		g, err := NewGuard(cfg)
		if err == nil || KindOf(err) != KindNodeLock {
			return g, err
		}
		if !logged && cfg.Logger != nil {
			cfg.Logger.Infof("nodelocal guard: waiting for the guard that runs on this node to exit: %v", err)
			logged = true
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}
