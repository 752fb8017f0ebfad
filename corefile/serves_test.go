package corefile

import (
	"net/netip"
	"testing"
)

func TestServing(t *testing.T) {
	f, err := Parse([]byte(`cluster.local:53 {
    bind 169.254.20.10 10.96.0.10
    health 169.254.20.10:8080
}
in-addr.arpa:53 {
    bind 169.254.20.10
}
example.org:5353 {
}
.:53 {
    bind 169.254.20.10 10.96.0.10
    ready
}
`))
	if err != nil {
		t.Fatal(err)
	}
	local, cluster, other := netip.MustParseAddr("169.254.20.10"), netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("192.0.2.1")
	for _, tc := range []struct {
		name string
		addr netip.Addr
		port uint16
		ok   bool
	}{
		{"kubernetes.default.svc.cluster.local.", local, 53, true},
		{"KUBERNETES.default.svc.Cluster.Local", cluster, 53, true},
		{"1.0.96.10.in-addr.arpa.", cluster, 53, true}, // the `.` block on the ClusterIP
		{"1.0.96.10.in-addr.arpa.", local, 53, true},
		{"www.example.org.", local, 5353, true},
		{"kubernetes.io.", local, 53, true},
		{"kubernetes.io.", other, 0, false},
		{"www.example.org.", other, 5353, true}, // no bind: every address
	} {
		port, ok := f.Serving(tc.name, tc.addr, 53)
		if port != tc.port || ok != tc.ok {
			t.Errorf("Serving(%s, %s) = %d, %v; want %d, %v", tc.name, tc.addr, port, ok, tc.port, tc.ok)
		}
	}
	for _, tc := range []struct {
		directive, def string
		want           string
		ok             bool
	}{
		{"health", ":8080", "169.254.20.10:8080", true},
		{"ready", ":8181", "169.254.20.10:8181", true},
		{"pprof", ":6053", "", false},
	} {
		got, ok := f.ListenAddress(tc.directive, tc.def, local)
		if got != tc.want || ok != tc.ok {
			t.Errorf("ListenAddress(%s) = %q, %v; want %q, %v", tc.directive, got, ok, tc.want, tc.ok)
		}
	}
}
