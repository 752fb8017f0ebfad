//go:build linux

// Package link keeps a local link up and holding the node-local DNS cache's addresses.
//
// The link is of kind dummy: it sends nothing anywhere and only makes its addresses local to the node.
// Where the kernel has no dummy type (it answers "operation not supported", as some ARM boards and micro-VMs
// do) a bridge with no ports serves the same purpose. Links this package creates carry an alias that marks
// them as ours, so a later process recognises a link an earlier one left behind and may remove it.
package link

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// DefaultName is the link's name unless configured otherwise.
const DefaultName = "nodelocaldns"

// DefaultAlias marks links created by this package.
const DefaultAlias = "created by nodelocaldns (github.com/nodelocaldns/nodelocaldns)"

// Phase says whether a failed netlink call was looking or changing.
type Phase int

// The phases.
const (
	// Check is reading the link or its addresses.
	Check Phase = iota
	// Change is creating the link, bringing it up, or adding or removing an address.
	Change
)

// Error is a failed netlink call and what it was doing.
type Error struct {
	Phase Phase
	// Op says what was being done, e.g. "add address 169.254.20.10/32 to nodelocaldns".
	Op  string
	Err error
}

func (e *Error) Error() string { return e.Op + ": " + e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// AddFunc adds a link to the kernel. netlink.LinkAdd does it for real; tests pass stand-ins to take the
// path of a kernel with or without the dummy type.
type AddFunc func(netlink.Link) error

// Options configure a Manager.
type Options struct {
	// Name is the link's name; DefaultName when empty.
	Name string
	// Alias marks links we create; DefaultAlias when empty.
	Alias string
	// Add creates links; netlink.LinkAdd when nil.
	Add AddFunc
}

// Manager keeps one link. It remembers which addresses it added, so that it removes only those. Calls
// must not overlap.
type Manager struct {
	name  string
	alias string
	add   AddFunc
	// added holds the addresses this Manager put on the link and has not removed since.
	added map[netip.Addr]bool
}

// New returns a Manager for the link opts names. It does not touch the system.
func New(opts Options) (*Manager, error) {
	m := &Manager{name: opts.Name, alias: opts.Alias, add: opts.Add, added: map[netip.Addr]bool{}}
	if m.name == "" {
		m.name = DefaultName
	}
	if m.alias == "" {
		m.alias = DefaultAlias
	}
	if m.add == nil {
		m.add = netlink.LinkAdd
	}
	if err := ValidName(m.name); err != nil {
		return nil, err
	}
	return m, nil
}

// Name returns the link's name.
func (m *Manager) Name() string { return m.name }

// ValidName checks a link name the way the kernel does.
func ValidName(name string) error {
	if name == "" || len(name) >= unix.IFNAMSIZ || name == "." || name == ".." {
		return fmt.Errorf("invalid link name %q (1 to %d bytes, not . or ..)", name, unix.IFNAMSIZ-1)
	}
	for _, r := range name {
		if r == '/' || r == ':' || r <= ' ' || r > '~' {
			return fmt.Errorf("invalid link name %q: character %q", name, r)
		}
	}
	return nil
}

// Result says what Ensure found and did.
type Result struct {
	// Kind is the link's kind as the kernel reports it ("dummy", "bridge", ...).
	Kind string
	// Owned is true when the link carries our alias: we created it, now or earlier.
	Owned bool
	// Created is true when this call created the link.
	Created bool
	// FellBack is true when this call created a bridge because the kernel has no dummy type.
	FellBack bool
	// BroughtUp is true when this call set the link up.
	BroughtUp bool
	// Present lists the wanted addresses the link holds now.
	Present []netip.Addr
	// Added lists the addresses this call added; Removed those it removed because they are no longer wanted.
	Added, Removed []netip.Addr
	// Foreign lists addresses on the link that are neither wanted nor ours, kernel-made IPv6 link-local
	// addresses aside. They are left alone.
	Foreign []netip.Prefix
}

// Ensure makes the link exist, be up and hold the wanted addresses (as /32 and /128; IPv6 ones without
// duplicate address detection, so that they can be bound at once). It removes addresses it added earlier
// that are no longer wanted, and no others.
func (m *Manager) Ensure(ctx context.Context, want []netip.Addr) (Result, error) {
	var res Result
	l, err := m.lookup(ctx)
	if err != nil {
		return res, err
	}
	if l == nil {
		if l, res.FellBack, err = m.create(ctx); err != nil {
			return res, err
		}
		res.Created = true
	}
	res.Kind = l.Type()
	res.Owned = l.Attrs().Alias == m.alias
	if l.Attrs().Flags&net.FlagUp == 0 {
		if err := m.step(ctx, Change, "set link "+m.name+" up", func() error { return netlink.LinkSetUp(l) }); err != nil {
			return res, err
		}
		res.BroughtUp = true
	}

	have, err := m.addrs(ctx, l)
	if err != nil {
		return res, err
	}
	wanted := map[netip.Addr]bool{}
	for _, a := range want {
		a = a.Unmap()
		wanted[a] = true
		if _, ok := have[a]; ok {
			res.Present = append(res.Present, a)
			continue
		}
		op := fmt.Sprintf("add address %s to %s", hostPrefix(a), m.name)
		err := m.step(ctx, Change, op, func() error { return netlink.AddrAdd(l, netlinkAddr(a)) })
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return res, err
		}
		m.added[a] = true
		res.Added = append(res.Added, a)
		res.Present = append(res.Present, a)
	}
	for a := range m.added {
		if wanted[a] {
			continue
		}
		if _, ok := have[a]; ok {
			op := fmt.Sprintf("remove address %s from %s", hostPrefix(a), m.name)
			err := m.step(ctx, Change, op, func() error { return netlink.AddrDel(l, netlinkAddr(a)) })
			if err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
				return res, err
			}
			res.Removed = append(res.Removed, a)
		}
		delete(m.added, a)
	}
	for a, p := range have {
		if !wanted[a] && !slices.Contains(res.Removed, a) && (!a.Is6() || !a.IsLinkLocalUnicast()) {
			res.Foreign = append(res.Foreign, p)
		}
	}
	slices.SortFunc(res.Present, netip.Addr.Compare)
	slices.SortFunc(res.Added, netip.Addr.Compare)
	slices.SortFunc(res.Removed, netip.Addr.Compare)
	slices.SortFunc(res.Foreign, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	return res, nil
}

