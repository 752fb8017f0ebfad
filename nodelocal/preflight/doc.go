// Package preflight checks a node before a node-local DNS cache rolls out onto it, read-only: kube-proxy's
// mode and where its rules live, the kubelet's cluster DNS, the cache's addresses, its rules backend, other
// node caches, rules of others ahead of where the cache's jumps go, resolv.conf, the capabilities and the
// xtables lock. Run returns Findings graded by Severity; an error means the cache would not work, or would
// break the node's DNS. node-cache -preflight prints them.
package preflight
