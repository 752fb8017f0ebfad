//go:build linux

package conformance

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/test/simnode"
)

// server is one address a Pod's lookups can go to.
type server struct {
	label string
	ip    string
}

// servers are the paths every lookup is compared on: the node cache on both node-local addresses, and the
// cluster DNS straight (its Pod IP, which kube-proxy's rules would DNAT the ClusterIP to without the cache).
var (
	viaLinkLocal = server{"the node cache on " + simnode.LinkLocalIP, simnode.LinkLocalIP}
	viaClusterIP = server{"the node cache on the kube-dns ClusterIP " + simnode.KubeDNSClusterIP, simnode.KubeDNSClusterIP}
	straight     = server{"the cluster DNS straight at " + simnode.ClusterDNSPodIP, simnode.ClusterDNSPodIP}
	servers      = []server{viaLinkLocal, viaClusterIP, straight}
	// cacheServers are the node cache's paths alone.
	cacheServers = []server{viaLinkLocal, viaClusterIP}
)

// dig asks ip for name and qtype from the Pod's namespace over network ("udp" or "tcp"), with the Pod's
// search list when search is set (dig +search, as the e2e probes ask), and returns the answer section:
// each record as "owner TYPE rdata", owner in lower case, TTL left out, sorted.
func (r *rig) dig(ip, network, name, qtype string, search bool) ([]string, error) {
	rrs, err := r.digRRs(ip, network, name, qtype, search)
	if err != nil {
		return nil, err
	}
	return records(rrs), nil
}

// digRRs is dig's answer section as records, TTLs kept.
func (r *rig) digRRs(ip, network, name, qtype string, search bool) ([]dns.RR, error) {
	args := []string{"+noall", "+answer", "+time=5", "+tries=1", "@" + ip, name, qtype}
	if network == "tcp" {
		args = append(args, "+tcp")
	} else {
		args = append(args, "+notcp")
	}
	if search {
		args = append(args, "+search")
	}
	if search {
		r.n.SetPodResolvConf(ip, testNamespace, r.extraSearch...)
	}
	out, err := r.n.In(context.Background(), r.n.PodNS, "dig", args...)
	if err != nil {
		return nil, err
	}
	var rrs []dns.RR
	for line := range strings.SplitSeq(out, "\n") {
		if line = strings.TrimSpace(line); line == "" || strings.HasPrefix(line, ";") {
			continue
		}
		rr, err := dns.NewRR(line)
		if err != nil {
			return nil, fmt.Errorf("dig %s: reading %q: %w", strings.Join(args, " "), line, err)
		}
		rrs = append(rrs, rr)
	}
	return rrs, nil
}

// records formats rrs as dig returns them: "owner TYPE rdata", sorted.
func records(rrs []dns.RR) []string {
	out := make([]string, 0, len(rrs))
	for _, rr := range rrs {
		rr = dns.Copy(rr)
		h := rr.Header()
		header := h.String()
		rdata := strings.TrimPrefix(rr.String(), header)
		out = append(out, strings.ToLower(h.Name)+" "+dns.TypeToString[h.Rrtype]+" "+rdata)
	}
	slices.Sort(out)
	return out
}

// resolved is what getaddrinfo returned: the addresses, sorted and without repeats, and the canonical name.
type resolved struct {
	addrs     []string
	canonical string
}

func (g resolved) String() string { return fmt.Sprintf("%v (canonical %q)", g.addrs, g.canonical) }

// glibc resolves name with glibc's getaddrinfo in the Pod (getent ahosts, AF_UNSPEC), with the Pod's
// resolv.conf naming ip.
func (r *rig) glibc(ip, name string) (resolved, error) {
	r.n.SetPodResolvConf(ip, testNamespace, r.extraSearch...)
	out, err := r.n.In(context.Background(), r.n.PodNS, "getent", "ahosts", name)
	if err != nil {
		return resolved{}, err
	}
	var g resolved
	for i, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if !slices.Contains(g.addrs, f[0]) {
			g.addrs = append(g.addrs, f[0])
		}
		if i == 0 && len(f) == 3 {
			g.canonical = f[2]
		}
	}
	slices.Sort(g.addrs)
	return g, nil
}

// muslLookup resolves name with the static musl client in the Pod, with the Pod's resolv.conf naming ip.
func (r *rig) muslLookup(ip, name string) (resolved, error) {
	r.n.SetPodResolvConf(ip, testNamespace, r.extraSearch...)
	out, err := r.n.In(context.Background(), r.n.PodNS, r.musl, name)
	if err != nil {
		return resolved{}, err
	}
	var g resolved
	for line := range strings.SplitSeq(strings.TrimSpace(out), "\n") {
		if c, ok := strings.CutPrefix(line, "canonical "); ok {
			g.canonical = c
		} else if line != "" && !slices.Contains(g.addrs, line) {
			g.addrs = append(g.addrs, line)
		}
	}
	slices.Sort(g.addrs)
	return g, nil
}
