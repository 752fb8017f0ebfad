// Package corefile writes and checks the Corefiles of a Kubernetes node-local DNS cache.
//
// A node cache's Corefile comes from one of two places, and both go through Expand:
//
//   - a typed Config: Render(c) is Expand(Template(c), c.Expansion(), ...), where Template is the
//     node-local-dns ConfigMap Corefile with upstream's __PILLAR__ variables in it;
//   - upstream's drop-in arrangement: a base Corefile (the node-local-dns ConfigMap, often upstream's own
//     template), node-cache's flags (an Expansion), and the kube-dns ConfigMap (KubeDNS, with stubDomains and
//     upstreamNameservers). DropIn keeps the result up to date as the ConfigMaps change.
//
// Expand fills the variables in with upstream's meanings and turns the flags into directives: notrack in
// every block that binds, and upstreamsvc in place of the forward to the cluster DNS. Check finds the
// Corefile lines that break or endanger a node (forwarding loops, open resolvers, UDP through the Service
// DNAT, listeners on every address, caches larger than the memory limit), each with a fix.
package corefile
