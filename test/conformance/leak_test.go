//go:build linux

package conformance

import (
	"slices"
	"strings"
	"testing"
)

// TestLeakedQueriesLeaveOutLateLines: a line the cluster DNS logs after the mark from a socket it logged a
// query from before it is the late line of an earlier lookup, not a leak; a line from a new socket is one.
// (The log below is the one of a make test run in which the AAAA line came after both barriers' and the
// check took it for a leak.)
func TestLeakedQueriesLeaveOutLateLines(t *testing.T) {
	before := `        [INFO] 10.244.0.2:60755 - 35498 "A IN dns-test-service.e2e-dns.svc.cluster.local. udp 60 false 512" NOERROR qr,aa,rd 118 0.000187301s
        [INFO] 10.244.0.2:45809 - 22449 "A IN barrier-45.nodelocaldns-conformance.cluster.local. udp 67 false 512" NXDOMAIN qr,aa,rd 160 0.000393558s
        [INFO] 10.244.0.2:53296 - 47039 "A IN barrier-46.nodelocaldns-conformance.cluster.local. udp 67 false 512" NXDOMAIN qr,aa,rd 160 0.000155181s
`
	late := `        [INFO] 10.244.0.2:60755 - 36049 "AAAA IN dns-test-service.e2e-dns.svc.cluster.local. udp 60 false 512" NOERROR qr,aa,rd 153 0.001585404s`
	throughCache := `        [INFO] 10.244.1.1:47902 - 52 "A IN dns-test-service.e2e-dns.svc.e2e-dns.svc.cluster.local. tcp 83 false 65535" NXDOMAIN qr,aa,rd 165 0.000226365s`
	leak := `        [INFO] 10.244.0.2:41022 - 7 "A IN dns-test-service.e2e-dns.svc.cluster.local. udp 60 false 512" NOERROR qr,aa,rd 118 0.000187301s`
	log := before + strings.Join([]string{late, throughCache, leak}, "\n") + "\n"
	if got := leakedQueries(log, len(before)); !slices.Equal(got, []string{leak}) {
		t.Errorf("leaked %q, want only %q", got, leak)
	}
}