// Teardown removes the link if it is ours (it carries our alias); otherwise it removes only the addresses
// this Manager added. A missing link is not an error.
func (m *Manager) Teardown(ctx context.Context) error {
	l, err := m.lookup(ctx)
	if err != nil || l == nil {
		if l == nil && err == nil {
			clear(m.added)
		}
		return err
	}
	if l.Attrs().Alias == m.alias {
		err := m.step(ctx, Change, "delete link "+m.name, func() error { return netlink.LinkDel(l) })
		if err != nil && !isNotFound(err) {
			return err
		}
		clear(m.added)
		return nil
	}
	for a := range m.added {
		op := fmt.Sprintf("remove address %s from %s", hostPrefix(a), m.name)
		err := m.step(ctx, Change, op, func() error { return netlink.AddrDel(l, netlinkAddr(a)) })
		if err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			return err
		}
		delete(m.added, a)
	}
	return nil
}

// RemoveAddresses removes the given addresses from the link, whoever added them, and returns those it
// removed. Addresses the link does not hold, or a missing link, are not an error. The fail-open guard uses
// it to hand the kube-dns ClusterIP back to kube-proxy.
func (m *Manager) RemoveAddresses(ctx context.Context, addrs []netip.Addr) ([]netip.Addr, error) {
	l, err := m.lookup(ctx)
	if err != nil || l == nil {
		return nil, err
	}
	have, err := m.addrs(ctx, l)
	if err != nil {
		return nil, err
	}
	var removed []netip.Addr
	for _, a := range addrs {
		a = a.Unmap()
		if _, ok := have[a]; !ok {
			continue
		}
		op := fmt.Sprintf("remove address %s from %s", hostPrefix(a), m.name)
		err := m.step(ctx, Change, op, func() error { return netlink.AddrDel(l, netlinkAddr(a)) })
		if err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			return removed, err
		}
		delete(m.added, a)
		removed = append(removed, a)
	}
	return removed, nil
}

