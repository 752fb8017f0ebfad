// Package nodelocal puts in place, and keeps in place, what a node-local DNS cache needs from the node: a
// link holding the cache's addresses and iptables rules that exempt its traffic from connection tracking
// and let it through the filter table.
//
// A Reconciler owns both for one node. New takes an exclusive node lock (see package nodelock); users then
// Acquire leases, each claiming addresses and ports, and the Reconciler serves their union:
//
//   - the link (named nodelocaldns, of kind dummy, or a bridge with no ports where the kernel has no dummy
//     type) is up and holds every claimed address as /32 or /128, IPv6 ones usable at once; addresses we
//     did not add are reported, never removed (package link);
//   - chains of our own in the raw and the filter table of iptables and ip6tables, reached by one jump at
//     position 1 of PREROUTING, OUTPUT and INPUT, hold a NOTRACK and an ACCEPT rule for traffic to and from
//     each address and port (package rules). The backend, legacy or nft, is the one kube-proxy's rules
//     live in unless configured.
//
// Acquire puts a lease's addresses in place before it returns; its rules follow at once or, with
// Claim.DeferRules, when Lease.EnableRules is called (once the server answers, so that no traffic is sent
// to a cache that is not there yet). Ensure repairs whatever changed behind our back and Run calls it
// periodically; a sync that finds everything in place only reads a few chains, and its cost does not grow
// with kube-proxy's rules. The last Release, or Teardown, removes the jumps, our chains, and the addresses
// we added or the link we created. Every call that blocks takes a context and honours its deadline.
//
// Every rule of the cache's and its guard's goes through one firewall interface, whose two implementations
// are iptables (legacy or nft, package rules' Manager) and tables of our own over netlink (nftables, its
// NFTablesManager); one policy chooses between them for every user on the node, and nothing else branches
// on the backend. InspectRules reads what the node holds, for checks after a rollout.
//
// Errors are *Error values whose Kind matches Kubernetes' node-cache error types (iptables, iptables_lock,
// interface_add, interface_check), for metrics; see KindOf and Kinds. Status gives a snapshot for
// readiness checks.
//
// A Guard, in another process beside the cache, fails the node open when the cache stops answering: it
// diverts the link-local address to the kube-dns-upstream Service, takes the cache's jumps out and hands
// the kube-dns ClusterIP back to kube-proxy. The cache takes the node back with Lease.EnableRules or
// Reconciler.Reclaim once it answers; until then Ensure leaves the jumps out. Preflight checks a node before
// a rollout.
//
// A Succession is a process's part in its node's changes of hands, with no moment in which nobody answers
// (a rolling update that surges, a restart, a successor that dies midway). It reaches the DNS server only
// through narrow hooks (a probe only this server answers, the count of queries in flight, and the caller's
// Own and Release of the Reconciler); it steers the shared reuseport groups and drains the sockets itself:
//
//	Alone ── New fails (the lock is held), Queue ──► Waiting ── owner let go, server answers ──► TakingOver
//	  │                                                 │                                            │
//	  │ New, Own                  owner let go before   │ (Own: OwnerLeftFirst)       groups steered │ (Own: TookOver)
//	  │                           the server answered   ▼                                            ▼
//	  └───────────────────────────────────────────────► Owning ◄─────────────────────────────────────┘
//	                                                     │   ▲
//	                           successor Ready: HandOff, │   │ successor left without taking the node
//	                           Release; all stays as is  ▼   │ (Own: TookBack)
//	                                                   HandedOff: answers what still reaches it
//
// Leave ends it at exit: from Waiting it leaves the line; from HandedOff it hands the TCP listeners over
// and drains the sockets, or, orphaned, owns the node again (Own: AtExit); from TakingOver it owns the
// node at once (Own: AtExit); an owner then hands the node to the cluster DNS (HandOverAtExit) or tears
// it down, and the next start takes it back once it answers.
//
// Nothing here depends on CoreDNS; the notrack plugin of this repository is one user. Everything here but
// the errors is Linux's: on other systems the package builds with only its errors, ErrNotLinux among them,
// and its subpackages do not build at all.
package nodelocal
