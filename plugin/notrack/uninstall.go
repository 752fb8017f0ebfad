//go:build linux

package notrack

import (
	"context"
	"errors"
	"net/netip"
	"sync/atomic"
	"time"
)

// uninstalling is set while the process is being uninstalled (SetUninstalling).
var uninstalling atomic.Bool

// SetUninstalling tells notrack whether the node cache is being uninstalled, so that no cache will take the
// node back after this process (its DaemonSet was deleted, say): at the final shutdown the node then loses
// everything of the cache's and its guard's (rules, divert, addresses, link), whatever handover and
// skip_teardown say, instead of being handed to the cluster DNS for the next start. A process that let a
// successor take the node still leaves it to the successor. It may be called at any time, from any
// goroutine, and again with false (the DaemonSet came back); the last call before the shutdown decides.
func SetUninstalling(on bool) { uninstalling.Store(on) }

// uninstallAtExit removes everything of the cache's and its guard's from the node at the final shutdown of
// an uninstall (Reconciler.RemoveAll). With handover, the node is handed to the cluster DNS first and the
// sockets drained, as at any exit: the lookups already queued get their answers, and new ones meet
// kube-proxy's DNAT. n.mu is held; the caller closes the Reconciler.
func (n *node) uninstallAtExit(reason string, endpoints []netip.AddrPort) error {
	start := time.Now()
	if h, ok := n.settings.handoverConfig(); ok && !n.settings.NoRules {
		hctx, hcancel := context.WithTimeout(context.Background(), teardownTimeout)
		_, err := n.rec.HandOver(hctx, h)
		hcancel()
		if err != nil {
			countSetupError(err)
			log.Warningf("%s: uninstalling: handing the node to the cluster DNS first failed, removing everything at once: %v", reason, err)
		} else {
			n.succ.Drain(reason, endpoints)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), teardownTimeout)
	defer cancel()
	err := n.rec.RemoveAll(ctx)
	if err != nil {
		countSetupError(err)
		if !n.settings.NoInterface && ctx.Err() != nil {
			// The rules took the whole deadline; the link still goes.
			lctx, lcancel := context.WithTimeout(context.Background(), linkTeardownTimeout)
			err = errors.Join(err, n.rec.TeardownLink(lctx))
			lcancel()
		}
		log.Errorf("%s: uninstalling: removal incomplete after %v (node-cache -cleanup removes the rest): %v",
			reason, time.Since(start).Round(time.Millisecond), err)
		return err
	}
	log.Infof("%s: uninstalling: removed the rules, the divert and %s (or the addresses the cache put on it) in %v; nothing of the cache's is left on the node",
		reason, n.settings.Interface, time.Since(start).Round(time.Millisecond))
	return nil
}
