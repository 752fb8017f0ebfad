package nodelocal

import (
	"errors"
	"slices"
)

// Kind classifies an error for metrics. The first four are the error types of Kubernetes' node-cache, so
// dashboards built for it keep working.
type Kind string

// The kinds.
const (
	// KindIPTables is a failed iptables command.
	KindIPTables Kind = "iptables"
	// KindIPTablesLock is an iptables command that gave up waiting for the xtables lock.
	KindIPTablesLock Kind = "iptables_lock"
	// KindInterfaceAdd is a failed change to the link: creating it, bringing it up, adding an address.
	KindInterfaceAdd Kind = "interface_add"
	// KindInterfaceCheck is a failed look at the link or its addresses.
	KindInterfaceCheck Kind = "interface_check"
	// KindNodeLock is another process owning the node (see nodelock.HeldError).
	KindNodeLock Kind = "node_lock"
	// KindConfig is a configuration that cannot work.
	KindConfig Kind = "config"
)

// Error is an error of this package: what was being done, and its Kind.
type Error struct {
	Kind Kind
	// Op says what was being done, e.g. "sync IPv6 rules".
	Op  string
	Err error
}

func (e *Error) Error() string { return "nodelocal: " + e.Op + ": " + e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// ErrNotLinux says that what was asked needs Linux. The link, the rules and the node lock are netlink,
// iptables or nftables and Linux's file locks, so elsewhere this package holds only its errors, for programs
// (the notrack plugin, say) that must build everywhere and say at run time why they cannot work there.
var ErrNotLinux = errors.New("nodelocal: needs Linux (netlink, iptables, nftables)")

// ErrClosed is returned by a Reconciler after Close.
var ErrClosed = errors.New("nodelocal: reconciler is closed")

// ErrReleased is returned by a Lease after Release (or after the Reconciler's Teardown released it).
var ErrReleased = errors.New("nodelocal: lease is released")

// KindOf returns the Kind of the first *Error in err's tree, or "" when there is none.
func KindOf(err error) Kind {
	if e, ok := errors.AsType[*Error](err); ok {
		return e.Kind
	}
	return ""
}

// Kinds returns the distinct Kinds in err's tree, in the order they appear. A sync that fails in more than
// one way (the link and the IPv6 rules, say) joins its errors; a metric counts each kind.
func Kinds(err error) []Kind {
	var kinds []Kind
	var walk func(error)
	walk = func(err error) {
		if err == nil {
			return
		}
		if e, ok := err.(*Error); ok {
			if slices.Contains(kinds, e.Kind) {
				return
			}
			kinds = append(kinds, e.Kind)
			return
		}
		switch u := err.(type) {
		case interface{ Unwrap() []error }:
			for _, inner := range u.Unwrap() {
				walk(inner)
			}
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		}
	}
	walk(err)
	return kinds
}
