//go:build linux

package conformance

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/test/simnode"
)

// Bounds of the e2e tests' own waits, used as this test's failure bounds for the same changes.
const (
	// probeBound is assertFilesContain's: the e2e reads a probe Pod's results every 5 s for up to 600 s
	// (dns_common.go), in validateTargetedProbeOutput too, which the ExternalName test uses.
	probeBound = 600 * time.Second
	// probeInterval is the probe Pods' `sleep 1` between two digs.
	probeInterval = time.Second
	// configMapBound is dns_configmap.go's moreForeverTestTimeout, polled every second.
	configMapBound = 2 * time.Minute
)

// lookup is one name a case asks, and what the API objects say it must answer.
type lookup struct {
	name, qtype string
	// want is the answer section, as records formats it.
	want []string
	// addrs is what getaddrinfo must return, sorted; nil: the name is not asked with getaddrinfo (SRV,
	// PTR, CNAME).
	addrs []string
	// canonical, when set, is getaddrinfo's canonical name.
	canonical string
	// muslAddrs, when set, is what musl's getaddrinfo must return instead of addrs.
	muslAddrs []string
}

// forRig returns a copy of r that fails t, for a subtest.
func (r *rig) forRig(t *testing.T) *rig {
	c := *r
	c.t = t
	return &c
}

// check asks l on every server in on, by dig over UDP and TCP with the Pod's search list, and (when
// l.addrs is set) by glibc's and musl's getaddrinfo, and compares every answer with l; through the node
// cache, a fully qualified name's whole reply is compared with the cluster DNS's own too. A lookup through
// the node cache that reached the cluster DNS from the Pod's own address (kube-proxy's DNAT instead of the
// cache) fails as well.
func (r *rig) check(t *testing.T, l lookup, on []server) {
	t.Helper()
	for _, m := range r.mismatches(l, on) {
		t.Error(m)
	}
}

// waitAgree waits, within eventually, until check of l on every server would pass: after a change, every
// entry the node cache holds for the name (one per query flavour: dig's EDNS query with the AD bit, and
// the plain queries of glibc and musl, are separate entries, each with its own TTL) has expired.
func (r *rig) waitAgree(t *testing.T, l lookup) {
	t.Helper()
	start := time.Now()
	for {
		last := r.mismatches(l, servers)
		if len(last) == 0 {
			break
		}
		if time.Since(start) > eventually {
			t.Fatalf("every client agreeing on %s %s: not within %v; the last round:\n%s", l.name, l.qtype, eventually, strings.Join(last, "\n"))
		}
		time.Sleep(probeInterval)
	}
	t.Logf("every client and path answered %s %s as the API says %v later", l.name, l.qtype, time.Since(start).Round(100*time.Millisecond))
}

// mismatches is check's findings.
func (r *rig) mismatches(l lookup, on []server) []string {
	var found []string
	fail := func(format string, args ...any) { found = append(found, fmt.Sprintf(format, args...)) }
	want := slices.Sorted(slices.Values(l.want))
	for _, s := range on {
		mark := 0
		if s != straight {
			mark = r.barrier()
		}
		for _, network := range []string{"udp", "tcp"} {
			rrs, err := r.digRRs(s.ip, network, l.name, l.qtype, true)
			if err != nil {
				fail("%s %s over %s at %s: %v", l.name, l.qtype, network, s.label, err)
				continue
			}
			if got := records(rrs); !slices.Equal(got, want) {
				fail("%s %s over %s at %s:\n got %q\nwant %q (what the API objects say)", l.name, l.qtype, network, s.label, got, want)
			}
			// Through the node cache every TTL is inside clamp's success window (the manifest's 5-30 s).
			for _, rr := range rrs {
				if ttl := rr.Header().Ttl; s != straight && (ttl < 5 || ttl > 30) {
					fail("%s %s over %s at %s: TTL %d outside the node cache's window of 5-30 s: %s", l.name, l.qtype, network, s.label, ttl, rr)
				}
			}
		}
		if l.addrs != nil {
			muslAddrs := l.addrs
			if l.muslAddrs != nil {
				muslAddrs = l.muslAddrs
			}
			for _, c := range []struct {
				client string
				lookup func(ip, name string) (resolved, error)
				want   []string
			}{{"glibc's getaddrinfo", r.glibc, l.addrs}, {"musl's getaddrinfo", r.muslLookup, muslAddrs}} {
				got, err := c.lookup(s.ip, l.name)
				switch {
				case err != nil:
					fail("%s of %s at %s: %v", c.client, l.name, s.label, err)
				case !slices.Equal(got.addrs, c.want):
					fail("%s of %s at %s: %v, want %v", c.client, l.name, s.label, got, c.want)
				case l.canonical != "" && got.canonical != l.canonical:
					fail("%s of %s at %s: canonical name %q, want %q", c.client, l.name, s.label, got.canonical, l.canonical)
				}
			}
		}
		if s == straight {
			continue
		}
		if leaked := leakedQueries(r.clusterDNS.Output(), mark); len(leaked) > 0 {
			fail("%s %s at %s reached the cluster DNS from the Pod's address, not through the node cache:\n%s",
				l.name, l.qtype, s.label, strings.Join(leaked, "\n"))
		}
		found = append(found, r.compareReplies(l, s)...)
	}
	return found
}

