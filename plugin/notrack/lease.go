//go:build linux

package notrack

import (
	"context"
	"fmt"

	"github.com/nodelocaldns/nodelocaldns/nodelocal"
)

// sharedLease is one claim on the node (see claimKey), held by every live instance whose server blocks
// claim it: server blocks and the Corefiles before and after a reload share it, so a reload that changes
// nothing changes nothing on the node.
type sharedLease struct {
	lease *nodelocal.Lease
	// refs counts the live instances that claim it.
	refs int
	// rules is set once the lease's rules are wanted: at once, or when the server answered.
	rules bool
}

// acquire takes a reference on every lease the instance claims, acquiring those nobody holds yet. A new
// lease defers its rules until the server answers, unless rules for its address and port are in place
// already: then the server answering there is this process, whose listener a reload hands over. It returns
// the keys it took a reference on.
func (n *node) acquire(ctx context.Context, in *instance) ([]claimKey, error) {
	var taken []claimKey
	for _, k := range in.keys() {
		if sl, ok := n.leases[k]; ok {
			sl.refs++
			taken = append(taken, k)
			continue
		}
		deferRules := !in.settings.NoRules && !n.rulesServe(k.endpoint)
		lease, err := n.rec.Acquire(ctx, k.claim(deferRules))
		if err != nil {
			countSetupError(err)
			return taken, fmt.Errorf("put %s in place: %w", k, err)
		}
		n.leases[k] = &sharedLease{lease: lease, refs: 1, rules: !deferRules}
		taken = append(taken, k)
	}
	return taken, nil
}

func (n *node) rulesServe(e endpoint) bool {
	for k, sl := range n.leases {
		if k.endpoint == e && sl.rules {
			return true
		}
	}
	return false
}

// drop gives up references and releases the leases nobody references any more.
func (n *node) drop(keys []claimKey) {
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	for _, k := range keys {
		sl := n.leases[k]
		if sl == nil {
			continue
		}
		if sl.refs--; sl.refs > 0 {
			continue
		}
		delete(n.leases, k)
		if err := sl.lease.Release(ctx); err != nil {
			countSetupError(err)
			log.Errorf("release %s: %v", k, err)
		}
	}
	n.updateGauges()
}

// abandon undoes a first start that failed: everything goes, whatever skip_teardown says, since nothing
// ever served on it.
func (n *node) abandon() {
	ctx, cancel := context.WithTimeout(context.Background(), teardownTimeout)
	defer cancel()
	if err := n.rec.Teardown(ctx); err != nil {
		log.Errorf("undo the failed start: %v", err)
	}
	n.closeLocked()
}

// closeLocked drops the Reconciler (and with it the node lock) and resets the node for a later start.
func (n *node) closeLocked() {
	if n.stopRepair != nil {
		n.stopRepair()
		n.stopRepair = nil
	}
	if err := n.rec.Close(); err != nil {
		log.Errorf("release the node lock: %v", err)
	}
	n.rec = nil
	n.leases = nil
	rulesInPlace.Set(0)
	addressesInPlace.Set(0)
}
