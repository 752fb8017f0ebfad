//go:build linux

package nodelocal

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/nodelocaldns/nodelocaldns/nodelocal/internal/link"
	"github.com/nodelocaldns/nodelocaldns/nodelocal/internal/nodelock"
	"github.com/nodelocaldns/nodelocaldns/nodelocal/internal/rules"
)

// fakeNode is a node in memory, for the state machines' tests without root: a firewall holding the
// state a real backend holds (the cache's rules and whether each family's are hooked, the divert and its
// marks, the probe exemption, the Service endpoints kube-proxy serves), the link with its addresses, and
// the tracked flows forgotten. It records every operation in one log, in order, and can fail an operation
// or run a hook right before it: a foreign change (a reclaim, kube-proxy) at the worst moment.
type fakeNode struct {
	mu sync.Mutex
	// ops is every operation, "Name(args)", in the order they ran.
	ops []string
	// failures maps an operation's name to the errors it returns, one per call, before it succeeds.
	failures map[string][]error
	// hooks maps an operation's name to a function run (without the lock) before its next call.
	hooks map[string]func()

	mode rules.Mode
	// cache is the cache's endpoints in its rules; repliesOnly that the rules were narrowed.
	cache       []rules.Endpoint
	repliesOnly bool
	hooked      map[rules.Family]bool
	// marked holds the families the divert marks; divert is the plan last written.
	marked map[rules.Family]bool
	divert divertPlan
	probe  bool
	// served maps a Service ClusterIP to the endpoints kube-proxy DNATs it to here.
	served map[netip.Addr][]netip.AddrPort

	// local holds the node's addresses other than the link's; linkAddrs the link's.
	local     []netip.Addr
	linkAddrs []netip.Addr
	linkUp    bool
	// forgotten are the endpoints whose flows were forgotten, in order.
	forgotten []netip.AddrPort
}

func newFakeNode(mode rules.Mode) *fakeNode {
	return &fakeNode{mode: mode, failures: map[string][]error{}, hooks: map[string]func(){},
		hooked: map[rules.Family]bool{}, marked: map[rules.Family]bool{}, served: map[netip.Addr][]netip.AddrPort{}}
}

// op records an operation, runs its hook and returns its injected failure, if any. The caller holds no lock.
func (n *fakeNode) op(name string, args ...any) error {
	n.mu.Lock()
	hook := n.hooks[name]
	delete(n.hooks, name)
	n.mu.Unlock()
	if hook != nil {
		hook()
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.ops = append(n.ops, fmt.Sprintf("%s%v", name, args))
	if errs := n.failures[name]; len(errs) > 0 {
		n.failures[name] = errs[1:]
		return errs[0]
	}
	return nil
}

// fail makes the next calls of op fail with errs, one each.
func (n *fakeNode) fail(op string, errs ...error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.failures[op] = append(n.failures[op], errs...)
}

// before runs fn right before the next call of op.
func (n *fakeNode) before(op string, fn func()) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.hooks[op] = fn
}

// names returns the names of the operations that changed something, in order.
func (n *fakeNode) changes() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []string
	for _, op := range n.ops {
		name, _, _ := strings.Cut(op, "[")
		switch name {
		case "CacheHooked", "CacheEndpoints", "Diverted", "PlanDivert", "Addresses", "NodeAddresses":
			continue
		}
		out = append(out, name)
	}
	return out
}

// resetOps forgets the operations recorded so far.
func (n *fakeNode) resetOps() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.ops = nil
}

// state returns a summary of the node: what a test compares.
func (n *fakeNode) state() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var hooked, marked []string
	for _, fam := range rules.Families {
		if n.hooked[fam] {
			hooked = append(hooked, fam.String())
		}
		if n.marked[fam] {
			marked = append(marked, fam.String())
		}
	}
	return fmt.Sprintf("rules=%d hooked=%v marked=%v link=%v", len(n.cache), hooked, marked, n.linkAddrs)
}

// The firewall.