// compareReplies compares, for a name asked as it is (a fully qualified one: no search list), the whole
// reply through the node cache at s with the cluster DNS's own over UDP and TCP, for a plain query (glibc's
// and musl's) and for one with EDNS and the AD bit (dig's): the rcode, the authoritative, truncation and AD
// bits, the answer, authority and additional sections (TTLs, the SOA's serial and MINIMUM aside), the OPT record and
// its DO bit. The cluster DNS's kubernetes plugin answers the queries of its zones with the same records
// whatever the cache holds, so a difference is the cache's.
func (r *rig) compareReplies(l lookup, s server) []string {
	if !strings.HasSuffix(l.name, ".cluster.local") && !strings.HasSuffix(l.name, ".arpa") {
		return nil
	}
	var found []string
	for _, network := range []string{"udp", "tcp"} {
		for _, edns := range []bool{false, true} {
			query := func() *dns.Msg {
				m := new(dns.Msg)
				m.SetQuestion(dns.Fqdn(l.name), dns.StringToType[l.qtype])
				if edns {
					m.AuthenticatedData = true
					m.SetEdns0(1232, false)
				}
				return m
			}
			flavour := "a plain query"
			if edns {
				flavour = "an EDNS query with AD"
			}
			direct, err := r.n.Exchange(r.n.PodNS, network, query(), straight.ip+":53")
			if err != nil {
				found = append(found, fmt.Sprintf("%s %s, %s over %s at %s: %v", l.name, l.qtype, flavour, network, straight.label, err))
				continue
			}
			cached, err := r.n.Exchange(r.n.PodNS, network, query(), s.ip+":53")
			if err != nil {
				found = append(found, fmt.Sprintf("%s %s, %s over %s at %s: %v", l.name, l.qtype, flavour, network, s.label, err))
				continue
			}
			if d, c := summary(direct), summary(cached); d != c {
				found = append(found, fmt.Sprintf("%s %s, %s over %s: the reply at %s differs from the cluster DNS's own:\n%s\nthe cluster DNS's:\n%s",
					l.name, l.qtype, flavour, network, s.label, c, d))
			}
		}
	}
	return found
}

// summary is what compareReplies compares of a reply.
func summary(m *dns.Msg) string {
	var extra, ns []dns.RR
	for _, rr := range m.Extra {
		if rr.Header().Rrtype != dns.TypeOPT {
			extra = append(extra, rr)
		}
	}
	for _, rr := range m.Ns {
		if soa, ok := rr.(*dns.SOA); ok {
			// The serial is the cluster DNS's last change; clamp keeps the MINIMUM, a negative TTL, in its
			// denial window, as it does the SOA's own TTL.
			soa = dns.Copy(soa).(*dns.SOA)
			soa.Serial, soa.Minttl = 0, 0
			rr = soa
		}
		ns = append(ns, rr)
	}
	opt := "no OPT"
	if o := m.IsEdns0(); o != nil {
		opt = fmt.Sprintf("OPT do %v", o.Do())
	}
	return fmt.Sprintf("rcode %s, aa %v, tc %v, ad %v, %s\nanswer %q\nauthority %q\nadditional %q", dns.RcodeToString[m.Rcode], m.Authoritative,
		m.Truncated, m.AuthenticatedData, opt, records(m.Answer), records(ns), records(extra))
}

// barrier asks the cluster DNS straight from the Pod for a name of its own, twice in turn, waiting each time
// until its query log holds it, and returns the log's length after the second: the lines of the Pod's
// earlier straight lookups are before it. CoreDNS logs a query after answering it, in the query's own
// goroutine, so on a loaded machine the line of a lookup answered before the first barrier was sent can
// still come after that barrier's line (seen once under make test); the second round gives it a whole
// round trip more.
func (r *rig) barrier() int {
	r.t.Helper()
	end := 0
	for range 2 {
		name := fmt.Sprintf("barrier-%d.nodelocaldns-conformance.cluster.local", r.barriers.Add(1))
		if _, err := r.n.Query(r.n.PodNS, "udp", straight.ip+":53", name, dns.TypeA); err != nil {
			r.t.Fatal(err)
		}
		if simnode.WaitForQueries(r.clusterDNS, name, "udp", 1, eventually) == 0 {
			r.t.Fatalf("the cluster DNS never logged %s", name)
		}
		out := r.clusterDNS.Output()
		end = strings.Index(out, dns.Fqdn(name)) + len(name)
	}
	return end
}

