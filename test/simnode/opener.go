//go:build linux

package simnode

// OpenerIn opens connections (or sockets, or anything a dial makes) with dial in namespace ns, on one
// goroutine that lives there, for callers on any goroutine: open asks it for one and fails once the goroutine
// has ended; stop ends it. It is the opener the loads use, for tests that keep sockets of their own in a
// namespace, such as a stand-in server that connects to another server in its namespace for each query.
func OpenerIn[C any](n *Node, ns string, dial func() (C, error)) (open func() (C, error), stop func()) {
	return dialerIn(n, ns, dial)
}