type fakeFirewall struct{ n *fakeNode }

func (f fakeFirewall) Mode() rules.Mode { return f.n.mode }
func (f fakeFirewall) Reason() string   { return "fake" }
func (f fakeFirewall) Families(fams []rules.Family) []rules.Family {
	return slices.Compact(slices.Sorted(slices.Values(fams)))
}

func (f fakeFirewall) SyncCache(_ context.Context, endpoints []rules.Endpoint) (cacheSync, error) {
	if err := f.n.op("SyncCache", len(endpoints)); err != nil {
		return cacheSync{}, rulesError("sync rules", err)
	}
	n := f.n
	n.mu.Lock()
	defer n.mu.Unlock()
	n.cache, n.repliesOnly = slices.Clone(endpoints), false
	clear(n.hooked)
	var res cacheSync
	for _, e := range endpoints {
		n.hooked[rules.FamilyOf(e.Addr)] = true
		res.Covered = append(res.Covered, e.Addr)
	}
	res.Rules = 2 * len(endpoints)
	slices.SortFunc(res.Covered, netip.Addr.Compare)
	res.Covered = slices.Compact(res.Covered)
	return res, nil
}

func (f fakeFirewall) NarrowCache(_ context.Context, endpoints []rules.Endpoint) error {
	if err := f.n.op("NarrowCache", len(endpoints)); err != nil {
		return rulesError("narrow rules", err)
	}
	f.n.mu.Lock()
	defer f.n.mu.Unlock()
	f.n.repliesOnly = true
	return nil
}

func (f fakeFirewall) UnhookCache(_ context.Context, fams []rules.Family) error {
	if err := f.n.op("UnhookCache", fams); err != nil {
		return rulesError("unhook", err)
	}
	f.n.mu.Lock()
	defer f.n.mu.Unlock()
	for _, fam := range fams {
		delete(f.n.hooked, fam)
	}
	return nil
}

func (f fakeFirewall) CacheHooked(_ context.Context, fams []rules.Family) (bool, error) {
	if err := f.n.op("CacheHooked", fams); err != nil {
		return false, rulesError("read jumps", err)
	}
	f.n.mu.Lock()
	defer f.n.mu.Unlock()
	return slices.ContainsFunc(fams, func(fam rules.Family) bool { return f.n.hooked[fam] }), nil
}

func (f fakeFirewall) CacheEndpoints(context.Context) ([]rules.Endpoint, error) {
	if err := f.n.op("CacheEndpoints"); err != nil {
		return nil, rulesError("read rules", err)
	}
	f.n.mu.Lock()
	defer f.n.mu.Unlock()
	return slices.Clone(f.n.cache), nil
}

func (f fakeFirewall) PlanDivert(_ context.Context, fams []rules.Family, wants []rules.Divert, local []netip.Addr) (divertPlan, error) {
	if err := f.n.op("PlanDivert", len(wants)); err != nil {
		return divertPlan{}, rulesError("plan divert", err)
	}
	f.n.mu.Lock()
	defer f.n.mu.Unlock()
	p, _, err := planDivert(context.Background(), fams, wants, local, func(_ context.Context, svc netip.Addr, _ rules.Protocol, _ uint16) ([]netip.AddrPort, bool, error) {
		return slices.Clone(f.n.served[svc]), false, nil
	})
	return p, err
}

func (f fakeFirewall) WriteDivert(_ context.Context, p divertPlan) error {
	if err := f.n.op("WriteDivert", p.Families, len(p.Diverts)); err != nil {
		return rulesError("write divert", err)
	}
	f.n.mu.Lock()
	defer f.n.mu.Unlock()
	f.n.divert = p
	for _, fam := range p.Families {
		f.n.marked[fam] = true
	}
	return nil
}