// leakedQueries returns the lines of a CoreDNS query log after mark whose client is the Pod, less those from
// a socket the log names before mark. Those are the late lines of a lookup answered before the mark: the
// previous check's, straight from the cluster DNS, whose A and AAAA queries glibc and musl send from one
// socket. A line can come later than the barrier's (see barrier): once under make test, an AAAA query's
// line came after both barriers' while its A query's came before them. A lookup through the node cache
// asks from sockets of its own, opened after the mark.
func leakedQueries(log string, mark int) []string {
	before := map[string]bool{}
	for _, line := range podQueries(log[:mark]) {
		before[queryClient(line)] = true
	}
	var leaked []string
	for _, line := range podQueries(log[mark:]) {
		if !before[queryClient(line)] {
			leaked = append(leaked, line)
		}
	}
	return leaked
}

// queryClient returns the client's address and port of a CoreDNS query log line ("[INFO] 10.244.0.2:60755
// - 36049 ..."), "" if it names none.
func queryClient(line string) string {
	_, rest, ok := strings.Cut(line, "] ")
	if !ok {
		return ""
	}
	client, _, _ := strings.Cut(rest, " ")
	return client
}

// podQueries returns the lines of a CoreDNS query log whose client is the Pod.
func podQueries(log string) []string {
	var lines []string
	for line := range strings.SplitSeq(log, "\n") {
		if strings.Contains(line, "] "+simnode.PodIP+":") {
			lines = append(lines, line)
		}
	}
	return lines
}

// a is the A record "owner A ip" of records' format.
func a(owner, ip string) string { return dns.Fqdn(owner) + " A " + ip }