// Addresses returns the addresses the link holds, kernel-made IPv6 link-local ones aside, sorted; none when
// there is no link.
func (m *Manager) Addresses(ctx context.Context) ([]netip.Addr, error) {
	l, err := m.lookup(ctx)
	if err != nil || l == nil {
		return nil, err
	}
	have, err := m.addrs(ctx, l)
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for a := range have {
		if !a.Is6() || !a.IsLinkLocalUnicast() {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out, nil
}

// AddAddresses puts addrs on the link, if there is one, and returns those it added; it creates no link.
// The fail-open guard uses it to give back an address it removed while the cache was taking the node
// back. Addresses it adds are not this Manager's to remove later.
func (m *Manager) AddAddresses(ctx context.Context, addrs []netip.Addr) ([]netip.Addr, error) {
	l, err := m.lookup(ctx)
	if err != nil || l == nil {
		return nil, err
	}
	have, err := m.addrs(ctx, l)
	if err != nil {
		return nil, err
	}
	var added []netip.Addr
	for _, a := range addrs {
		a = a.Unmap()
		if _, ok := have[a]; ok {
			continue
		}
		op := fmt.Sprintf("add address %s to %s", hostPrefix(a), m.name)
		err := m.step(ctx, Change, op, func() error { return netlink.AddrAdd(l, netlinkAddr(a)) })
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return added, err
		}
		added = append(added, a)
	}
	return added, nil
}

// lookup returns the link, or nil when there is none.
func (m *Manager) lookup(ctx context.Context) (netlink.Link, error) {
	var l netlink.Link
	err := m.step(ctx, Check, "look up link "+m.name, func() (err error) {
		l, err = netlink.LinkByName(m.name)
		return err
	})
	if err != nil {
		if _, ok := errors.AsType[netlink.LinkNotFoundError](err); ok {
			return nil, nil
		}
		return nil, err
	}
	return l, nil
}

// create adds the link: a dummy, or a bridge where the kernel has no dummy type.
func (m *Manager) create(ctx context.Context) (netlink.Link, bool, error) {
	attrs := netlink.NewLinkAttrs()
	attrs.Name = m.name
	attrs.Alias = m.alias
	fellBack := false
	err := m.step(ctx, Change, "create dummy link "+m.name, func() error { return m.add(&netlink.Dummy{LinkAttrs: attrs}) })
	if errors.Is(err, unix.EOPNOTSUPP) {
		fellBack = true
		err = m.step(ctx, Change, "create bridge link "+m.name+" (the kernel has no dummy link type)", func() error {
			return m.add(&netlink.Bridge{LinkAttrs: attrs})
		})
	}
	if err != nil && !errors.Is(err, unix.EEXIST) {
		return nil, fellBack, err
	}
	l, err := m.lookup(ctx)
	if err != nil {
		return nil, fellBack, err
	}
	if l == nil {
		return nil, fellBack, &Error{Phase: Check, Op: "look up link " + m.name, Err: errors.New("gone right after it was created")}
	}
	// Kernels that ignore the alias at creation get it set explicitly.
	if l.Attrs().Alias != m.alias {
		if err := m.step(ctx, Change, "set alias of link "+m.name, func() error { return netlink.LinkSetAlias(l, m.alias) }); err != nil {
			return nil, fellBack, err
		}
		l.Attrs().Alias = m.alias
	}
	return l, fellBack, nil
}

// addrs returns the link's addresses by IP.
func (m *Manager) addrs(ctx context.Context, l netlink.Link) (map[netip.Addr]netip.Prefix, error) {
	var list []netlink.Addr
	err := m.step(ctx, Check, "list addresses of "+m.name, func() (err error) {
		// A dump interrupted by a concurrent change may be incomplete; ask again.
		for range 3 {
			if list, err = netlink.AddrList(l, netlink.FAMILY_ALL); !errors.Is(err, netlink.ErrDumpInterrupted) {
				return err
			}
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	have := map[netip.Addr]netip.Prefix{}
	for _, a := range list {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		ones, _ := a.Mask.Size()
		ip = ip.Unmap()
		have[ip] = netip.PrefixFrom(ip, ones)
	}
	return have, nil
}

// step runs one netlink call unless ctx has ended, and wraps its error with what it was doing.
func (m *Manager) step(ctx context.Context, phase Phase, op string, call func() error) error {
	if err := ctx.Err(); err != nil {
		return &Error{Phase: phase, Op: op, Err: err}
	}
	if err := call(); err != nil {
		return &Error{Phase: phase, Op: op, Err: err}
	}
	return nil
}

func isNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf) || errors.Is(err, unix.ENODEV)
}

func hostPrefix(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, a.BitLen()) }

func netlinkAddr(a netip.Addr) *netlink.Addr {
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(a.BitLen(), a.BitLen())}}
	if a.Is6() {
		addr.Flags = unix.IFA_F_NODAD
	}
	return addr
}