func (f fakeFirewall) RefreshDivert(_ context.Context, p divertPlan) (bool, error) {
	if err := f.n.op("RefreshDivert", len(p.Routes)); err != nil {
		return false, rulesError("refresh divert", err)
	}
	f.n.mu.Lock()
	defer f.n.mu.Unlock()
	if !slices.ContainsFunc(p.Families, func(fam rules.Family) bool { return f.n.marked[fam] }) {
		return false, nil
	}
	f.n.divert.Routes = p.Routes
	return true, nil
}

func (f fakeFirewall) DeleteDivert(_ context.Context, fams []rules.Family) (bool, error) {
	if err := f.n.op("DeleteDivert", fams); err != nil {
		return false, rulesError("delete divert", err)
	}
	f.n.mu.Lock()
	defer f.n.mu.Unlock()
	return f.n.unmarkLocked(fams), nil
}

func (n *fakeNode) unmarkLocked(fams []rules.Family) bool {
	found := false
	for _, fam := range fams {
		found = found || n.marked[fam]
		delete(n.marked, fam)
	}
	if len(n.marked) == 0 {
		n.divert = divertPlan{}
	}
	return found
}

func (f fakeFirewall) Diverted(_ context.Context, fams []rules.Family) (bool, error) {
	if err := f.n.op("Diverted", fams); err != nil {
		return false, rulesError("look for divert", err)
	}
	f.n.mu.Lock()
	defer f.n.mu.Unlock()
	return slices.ContainsFunc(fams, func(fam rules.Family) bool { return f.n.marked[fam] }), nil
}

func (f fakeFirewall) UnhookCacheWhileDiverted(_ context.Context, fams []rules.Family) (marked, unhooked bool, err error) {
	if err := f.n.op("UnhookCacheWhileDiverted", fams); err != nil {
		return false, false, rulesError("unhook while diverted", err)
	}
	f.n.mu.Lock()
	defer f.n.mu.Unlock()
	for _, fam := range fams {
		if !f.n.marked[fam] {
			continue // a real transaction fails on the missing marker and changes nothing
		}
		marked = true
		unhooked = unhooked || f.n.hooked[fam]
		delete(f.n.hooked, fam)
	}
	return marked, unhooked, nil
}

func (f fakeFirewall) AddProbeExemption(_ context.Context, _ uint32, addrs []netip.Addr) error {
	if err := f.n.op("AddProbeExemption", addrs); err != nil {
		return rulesError("add probe exemption", err)
	}
	f.n.mu.Lock()
	defer f.n.mu.Unlock()
	f.n.probe = true
	return nil
}

func (f fakeFirewall) RemoveProbeExemption(context.Context, uint32) error {
	if err := f.n.op("RemoveProbeExemption"); err != nil {
		return rulesError("remove probe exemption", err)
	}
	f.n.mu.Lock()
	defer f.n.mu.Unlock()
	f.n.probe = false
	return nil
}

func (f fakeFirewall) Inspect(context.Context, []rules.Endpoint) []RuleCheck {
	_ = f.n.op("Inspect")
	return nil
}

// The link, the node's addresses and connection tracking.

type fakeLink struct{ n *fakeNode }

func (l fakeLink) Ensure(_ context.Context, want []netip.Addr) (link.Result, error) {
	if err := l.n.op("Ensure", want); err != nil {
		return link.Result{}, &link.Error{Phase: link.Change, Op: "ensure", Err: err}
	}
	l.n.mu.Lock()
	defer l.n.mu.Unlock()
	res := link.Result{Kind: "dummy", Owned: true, Created: !l.n.linkUp}
	l.n.linkUp = true
	for _, a := range want {
		if !slices.Contains(l.n.linkAddrs, a) {
			res.Added = append(res.Added, a)
		}
	}
	for _, a := range l.n.linkAddrs {
		if !slices.Contains(want, a) {
			res.Removed = append(res.Removed, a)
		}
	}
	l.n.linkAddrs = slices.Clone(want)
	res.Present = slices.Clone(want)
	return res, nil
}