// TestConformance runs the DNS cases of Kubernetes' e2e tests (dns.go, dns_configmap.go) on one simulated
// node, each through the node cache on both its addresses and straight from the cluster DNS.
func TestConformance(t *testing.T) {
	started := time.Now()
	r := newRig(t)
	t.Logf("the node, the API server, the cluster DNS and the node cache up in %v", time.Since(started).Round(time.Second))

	// "should provide DNS for the cluster" and "should resolve DNS of partial qualified names for the
	// cluster": the names through the search path of a ClusterFirst Pod.
	t.Run("cluster", func(t *testing.T) {
		kubernetes := a("kubernetes.default.svc.cluster.local", "10.96.0.1")
		for _, name := range []string{"kubernetes.default.svc.cluster.local", "kubernetes.default", "kubernetes.default.svc"} {
			r.forRig(t).check(t, lookup{name: name, qtype: "A", want: []string{kubernetes}, addrs: []string{"10.96.0.1"}}, servers)
		}
		// The PTR of a ClusterIP: kube-dns's own.
		r.forRig(t).check(t, lookup{name: "10.0.96.10.in-addr.arpa", qtype: "PTR",
			want: []string{"10.0.96.10.in-addr.arpa. PTR kube-dns.kube-system.svc.cluster.local."}}, servers)
	})

	querier := r.createPod(testNamespace, "dns-querier-1", map[string]string{"dns-test": "true"}, "dns-querier-1", "dns-test-service", simnode.PodIP)

	// "should provide DNS for services" and "... partial qualified names for services": a headless Service
	// and a regular one selecting the querier Pod, their SRV records, the PTR of the ClusterIP.
	t.Run("services", func(t *testing.T) {
		rt := r.forRig(t)
		headless := rt.createService(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "dns-test-service"}, Spec: corev1.ServiceSpec{
			ClusterIP: corev1.ClusterIPNone, Selector: map[string]string{"dns-test": "true"},
			Ports: []corev1.ServicePort{{Port: 80, Name: "http", Protocol: corev1.ProtocolTCP}}}})
		regular := rt.createService(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "test-service-2"}, Spec: corev1.ServiceSpec{
			Selector: map[string]string{"dns-test": "true"},
			Ports:    []corev1.ServicePort{{Port: 80, Name: "http", Protocol: corev1.ProtocolTCP}}}})
		rt.syncEndpointSlice(headless, querier)
		rt.syncEndpointSlice(regular, querier)
		ip := regular.Spec.ClusterIP
		headlessA := []string{a(fqdn(headless.Name), querier.Status.PodIP)}
		headlessSRV := []string{"_http._tcp." + fqdn(headless.Name) + ". SRV 0 100 80 dns-querier-1." + fqdn(headless.Name) + "."}
		regularSRV := []string{"_http._tcp." + fqdn(regular.Name) + ". SRV 0 100 80 " + fqdn(regular.Name) + "."}
		rt.waitFor("the cluster DNS serving the new Services", func() bool {
			got, err := rt.dig(simnode.ClusterDNSPodIP, "udp", fqdn(headless.Name), "A", false)
			return err == nil && slices.Equal(got, headlessA)
		})
		reverse, err := dns.ReverseAddr(ip)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range []lookup{
			{name: fqdn(headless.Name), qtype: "A", want: headlessA, addrs: []string{querier.Status.PodIP}},
			{name: "_http._tcp." + fqdn(headless.Name), qtype: "SRV", want: headlessSRV},
			{name: "_http._tcp." + fqdn(regular.Name), qtype: "SRV", want: regularSRV},
			{name: strings.TrimSuffix(reverse, "."), qtype: "PTR", want: []string{reverse + " PTR " + fqdn(regular.Name) + "."}},
			{name: fqdn(regular.Name), qtype: "A", want: []string{a(fqdn(regular.Name), ip)}, addrs: []string{ip}},
			// The partial names, through the search list.
			{name: headless.Name, qtype: "A", want: headlessA, addrs: []string{querier.Status.PodIP}},
			{name: headless.Name + "." + testNamespace, qtype: "A", want: headlessA, addrs: []string{querier.Status.PodIP}},
			{name: headless.Name + "." + testNamespace + ".svc", qtype: "A", want: headlessA, addrs: []string{querier.Status.PodIP}},
			{name: "_http._tcp." + headless.Name + "." + testNamespace + ".svc", qtype: "SRV", want: headlessSRV},
			{name: "_http._tcp." + regular.Name + "." + testNamespace + ".svc", qtype: "SRV", want: regularSRV},
			// What the API does not hold: a Service of no such name, and the AAAA records of an IPv4 one.
			{name: fqdn("no-such-service"), qtype: "A", want: nil},
			{name: fqdn(regular.Name), qtype: "AAAA", want: nil},
			// The querier's own name, by its hostname and subdomain (the e2e's hostEntries).
			{name: "dns-querier-1." + fqdn(headless.Name), qtype: "A", want: []string{a("dns-querier-1."+fqdn(headless.Name), querier.Status.PodIP)},
				addrs: []string{querier.Status.PodIP}},
		} {
			rt.check(t, l, servers)
		}
	})

	// "should provide DNS for a service with multiple EndpointSlices and no Endpoints".
	t.Run("endpointslices", func(t *testing.T) {
		rt := r.forRig(t)
		svc := rt.createService(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "dns-test-service-slices"}, Spec: corev1.ServiceSpec{
			ClusterIP: corev1.ClusterIPNone, Ports: []corev1.ServicePort{{Port: 80, Name: "http", Protocol: corev1.ProtocolTCP}}}})
		for _, s := range []struct {
			ip, port string
			number   int32
		}{{"1.2.3.4", "http", 80}, {"5.6.7.8", "https", 443}} {
			_, err := rt.admin.DiscoveryV1().EndpointSlices(testNamespace).Create(context.Background(), &discoveryv1.EndpointSlice{
				ObjectMeta: metav1.ObjectMeta{GenerateName: svc.Name + "-", Labels: map[string]string{
					discoveryv1.LabelServiceName: svc.Name, discoveryv1.LabelManagedBy: "e2e-test-" + testNamespace}},
				AddressType: discoveryv1.AddressTypeIPv4,
				Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{s.ip}, Conditions: discoveryv1.EndpointConditions{Ready: new(true)}}},
				Ports:       []discoveryv1.EndpointPort{{Name: new(s.port), Port: new(s.number), Protocol: new(corev1.ProtocolTCP)}},
			}, strict)
			if err != nil {
				t.Fatal(err)
			}
		}
		both := []string{a(fqdn(svc.Name), "1.2.3.4"), a(fqdn(svc.Name), "5.6.7.8")}
		rt.waitFor("the cluster DNS serving both EndpointSlices", func() bool {
			got, err := rt.dig(simnode.ClusterDNSPodIP, "udp", fqdn(svc.Name), "A", false)
			return err == nil && slices.Equal(got, both)
		})
		for _, l := range []lookup{
			{name: fqdn(svc.Name), qtype: "A", want: both, addrs: []string{"1.2.3.4", "5.6.7.8"}},
			{name: "_http._tcp." + fqdn(svc.Name), qtype: "SRV", want: []string{"_http._tcp." + fqdn(svc.Name) + ". SRV 0 100 80 1-2-3-4." + fqdn(svc.Name) + "."}},
			{name: "_https._tcp." + fqdn(svc.Name), qtype: "SRV", want: []string{"_https._tcp." + fqdn(svc.Name) + ". SRV 0 100 443 5-6-7-8." + fqdn(svc.Name) + "."}},
		} {
			rt.check(t, l, servers)
		}
	})

	// "should provide DNS for pods for Hostname" and "... for Subdomain": a Pod with a hostname and a
	// subdomain naming a headless Service that selects it.
	t.Run("hostname-subdomain", func(t *testing.T) {
		rt := r.forRig(t)
		const podIP = "10.244.0.3" // an address of the API's only: nothing sends traffic to it
		pod := rt.createPod(testNamespace, "dns-querier-2", map[string]string{"dns-test-hostname-attribute": "true"}, "dns-querier-2", "dns-test-service-2", podIP)
		svc := rt.createService(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "dns-test-service-2"}, Spec: corev1.ServiceSpec{
			ClusterIP: corev1.ClusterIPNone, Selector: map[string]string{"dns-test-hostname-attribute": "true"},
			Ports: []corev1.ServicePort{{Port: 80, Name: "http", Protocol: corev1.ProtocolTCP}}}})
		rt.syncEndpointSlice(svc, pod)
		host := "dns-querier-2." + fqdn(svc.Name)
		rt.waitFor("the cluster DNS serving the Pod's hostname", func() bool {
			got, err := rt.dig(simnode.ClusterDNSPodIP, "udp", host, "A", false)
			return err == nil && slices.Equal(got, []string{a(host, podIP)})
		})
		rt.check(t, lookup{name: host, qtype: "A", want: []string{a(host, podIP)}, addrs: []string{podIP}}, servers)
		rt.check(t, lookup{name: fqdn(svc.Name), qtype: "A", want: []string{a(fqdn(svc.Name), podIP)}, addrs: []string{podIP}}, servers)
	})

	// Pod A records in the dashed form (kubernetes ... { pods insecure }): any address, answered as asked.
	t.Run("pod-records", func(t *testing.T) {
		for _, ip := range []string{simnode.PodIP, "10.244.0.3"} {
			name := strings.ReplaceAll(ip, ".", "-") + "." + testNamespace + ".pod.cluster.local"
			r.forRig(t).check(t, lookup{name: name, qtype: "A", want: []string{a(name, ip)}, addrs: []string{ip}}, servers)
		}
	})

	t.Run("truncation", func(t *testing.T) { r.forRig(t).truncation(t) })

	// "should work with the pod containing more than 6 DNS search paths and longer than 256 search list
	// characters" and "... a search path containing an underscore and a search path with a single dot": the
	// Pod's dnsConfig.searches after the cluster's, as the kubelet merges them.
	// musl reads resolv.conf a line of at most 255 characters at a time and ignores a longer line whole, so
	// with the long list it has no search list at all and asks a partial name as it is: the node's resolver
	// answers it, on every path alike. (The e2e's musl prober is Alpine's dig, with a parser of its own.)
	for _, c := range []struct {
		name      string
		search    []string
		muslAddrs []string
	}{
		{"long-search-list", []string{fmt.Sprintf("%038d.k8s.io", 1), fmt.Sprintf("%038d.k8s.io", 2), fmt.Sprintf("%038d.k8s.io", 3),
			fmt.Sprintf("%038d.k8s.io", 4), fmt.Sprintf("%038d.k8s.io", 5), fmt.Sprintf("%038d.k8s.io", 6)}, []string{simnode.ExternalAnswer}},
		{"odd-search-paths", []string{".", "_sip._tcp.abc_d.example.com"}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			rt := r.forRig(t)
			rt.extraSearch = c.search
			kubernetes := a("kubernetes.default.svc.cluster.local", "10.96.0.1")
			for _, name := range []string{"kubernetes.default", "kubernetes.default.svc"} {
				rt.check(t, lookup{name: name, qtype: "A", want: []string{kubernetes}, addrs: []string{"10.96.0.1"}, muslAddrs: c.muslAddrs}, servers)
			}
			host := "dns-querier-1.dns-test-service." + testNamespace + ".svc.cluster.local"
			rt.check(t, lookup{name: host, qtype: "A", want: []string{a(host, querier.Status.PodIP)}, addrs: []string{querier.Status.PodIP}}, servers)
		})
	}
	t.Run("externalname", func(t *testing.T) { r.forRig(t).externalName(t) })
	t.Run("kube-dns-configmap", func(t *testing.T) { r.forRig(t).stubDomains(t) })
	t.Run("coredns-configmap", func(t *testing.T) { r.forRig(t).corednsConfigMap(t) })
	t.Logf("tier wall time %v", time.Since(started).Round(time.Second))
}

