//go:build linux

package main

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func addrList(s ...string) []netip.Addr {
	out := make([]netip.Addr, 0, len(s))
	for _, a := range s {
		out = append(out, netip.MustParseAddr(a))
	}
	return out
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
			asked := false
			lookup := func(_ context.Context, service string) ([]netip.Addr, string, error) {
				asked = true
				if service != "kube-dns-upstream" {
					t.Errorf("asked for Service %q", service)
				}
				return tc.api, tc.noAPI, tc.apiErr
			}
			got := completeUpstream(context.Background(), "kube-dns-upstream", tc.divert, tc.env, lookup)
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
			if asked != tc.asked {
				t.Errorf("asked the API: %v, want %v", asked, tc.asked)
			}
			if warned := strings.Contains(logged.String(), "go undiverted"); warned != tc.warnings {
				t.Errorf("warned %v, want %v:\n%s", warned, tc.warnings, logged.String())
			}
		})
	}
}