func (l fakeLink) Addresses(context.Context) ([]netip.Addr, error) {
	if err := l.n.op("Addresses"); err != nil {
		return nil, &link.Error{Phase: link.Check, Op: "list", Err: err}
	}
	l.n.mu.Lock()
	defer l.n.mu.Unlock()
	return slices.Clone(l.n.linkAddrs), nil
}

func (l fakeLink) AddAddresses(_ context.Context, addrs []netip.Addr) ([]netip.Addr, error) {
	if err := l.n.op("AddAddresses", addrs); err != nil {
		return nil, &link.Error{Phase: link.Change, Op: "add", Err: err}
	}
	l.n.mu.Lock()
	defer l.n.mu.Unlock()
	var added []netip.Addr
	for _, a := range addrs {
		if !slices.Contains(l.n.linkAddrs, a) {
			l.n.linkAddrs = append(l.n.linkAddrs, a)
			added = append(added, a)
		}
	}
	slices.SortFunc(l.n.linkAddrs, netip.Addr.Compare)
	return added, nil
}

func (l fakeLink) RemoveAddresses(_ context.Context, addrs []netip.Addr) ([]netip.Addr, error) {
	if err := l.n.op("RemoveAddresses", addrs); err != nil {
		return nil, &link.Error{Phase: link.Change, Op: "remove", Err: err}
	}
	l.n.mu.Lock()
	defer l.n.mu.Unlock()
	var removed []netip.Addr
	l.n.linkAddrs = slices.DeleteFunc(l.n.linkAddrs, func(a netip.Addr) bool {
		if slices.Contains(addrs, a) {
			removed = append(removed, a)
			return true
		}
		return false
	})
	return removed, nil
}

func (l fakeLink) Teardown(context.Context) error {
	if err := l.n.op("Teardown"); err != nil {
		return &link.Error{Phase: link.Change, Op: "teardown", Err: err}
	}
	l.n.mu.Lock()
	defer l.n.mu.Unlock()
	l.n.linkAddrs, l.n.linkUp = nil, false
	return nil
}

func (n *fakeNode) nodeAddresses(context.Context) ([]netip.Addr, error) {
	if err := n.op("NodeAddresses"); err != nil {
		return nil, linkError("list the node's addresses", err)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return append(slices.Clone(n.local), n.linkAddrs...), nil
}

func (n *fakeNode) forgetFlows(eps []netip.AddrPort) (uint, error) {
	if err := n.op("ForgetFlows", eps); err != nil {
		return 0, err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.forgotten = append(n.forgotten, eps...)
	return uint(len(eps)), nil
}

// reconciler returns a Reconciler of this node with the node lock in a temporary directory.
func (n *fakeNode) reconciler(t *testing.T, log Logger) *Reconciler {
	t.Helper()
	cfg := Config{LockPath: filepath.Join(t.TempDir(), "nodelocaldns.lock"), Logger: log}.withDefaults()
	lock, err := nodelock.Acquire(cfg.LockPath)
	if err != nil {
		t.Fatal(err)
	}
	r, err := newReconciler(cfg, lock)
	if err != nil {
		t.Fatal(err)
	}
	n.attach(r.fw)
	r.link, r.nodeAddrs, r.forgetFlows = fakeLink{n}, n.nodeAddresses, n.forgetFlows
	t.Cleanup(func() { r.Close() })
	return r
}

// guard returns a Guard of this node for cfg, probing with probe.
func (n *fakeNode) guard(t *testing.T, cfg GuardConfig, probe ProbeFunc) *Guard {
	t.Helper()
	cfg.LockPath = filepath.Join(t.TempDir(), "guard.lock")
	cfg.Probe = probe
	g, err := NewGuard(cfg)
	if err != nil {
		t.Fatal(err)
	}
	n.attach(g.fw)
	g.link, g.nodeAddrs, g.forgetFlows = fakeLink{n}, n.nodeAddresses, n.forgetFlows
	t.Cleanup(func() { g.Close() })
	return g
}

// attach makes c choose this node's firewall.
func (n *fakeNode) attach(c *firewallChoice) {
	c.chosen = fakeFirewall{n}
}