// externalName is "should provide DNS for ExternalName services": a Service of type ExternalName whose
// target changes, and which then becomes a ClusterIP Service; each change must show through the node cache
// within the e2e's bound.
func (r *rig) externalName(t *testing.T) {
	const name = "dns-test-service-3"
	host := fqdn(name)
	r.createService(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.ServiceSpec{
		Type: corev1.ServiceTypeExternalName, ExternalName: "foo.example.com"}})
	cname := func(target string) lookup {
		return lookup{name: host, qtype: "CNAME", want: []string{dns.Fqdn(host) + " CNAME " + dns.Fqdn(target)}}
	}
	// The A lookup follows the CNAME: the cluster DNS resolves the target through its own upstream, the
	// node's resolver.
	followed := func(target string) lookup {
		return lookup{name: host, qtype: "A", want: []string{dns.Fqdn(host) + " CNAME " + dns.Fqdn(target), a(target, simnode.ExternalAnswer)},
			addrs: []string{simnode.ExternalAnswer}, canonical: target}
	}
	r.probeUntil(t, "the ExternalName Service's CNAME foo.example.com", "CNAME", host, []string{"foo.example.com."})
	r.check(t, cname("foo.example.com"), servers)
	r.check(t, followed("foo.example.com"), servers)

	r.changeAndProbe(t, "bar.example.com", "CNAME", func() {
		r.updateService(name, func(s *corev1.Service) { s.Spec.ExternalName = "bar.example.com" })
	})
	r.waitAgree(t, cname("bar.example.com"))
	r.waitAgree(t, followed("bar.example.com"))

	var ip string
	r.changeAndProbe(t, "", "A", func() {
		svc := r.updateService(name, func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeClusterIP
			s.Spec.ExternalName = ""
			s.Spec.Ports = []corev1.ServicePort{{Port: 80, Name: "http", Protocol: corev1.ProtocolTCP}}
		})
		ip = svc.Spec.ClusterIP
	}, func() string { return ip })
	r.waitAgree(t, lookup{name: host, qtype: "A", want: []string{a(host, ip)}, addrs: []string{ip}})
	r.waitAgree(t, lookup{name: host, qtype: "CNAME", want: []string{}})
}

