//go:build linux

package main

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"time"

	"github.com/nodelocaldns/nodelocaldns/corefile"
	"github.com/nodelocaldns/nodelocaldns/internal/kubeclient"
	"github.com/nodelocaldns/nodelocaldns/plugin/upstreamsvc"
)

// upstreamLookupTimeout bounds each question to the API for a Service's ClusterIPs at start: an API that
// does not answer costs the start this much, and what it would have given is logged as missing.
const upstreamLookupTimeout = 5 * time.Second

// clusterIPsFunc returns the ClusterIPs of Service service (in kube-system), primary family first; a nil
// slice and a reason when there is no API to ask.
type clusterIPsFunc func(ctx context.Context, service string) (ips []netip.Addr, noAPI string, err error)

// apiClusterIPs is the clusterIPsFunc of the Kubernetes API that kubeconfig (the -kubeconfig flag), or the
// Pod's ServiceAccount, reaches.
func apiClusterIPs(kubeconfig string) clusterIPsFunc {
	return func(ctx context.Context, service string) ([]netip.Addr, string, error) {
		rc, reason, err := kubeclient.Config(kubeconfig, dsUserAgent)
		if err != nil || rc == nil {
			return nil, reason, err
		}
		ips, err := upstreamsvc.ClusterIPs(ctx, rc, corefile.DefaultNamespace, service)
		return ips, "", err
	}
}

// completeUpstream adds to upstream (the -upstreamsvc Service's ClusterIPs that the kubelet's variable
// gave: the primary family's only) the Service's ClusterIP of every family that divert, the local addresses
// diverted to it, needs and upstream lacks, asking lookup: on a dual-stack node the IPv6 link-local address
// is diverted to the Service's IPv6 ClusterIP, which no variable names. Nothing is asked when upstream
// covers every family already (a single-stack node). A family the lookup cannot fill is logged: its
// addresses go undiverted when the node is handed over or failed open.
func completeUpstream(ctx context.Context, service string, divert, upstream []netip.Addr, lookup clusterIPsFunc) []netip.Addr {
	if len(uncovered(divert, upstream)) == 0 {
		return upstream
	}
	ips, err := askClusterIPs(ctx, lookup, service)
	out := slices.Clone(upstream)
	for _, ip := range ips {
		if ip = ip.Unmap(); len(uncovered([]netip.Addr{ip}, out)) > 0 && len(uncovered(divert, []netip.Addr{ip})) < len(divert) {
			out = append(out, ip)
		}
	}
	if left := uncovered(divert, out); len(left) > 0 {
		why := "the Service has no ClusterIP of their family"
		if err != nil {
			why = err.Error()
		}
		log.Warningf("no ClusterIP of Service %s for %v (%s): they go undiverted when the node is handed over or failed open; -guard.upstreamips names them for the guard",
			service, left, why)
	}
	return out
}

// askClusterIPs asks lookup for the ClusterIPs of Service service, for at most upstreamLookupTimeout; no API
// to ask is an error saying why.
func askClusterIPs(ctx context.Context, lookup clusterIPsFunc, service string) ([]netip.Addr, error) {
	ctx, cancel := context.WithTimeout(ctx, upstreamLookupTimeout)
	defer cancel()
	ips, noAPI, err := lookup(ctx, service)
	if err == nil && ips == nil {
		err = errors.New(noAPI)
	}
	return ips, err
}

// kubeDNSService is the Service whose ClusterIP Pods are told to ask (kubelet's --cluster-dns), in
// kube-system; Kubernetes names its primary family's in $KUBE_DNS_SERVICE_HOST.
const kubeDNSService = "kube-dns"

// kubeDNSAddresses returns those of local that are the kube-dns ClusterIP $KUBE_DNS_SERVICE_HOST names
// (read through getenv): none in IPVS mode, where the ClusterIP is not a local address.
func kubeDNSAddresses(local []netip.Addr, getenv func(string) string) []netip.Addr {
	ip, err := netip.ParseAddr(getenv(serviceHostVar(kubeDNSService)))
	if err != nil {
		return nil
	}
	var out []netip.Addr
	for _, a := range local {
		if a.Unmap() == ip.Unmap() {
			out = append(out, a.Unmap())
		}
	}
	return out
}

// completeKubeDNS adds to services (kubeDNSAddresses: the primary family's kube-dns ClusterIP, when it
// is a local address) the local addresses of the other family that are kube-dns ClusterIPs too, asking
// lookup: on a dual-stack node in iptables mode the cache holds both ClusterIPs, and no variable names the
// IPv6 one. Nothing is asked when the variable's ClusterIP is not local (IPVS mode: neither family's is)
// or every local address is of its family. When the lookup fails, the other family's ClusterIP is treated
// as a local address like the link-local one (diverted to kube-dns-upstream at a hand-over instead of
// given back to kube-proxy: answered either way), and that is logged.
func completeKubeDNS(ctx context.Context, local, services []netip.Addr, lookup clusterIPsFunc) []netip.Addr {
	others := uncovered(local, services)
	if len(services) == 0 || len(others) == 0 {
		return services
	}
	ips, err := askClusterIPs(ctx, lookup, kubeDNSService)
	if err != nil {
		log.Warningf("asking for the ClusterIPs of Service %s that $%s does not name: %v; those of %v that are its ClusterIPs are diverted at a hand-over, as the link-local address is, instead of given back to kube-proxy",
			kubeDNSService, serviceHostVar(kubeDNSService), err, others)
		return services
	}
	out := slices.Clone(services)
	for _, a := range others {
		if slices.ContainsFunc(ips, func(ip netip.Addr) bool { return ip.Unmap() == a.Unmap() }) {
			out = append(out, a.Unmap())
		}
	}
	return out
}

// uncovered returns the addresses of addrs of a family that none of ips is of.
func uncovered(addrs, ips []netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, a := range addrs {
		if !slices.ContainsFunc(ips, func(ip netip.Addr) bool { return ip.Unmap().Is4() == a.Unmap().Is4() }) {
			out = append(out, a)
		}
	}
	return out
}

// divertedAddrs returns the local addresses that are not Service addresses: those diverted to
// kube-dns-upstream.
func divertedAddrs(local, services []netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, a := range local {
		if !slices.Contains(services, a.Unmap()) {
			out = append(out, a.Unmap())
		}
	}
	return out
}
