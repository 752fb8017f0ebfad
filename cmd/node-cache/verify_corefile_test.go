//go:build linux

package main

import (
	"bytes"
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/nodelocaldns/nodelocaldns/corefile"
)

// TestVerifyFollowsTheCorefile checks, without a node, that the checks a Corefile does not serve are
// skipped with the reason, and that skipped rows neither fail the table nor count as passed.
func TestVerifyFollowsTheCorefile(t *testing.T) {
	served, err := corefile.Parse([]byte(`cluster.local:53 {
    bind 169.254.20.10
    forward . 10.96.0.11
}
example.org:5353 {
    bind 169.254.20.10
    forward . 192.0.2.53
}
`))
	if err != nil {
		t.Fatal(err)
	}
	v := &verifier{listen: []netip.Addr{cacheIP}, dnsPort: 53, served: served, confPath: "/etc/Corefile", timeout: time.Second,
		answeredOn: map[netip.Addr]bool{}}
	v.checkHTTP(context.Background(), "ready", "/ready", corefile.DefaultReadyPort, corefile.DefaultReadyPort, false)
	v.checkHTTP(context.Background(), "health", "/health", corefile.DefaultHealthPort, corefile.DefaultHealthPort, false)
	if why := v.notrackSkip("no_rules"); !strings.Contains(why, "has no notrack") {
		t.Errorf("notrackSkip = %q, want it to say the Corefile has no notrack", why)
	}
	if s, ok := v.serverFor(cacheIP, "www.example.org"); !ok || s.Port() != 5353 {
		t.Errorf("serverFor(www.example.org) = %v, %v; want port 5353 of the example.org block", s, ok)
	}
	if _, ok := v.serverFor(cacheIP, "kubernetes.io"); ok {
		t.Errorf("serverFor(kubernetes.io): a block answers it; none does")
	}
	v.answeredIfServed(context.Background(), cacheIP, "kubernetes.io")
	v.add("link", "nodelocaldns", true, "up")

	var table bytes.Buffer
	if err := printResults(&table, v.results); err != nil {
		t.Errorf("printResults: %v, want nil: skipped rows do not fail", err)
	}
	out := table.String()
	t.Logf("\n%s", out)
	expectRow(t, out, "ready", "/ready", "skipped")
	expectRow(t, out, "health", "/health", "skipped")
	expectRow(t, out, "answer", "kubernetes.io. A", "skipped")
	if !strings.Contains(out, "all 1 checks passed (3 skipped") {
		t.Errorf("the summary does not count the skipped rows apart")
	}
}