// probeUntil asks host qtype on every path, once a second as the e2e's probe Pods do (dig +short, no
// search), until each answers want, within the e2e's probeBound; it returns, per path, how long after its
// start that took and how many probes.
func (r *rig) probeUntil(t *testing.T, what, qtype, host string, want []string) map[server]string {
	t.Helper()
	start := time.Now()
	took := map[server]string{}
	probes := map[server]int{}
	r.waitWithin(what, probeBound, probeInterval, func() bool {
		for _, s := range servers {
			if _, ok := took[s]; ok {
				continue
			}
			probes[s]++
			rrs, err := r.digRRs(s.ip, "udp", host, qtype, false)
			if err != nil {
				continue
			}
			var short []string
			for _, rr := range rrs {
				short = append(short, strings.TrimPrefix(rr.String(), rr.Header().String()))
			}
			if slices.Equal(short, want) {
				took[s] = fmt.Sprintf("%v (%d probes)", time.Since(start).Round(100*time.Millisecond), probes[s])
			}
		}
		return len(took) == len(servers)
	})
	return took
}

// changeAndProbe reads the TTL the node cache serves host's qtype answer with, makes the change, and probes
// until every path answers the new target (or, with target "", the address targetFn returns), logging how
// long each took against that TTL.
func (r *rig) changeAndProbe(t *testing.T, target, qtype string, change func(), targetFn ...func() string) {
	t.Helper()
	host := fqdn("dns-test-service-3")
	left := "none"
	if rrs, err := r.digRRs(simnode.LinkLocalIP, "udp", host, qtype, false); err == nil && len(rrs) > 0 {
		left = fmt.Sprintf("%ds", rrs[0].Header().Ttl)
	}
	change()
	want := dns.Fqdn(target)
	if target == "" {
		want = targetFn[0]()
	}
	took := r.probeUntil(t, fmt.Sprintf("%s %s answering %s after the change", host, qtype, want), qtype, host, []string{want})
	var report []string
	for _, s := range servers {
		report = append(report, s.label+": "+took[s])
	}
	t.Logf("%s %s -> %s after the change; the node cache served the old answer with %s left just before it:\n  %s",
		host, qtype, want, left, strings.Join(report, "\n  "))
}

// stubDomains is dns_configmap.go's "should be able to change stubDomain configuration" with the kube-dns
// ConfigMap, which the node cache's drop-in reads: a stub domain and upstream nameservers naming the test's
// DNS server appear, then the ConfigMap is removed and the names go back to the node's resolver.
func (r *rig) stubDomains(t *testing.T) {
	names := map[string]string{"abc.acme.local": "1.1.1.1", "def.acme.local": "2.2.2.2", "widget.local": "3.3.3.3"}
	order := []string{"abc.acme.local", "def.acme.local", "widget.local"}
	external := func(name string) lookup {
		return lookup{name: name, qtype: "A", want: []string{a(name, simnode.ExternalAnswer)}, addrs: []string{simnode.ExternalAnswer}}
	}
	// Before: every path sends them to the node's resolver.
	for _, name := range order {
		r.check(t, external(name), servers)
	}

	stub, _ := json.Marshal(map[string][]string{"acme.local": {stubServerIP}})
	upstream, _ := json.Marshal([]string{stubServerIP})
	start := time.Now()
	r.setKubeDNSConfigMap(map[string]string{"stubDomains": string(stub), "upstreamNameservers": string(upstream)})
	for _, name := range order {
		r.waitCacheAnswers(t, name, names[name])
	}
	t.Logf("the kube-dns ConfigMap's stub domain and upstream nameservers answered through the node cache %v after the update",
		time.Since(start).Round(100*time.Millisecond))
	for _, name := range order {
		r.check(t, lookup{name: name, qtype: "A", want: []string{a(name, names[name])}, addrs: []string{names[name]}}, cacheServers)
		// The cluster DNS is not configured by the kube-dns ConfigMap (kube-dns was; CoreDNS reads its own):
		// straight, it still sends them to the node's resolver.
		r.check(t, external(name), []server{straight})
	}
	if got := simnode.CountQueries(r.resolvers.Output(), "abc.acme.local", "udp"); got == 0 {
		t.Errorf("the test's DNS server never saw abc.acme.local")
	}

	start = time.Now()
	r.setKubeDNSConfigMap(nil)
	for _, name := range order {
		r.waitCacheAnswers(t, name, simnode.ExternalAnswer)
	}
	t.Logf("with the kube-dns ConfigMap deleted, the node cache sent them to the node's resolver again %v after the delete",
		time.Since(start).Round(100*time.Millisecond))
	for _, name := range order {
		r.check(t, external(name), servers)
	}
}

