// Package conformance runs the cases of Kubernetes' DNS conformance tests (test/e2e/network/dns.go and
// dns_configmap.go) on a simulated node (package simnode) whose cluster DNS is CoreDNS with its kubernetes
// plugin, reading a real kube-apiserver (package kubeapi), behind the node cache started as the manifests
// start it.
//
// The API server's Service range is the cluster's 10.96.0.0/16, so the Services kube-dns (10.96.0.10) and
// kube-dns-upstream (10.96.0.11) created through it have the ClusterIPs the simulated kube-proxy DNATs to the
// cluster-DNS Pod, and "kubernetes" is 10.96.0.1. No controller manager runs: the test writes each Service's
// EndpointSlices as the EndpointSlice controller would from the Pods it creates (addresses from the Pods'
// status, hostnames of Pods whose subdomain names the Service), and sets the Pods' status as the kubelet
// would. The cluster DNS is examples/coredns with kubeadm's Corefile (kubernetes cluster.local in-addr.arpa
// ip6.arpa with pods insecure, fallthrough and ttl 30, forward to the node's resolver, cache 30 with the
// cluster domain left out), reaching the API through a relay into its namespace with a ServiceAccount token
// bound to CoreDNS's ClusterRole. The node cache is cmd/node-cache with the DaemonSet's arguments of
// examples/kubernetes/nodelocaldns-iptables.yaml, its ConfigMap's Corefile and the kube-dns ConfigMap as
// projected volumes (package configmapvolume), and finds kube-dns-upstream by the variables the kubelet sets.
//
// Every name is asked from the Pod's namespace (resolv.conf of a ClusterFirst Pod in the test's namespace:
// its search list, ndots:5) through the node cache on 169.254.20.10 and on the kube-dns ClusterIP, and
// straight from the cluster DNS's Pod IP; by dig over UDP and over TCP, by glibc's getaddrinfo (getent
// ahosts) and by a static musl client (testdata/getaddrinfo.c, built with musl-gcc: A and AAAA in parallel,
// no TCP fallback). Every answer is compared with what the API objects say, so the paths agree with each
// other; through the node cache a fully qualified name's whole reply (rcode, flags, answer and additional
// sections) is compared with the cluster DNS's own, every TTL must be inside the cache's 5-30 s window, and
// no lookup may reach the cluster DNS from the Pod's own address (kube-proxy's DNAT instead of the cache).
//
// The cases: the cluster's names and partial names (dns.go's "for the cluster", "partial qualified names");
// headless and ClusterIP Services with SRV records and the PTR of a ClusterIP ("for services"); a Service
// with two EndpointSlices and no selector; a Pod's hostname and subdomain ("for pods for Hostname",
// "Subdomain"); Pod A records (pods insecure); a headless Service with more endpoints than a 512-byte UDP
// reply holds; the Pod's long and odd search lists ("more than 6 DNS search paths", "an underscore and a
// single dot"); an ExternalName Service whose target changes and which becomes a ClusterIP Service ("for
// ExternalName services"), within validateTargetedProbeOutput's bound; the kube-dns ConfigMap's stub domain
// and upstream nameservers appearing and going away (dns_configmap.go's "Change stubDomain", its kube-dns
// branch), within its bound; and the same three dns_configmap.go cases the way they configure a CoreDNS
// cluster DNS (its own Corefile, reloaded), where only the cluster's zones reach it through the node cache.
//
// It needs root, the binaries of `make test-deps` (etcd, kube-apiserver), ip, iptables, conntrack, dig,
// getent and musl-gcc; under `make test` a missing one is a failure.
//
//	NODELOCALDNS_REQUIRE_PRIVILEGED=1 go test -v -count=1 ./test/conformance/
package conformance
