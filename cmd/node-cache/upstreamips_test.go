//go:build linux

package main

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/nodelocaldns/nodelocaldns/corefile"
)

func addrList(s ...string) []netip.Addr {
	out := make([]netip.Addr, 0, len(s))
	for _, a := range s {
		out = append(out, netip.MustParseAddr(a))
	}
	return out
}

// fakeClusterIPs is an API that holds Service service with ClusterIPs ips, or that is not there (noAPI says
// why) or fails (err); asked says whether it was asked.
type fakeClusterIPs struct {
	t       *testing.T
	service string
	ips     []netip.Addr
	noAPI   string
	err     error
	asked   bool
}

func (f *fakeClusterIPs) lookup(_ context.Context, service string) ([]netip.Addr, string, error) {
	f.asked = true
	if service != f.service {
		f.t.Errorf("asked for Service %q, want %q", service, f.service)
	}
	if f.noAPI != "" {
		return nil, f.noAPI, nil
	}
	return f.ips, "", f.err
}

// TestCompleteUpstream: the kube-dns-upstream ClusterIP of a family the kubelet's variable does not name
// comes from the API, for the families of the diverted addresses only; the API is not asked when nothing
// is missing; a family the API cannot fill is logged and left out.
func TestCompleteUpstream(t *testing.T) {
	dual := addrList("10.96.0.11", "fd00:10:96::b")
	cases := []struct {
		name            string
		divert, env     []netip.Addr
		api             []netip.Addr
		noAPI           string
		apiErr          error
		want            []netip.Addr
		asked, warnings bool
	}{
		{name: "single-stack", divert: addrList("169.254.20.10"), env: addrList("10.96.0.11"), api: dual,
			want: addrList("10.96.0.11")},
		{name: "dual-stack, the variable names IPv4", divert: addrList("169.254.20.10", "fd00:169:254::10"), env: addrList("10.96.0.11"), api: dual,
			want: dual, asked: true},
		{name: "dual-stack, the variable names IPv6", divert: addrList("169.254.20.10", "fd00:169:254::10"), env: addrList("fd00:10:96::b"),
			api: addrList("fd00:10:96::b", "10.96.0.11"), want: addrList("fd00:10:96::b", "10.96.0.11"), asked: true},
		{name: "the variable's family wins", divert: addrList("169.254.20.10", "fd00:169:254::10"), env: addrList("10.96.0.12"), api: dual,
			want: addrList("10.96.0.12", "fd00:10:96::b"), asked: true},
		{name: "no variable", divert: addrList("fd00:169:254::10"), api: dual, want: addrList("fd00:10:96::b"), asked: true},
		{name: "only IPv6 diverted", divert: addrList("fd00:169:254::10"), env: addrList("10.96.0.11"), api: dual,
			want: dual, asked: true},
		{name: "a single-stack Service", divert: addrList("169.254.20.10", "fd00:169:254::10"), env: addrList("10.96.0.11"),
			api: addrList("10.96.0.11"), want: addrList("10.96.0.11"), asked: true, warnings: true},
		{name: "no API", divert: addrList("169.254.20.10", "fd00:169:254::10"), env: addrList("10.96.0.11"), noAPI: "no Kubernetes API",
			want: addrList("10.96.0.11"), asked: true, warnings: true},
		{name: "API error", divert: addrList("169.254.20.10", "fd00:169:254::10"), env: addrList("10.96.0.11"), apiErr: errors.New("forbidden"),
			want: addrList("10.96.0.11"), asked: true, warnings: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			logged := captureLog(t)
			api := &fakeClusterIPs{t: t, service: "kube-dns-upstream", ips: tc.api, noAPI: tc.noAPI, err: tc.apiErr}
			got := completeUpstream(context.Background(), "kube-dns-upstream", tc.divert, tc.env, api.lookup)
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
			if api.asked != tc.asked {
				t.Errorf("asked the API: %v, want %v", api.asked, tc.asked)
			}
			if warned := strings.Contains(logged.String(), "go undiverted"); warned != tc.warnings {
				t.Errorf("warned %v, want %v:\n%s", warned, tc.warnings, logged.String())
			}
		})
	}
}

