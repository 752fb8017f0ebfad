//go:build linux

package rules

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// directDNATScript is a Service port chain as kube-proxy 1.35 and later write it without session
// affinity, in table FAMILY kube-proxy: one endpoint DNATed to directly, several picked with numgen from an
// anonymous map of address . port.
func directDNATScript(family, svc string, port int, endpoints []string) string {
	addr := "ipv4_addr"
	if family == "ip6" {
		addr = "ipv6_addr"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "table %s kube-proxy {\n", family)
	fmt.Fprintf(&b, "  map service-ips { type %s . inet_proto . inet_service : verdict; }\n", addr)
	for _, proto := range []string{"udp", "tcp"} {
		fmt.Fprintf(&b, "  chain service-ABCDEFGH-kube-system/kube-dns-upstream/%s/dns {\n", proto)
		if len(endpoints) == 1 {
			fmt.Fprintf(&b, "    meta l4proto %s dnat to %s\n", proto, netip.AddrPortFrom(netip.MustParseAddr(endpoints[0]), uint16(port)))
		} else {
			var elems []string
			for i, ep := range endpoints {
				elems = append(elems, fmt.Sprintf("%d : %s . %d", i, ep, port))
			}
			fmt.Fprintf(&b, "    meta l4proto %s dnat %s addr . port to numgen random mod %d map { %s }\n", proto, family, len(endpoints), strings.Join(elems, ", "))
		}
		b.WriteString("  }\n")
	}
	b.WriteString("}\n")
	for _, proto := range []string{"udp", "tcp"} {
		fmt.Fprintf(&b, "add element %s kube-proxy service-ips { %s . %s . %d : goto service-ABCDEFGH-kube-system/kube-dns-upstream/%s/dns }\n",
			family, svc, proto, port, proto)
	}
	return b.String()
}

// TestKubeProxyEndpointsOfDirectDNATs: kube-proxy (1.35 and later) DNATs a Service port with no session
// affinity in its Service chain, to its one endpoint or through a numgen map of several; the endpoints
// read from its table are every one of them, in both families.
func TestKubeProxyEndpointsOfDirectDNATs(t *testing.T) {
	if !inNFTNamespace(t) {
		return
	}
	ctx := context.Background()
	n := NewNFTablesManager()
	for _, tc := range []struct {
		family, svc string
		endpoints   []string
	}{
		{"ip", "10.96.0.11", []string{"10.244.1.2"}},
		{"ip", "10.96.0.11", []string{"10.244.1.2", "10.244.3.2", "10.244.4.2"}},
		{"ip6", "fd00:10:96::11", []string{"fd00:10:244:1::2"}},
		{"ip6", "fd00:10:96::11", []string{"fd00:10:244:1::2", "fd00:10:244:3::2"}},
	} {
		nftScript(t, directDNATScript(tc.family, tc.svc, 5353, tc.endpoints))
		var want []netip.AddrPort
		for _, ep := range tc.endpoints {
			want = append(want, netip.AddrPortFrom(netip.MustParseAddr(ep), 5353))
		}
		slices.SortFunc(want, netip.AddrPort.Compare)
		for _, proto := range []Protocol{UDP, TCP} {
			got, err := n.KubeProxyEndpoints(ctx, netip.MustParseAddr(tc.svc), proto, 5353)
			if err != nil || !slices.Equal(got, want) {
				t.Errorf("%s %v over %s: endpoints %v, %v; want %v", tc.family, tc.endpoints, proto, got, err, want)
			}
		}
		nft(t, "delete", "table", tc.family, "kube-proxy")
	}
}