// waitCacheAnswers waits, within dns_configmap.go's bound and polling every second as it does, until both of
// the node cache's addresses answer name with the single address ip.
func (r *rig) waitCacheAnswers(t *testing.T, name, ip string) {
	t.Helper()
	want := []string{a(name, ip)}
	r.waitWithin(fmt.Sprintf("%s answering %s through the node cache", name, ip), configMapBound, time.Second, func() bool {
		for _, s := range cacheServers {
			if got, err := r.dig(s.ip, "udp", name, "A", true); err != nil || !slices.Equal(got, want) {
				return false
			}
		}
		return true
	})
}

// e2eCorednsCorefile is the Corefile dns_configmap.go gives a CoreDNS cluster DNS (its "coredns" branch
// of "Change stubDomain"; the forward PTR and external name tests use the same without acme.local), bound
// and logged as clusterCorefile, with the kubeconfig.
var e2eCorednsCorefile = fmt.Sprintf(`.:53 {
    bind {{.IP}}
    log
    health
    ready
    kubernetes cluster.local in-addr.arpa ip6.arpa {
       kubeconfig {{.Kubeconfig}} kubeapi
       pods insecure
       fallthrough in-addr.arpa ip6.arpa
       ttl 30
    }
    forward . %[1]s
}
acme.local:53 {
    bind {{.IP}}
    log
    forward . %[1]s
}
`, stubServerIP)

// reconfigureClusterDNS makes corefile the cluster DNS's and reloads it with SIGUSR1 (the e2e deletes the
// CoreDNS Pods instead), waiting until the reload is done.
func (r *rig) reconfigureClusterDNS(t *testing.T, corefile string) {
	t.Helper()
	reloads := strings.Count(r.clusterDNS.Output(), "Reloading complete")
	if err := os.WriteFile(filepath.Join(r.clusterDNSDir, "Corefile"), []byte(corefile), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := r.clusterDNS.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	r.waitFor("the cluster DNS reloading its Corefile", func() bool {
		return strings.Count(r.clusterDNS.Output(), "Reloading complete") > reloads
	})
}

// corednsConfigMap runs dns_configmap.go's three cases the way they configure a CoreDNS cluster DNS: its
// own Corefile, with a stub domain and an upstream of the test's DNS server. Names of the cluster's zones
// (an ExternalName Service the cluster DNS follows through its upstream, the PTR of an address outside the
// cluster, which the kubernetes plugin passes to forward) reach the cluster DNS through the node cache and
// agree on every path. Names outside them never reach the cluster DNS through the node cache, which sends
// them to the node's resolver, or to the kube-dns ConfigMap's stub domains and upstream nameservers: on a
// cluster with the node cache, the e2e's "Change stubDomain" passes with the kube-dns ConfigMap (stubDomains
// above) and not with CoreDNS's own Corefile, as with upstream's node-local-dns.
func (r *rig) corednsConfigMap(t *testing.T) {
	r.reconfigureClusterDNS(t, r.clusterDNSConfig(e2eCorednsCorefile))
	defer r.reconfigureClusterDNS(t, r.clusterDNSCorefile)

	external := func(name string) lookup {
		return lookup{name: name, qtype: "A", want: []string{a(name, simnode.ExternalAnswer)}, addrs: []string{simnode.ExternalAnswer}}
	}
	for name, ip := range map[string]string{"abc.acme.local": "1.1.1.1", "widget.local": "3.3.3.3"} {
		r.check(t, lookup{name: name, qtype: "A", want: []string{a(name, ip)}, addrs: []string{ip}}, []server{straight})
		r.check(t, external(name), cacheServers)
	}

	// "should forward externalname lookup to upstream nameserver".
	const local = "dns-externalname-upstream-local"
	r.createService(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: local}, Spec: corev1.ServiceSpec{
		Type: corev1.ServiceTypeExternalName, ExternalName: "foo.example.com"}})
	r.waitAgree(t, lookup{name: fqdn(local), qtype: "A",
		want:  []string{dns.Fqdn(fqdn(local)) + " CNAME foo.example.com.", a("foo.example.com", "192.0.2.124")},
		addrs: []string{"192.0.2.124"}, canonical: "foo.example.com"})

	// "should forward PTR records lookup to upstream nameserver".
	r.check(t, lookup{name: "123.2.0.192.in-addr.arpa", qtype: "PTR", want: []string{"123.2.0.192.in-addr.arpa. PTR my.test."}}, servers)
}