// TestCompleteKubeDNS: on a dual-stack node in iptables mode both kube-dns ClusterIPs are local addresses,
// and the one of the family $KUBE_DNS_SERVICE_HOST does not name comes from the API, so that a hand-over
// gives both back to kube-proxy; nothing is asked in IPVS mode or on a single-stack node; a failed lookup
// is logged and leaves the variable's address alone.
func TestCompleteKubeDNS(t *testing.T) {
	dualLocal := addrList("169.254.20.10", "fd00:169:254::10", "10.96.0.10", "fd00:10:96::a")
	dualSvc := addrList("10.96.0.10", "fd00:10:96::a")
	cases := []struct {
		name            string
		local, services []netip.Addr
		api             []netip.Addr
		noAPI           string
		want            []netip.Addr
		asked, warned   bool
	}{
		{name: "dual-stack, iptables mode", local: dualLocal, services: addrList("10.96.0.10"), api: dualSvc,
			want: dualSvc, asked: true},
		{name: "dual-stack, the variable names IPv6", local: dualLocal, services: addrList("fd00:10:96::a"), api: addrList("fd00:10:96::a", "10.96.0.10"),
			want: addrList("fd00:10:96::a", "10.96.0.10"), asked: true},
		{name: "dual-stack, IPVS mode", local: addrList("169.254.20.10", "fd00:169:254::10"), api: dualSvc},
		{name: "single-stack", local: addrList("169.254.20.10", "10.96.0.10"), services: addrList("10.96.0.10"), api: dualSvc,
			want: addrList("10.96.0.10")},
		{name: "the other family's ClusterIP not local", local: addrList("169.254.20.10", "fd00:169:254::10", "10.96.0.10"),
			services: addrList("10.96.0.10"), api: dualSvc, want: addrList("10.96.0.10"), asked: true},
		{name: "no API", local: dualLocal, services: addrList("10.96.0.10"), noAPI: "no Kubernetes API",
			want: addrList("10.96.0.10"), asked: true, warned: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			logged := captureLog(t)
			api := &fakeClusterIPs{t: t, service: "kube-dns", ips: tc.api, noAPI: tc.noAPI}
			got := completeKubeDNS(context.Background(), tc.local, tc.services, api.lookup)
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
			if api.asked != tc.asked {
				t.Errorf("asked the API: %v, want %v", api.asked, tc.asked)
			}
			if warned := strings.Contains(logged.String(), "instead of given back to kube-proxy"); warned != tc.warned {
				t.Errorf("warned %v, want %v:\n%s", warned, tc.warned, logged.String())
			}
		})
	}
}

// TestHandoverGivesBackBothKubeDNSClusterIPs: a dual-stack cache in iptables mode hands both kube-dns
// ClusterIPs back to kube-proxy at exit and diverts only the link-local addresses (before, the IPv6
// ClusterIP, which no variable names, was diverted to kube-dns-upstream).
func TestHandoverGivesBackBothKubeDNSClusterIPs(t *testing.T) {
	env := map[string]string{"KUBE_DNS_SERVICE_HOST": "10.96.0.10", "KUBE_DNS_UPSTREAM_SERVICE_HOST": "10.96.0.11"}
	api := map[string][]netip.Addr{
		"kube-dns":          addrList("10.96.0.10", "fd00:10:96::a"),
		"kube-dns-upstream": addrList("10.96.0.11", "fd00:10:96::b"),
	}
	f := &nodeCacheFlags{upstreamSvc: "kube-dns-upstream", clusterIPs: func(_ context.Context, service string) ([]netip.Addr, string, error) {
		return api[service], "", nil
	}}
	var n corefile.Notrack
	local := addrList("169.254.20.10", "fd00:169:254::10", "10.96.0.10", "fd00:10:96::a")
	if err := f.handoverAddresses(&n, local, func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	if want := addrList("10.96.0.10", "fd00:10:96::a"); !slices.Equal(n.ServiceAddresses, want) {
		t.Errorf("given back to kube-proxy: %v, want %v", n.ServiceAddresses, want)
	}
	if want := addrList("10.96.0.11", "fd00:10:96::b"); !slices.Equal(n.HandoverUpstream, want) {
		t.Errorf("diverted to: %v, want %v", n.HandoverUpstream, want)
	}
	if got, want := divertedAddrs(local, n.ServiceAddresses), addrList("169.254.20.10", "fd00:169:254::10"); !slices.Equal(got, want) {
		t.Errorf("diverted: %v, want %v", got, want)
	}
}