// truncation asks for a headless Service with more endpoints than a 512-byte UDP reply holds (the e2e's
// dns_scale_records.go asks for many Services; this is the same limit from one name). A client without EDNS
// gets a truncated reply on every path, with as many addresses on each: glibc then asks again over TCP and
// gets them all, musl, which has no TCP fallback, uses the ones it got.
func (r *rig) truncation(t *testing.T) {
	const endpoints = 40
	svc := r.createService(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "dns-test-service-big"}, Spec: corev1.ServiceSpec{
		ClusterIP: corev1.ClusterIPNone, Ports: []corev1.ServicePort{{Port: 80, Name: "http", Protocol: corev1.ProtocolTCP}}}})
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{GenerateName: svc.Name + "-", Labels: map[string]string{
			discoveryv1.LabelServiceName: svc.Name, discoveryv1.LabelManagedBy: "e2e-test-" + testNamespace}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: new("http"), Port: new(int32(80)), Protocol: new(corev1.ProtocolTCP)}},
	}
	var want, addrs []string
	for i := range endpoints {
		ip := fmt.Sprintf("10.245.0.%d", i+1)
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: new(true)}})
		want = append(want, a(fqdn(svc.Name), ip))
		addrs = append(addrs, ip)
	}
	slices.Sort(want)
	slices.Sort(addrs)
	if _, err := r.admin.DiscoveryV1().EndpointSlices(testNamespace).Create(context.Background(), slice, strict); err != nil {
		t.Fatal(err)
	}
	r.waitFor("the cluster DNS serving every endpoint", func() bool {
		got, err := r.dig(simnode.ClusterDNSPodIP, "tcp", fqdn(svc.Name), "A", false)
		return err == nil && slices.Equal(got, want)
	})
	// dig's EDNS buffer (1232) holds them all, over UDP too.
	for _, s := range servers {
		for _, network := range []string{"udp", "tcp"} {
			if got, err := r.dig(s.ip, network, fqdn(svc.Name), "A", true); err != nil || !slices.Equal(got, want) {
				t.Errorf("dig %s over %s at %s: %d records (%v), want all %d", fqdn(svc.Name), network, s.label, len(got), err, endpoints)
			}
		}
	}
	held := map[server]int{}
	for _, s := range servers {
		// Twice through the cache: the first is a miss, the second what a hit would be.
		for range 2 {
			m, err := r.n.Query(r.n.PodNS, "udp", s.ip+":53", fqdn(svc.Name), dns.TypeA)
			if err != nil {
				t.Fatal(err)
			}
			if !m.Truncated || len(m.Answer) == 0 || len(m.Answer) >= endpoints {
				t.Errorf("a plain UDP query at %s: truncated %v with %d records, want truncated with some of the %d", s.label, m.Truncated, len(m.Answer), endpoints)
			}
			for _, rr := range records(m.Answer) {
				if !slices.Contains(want, rr) {
					t.Errorf("a plain UDP query at %s answered %s, which the API does not hold", s.label, rr)
				}
			}
			held[s] = len(m.Answer)
		}
		if g, err := r.glibc(s.ip, fqdn(svc.Name)); err != nil || !slices.Equal(g.addrs, addrs) {
			t.Errorf("glibc's getaddrinfo at %s: %d addresses (%v), want all %d after its TCP retry", s.label, len(g.addrs), err, endpoints)
		}
		m, err := r.muslLookup(s.ip, fqdn(svc.Name))
		if err != nil {
			t.Errorf("musl's getaddrinfo at %s: %v", s.label, err)
			continue
		}
		for _, ip := range m.addrs {
			if !slices.Contains(addrs, ip) {
				t.Errorf("musl's getaddrinfo at %s: %s, which the API does not hold", s.label, ip)
			}
		}
		t.Logf("at %s: a plain UDP reply holds %d of the %d addresses; musl's getaddrinfo returned %d", s.label, held[s], endpoints, len(m.addrs))
		if len(m.addrs) != held[s] {
			t.Errorf("musl's getaddrinfo at %s returned %d addresses, a plain UDP reply holds %d", s.label, len(m.addrs), held[s])
		}
	}
	if held[viaLinkLocal] != held[straight] || held[viaClusterIP] != held[straight] {
		t.Errorf("a plain UDP reply holds %v addresses by path, want as many on each", held)
	}
}
