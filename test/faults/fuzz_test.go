//go:build linux

package faults

import (
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/corefile"
	"github.com/nodelocaldns/nodelocaldns/nodelocal"
)

// The fuzz targets run their seed corpora (testdata/fuzz and the f.Add calls) as ordinary tests; `go test
// -fuzz=FuzzX -fuzztime=30s ./test/faults/` explores further.

// FuzzKubeDNSConfigMap: whatever the kube-dns ConfigMap holds, ParseKubeDNS returns an error or a value
// that Expand turns into a Corefile that parses.
func FuzzKubeDNSConfigMap(f *testing.F) {
	base, err := os.ReadFile(filepath.Join("..", "..", "corefile", "testdata", "upstream-template.Corefile"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(`{"acme.local": ["1.2.3.4"]}`, `["8.8.8.8", "8.8.4.4"]`)
	f.Add(`{"acme.local": ["1.2.3.4:5353", "[fd00::1]:53"]}`, `[]`)
	f.Add(`{"": [""]}`, `[""]`)
	f.Add(`{"a b": ["1.2.3.4"]}`, `["1.2.3.4", "1.2.3.4", "1.2.3.4", "1.2.3.4"]`)
	f.Add(`{"x.local": ["example.org"]}`, `null`)
	f.Add(`[`, `{`)
	f.Fuzz(func(t *testing.T, stubDomains, upstream string) {
		kd, err := corefile.ParseKubeDNS(map[string]string{corefile.StubDomainsKey: stubDomains, corefile.UpstreamNameserversKey: upstream})
		if err != nil {
			return
		}
		out, err := corefile.Expand(base, corefile.Expansion{
			LocalIPs:           []netip.Addr{netip.MustParseAddr("169.254.20.10"), netip.MustParseAddr("10.96.0.10")},
			DNSDomain:          "cluster.local",
			Upstream:           &corefile.Upstream{Service: "kube-dns-upstream"},
			PrometheusEndpoint: "169.254.20.10:9253",
			Notrack:            &corefile.Notrack{},
			Port:               53,
		}, kd)
		if err != nil {
			return
		}
		if _, err := corefile.Parse(out); err != nil {
			t.Fatalf("Expand accepted %q / %q but wrote a Corefile that does not parse: %v\n%s", stubDomains, upstream, err, out)
		}
	})
}

// FuzzCorefileParse: Parse never panics nor hangs, whatever the base Corefile ConfigMap holds.
func FuzzCorefileParse(f *testing.F) {
	f.Add([]byte(".:53 {\n    forward . /etc/resolv.conf\n}\n"))
	f.Add([]byte("cluster.local:53 {\n    bind 169.254.20.10\n    notrack {\n        sync 1s\n    }\n}\n"))
	f.Add([]byte("{\n"))
	f.Add([]byte("a {\n b {\n c\n}\n}\n}"))
	f.Add([]byte("\"unterminated\n"))
	f.Add([]byte("import *\n"))
	f.Fuzz(func(_ *testing.T, data []byte) {
		corefile.Parse(data)
	})
}

// FuzzProbeResponse: whatever comes back to the guard's probe, checking it never panics, and only a
// response to the query passes.
func FuzzProbeResponse(f *testing.F) {
	q := new(dns.Msg)
	q.SetQuestion("cluster.local.", dns.TypeSOA)
	q.Id = 0x1234
	ok := new(dns.Msg)
	ok.SetRcode(q, dns.RcodeServerFailure)
	for _, m := range []*dns.Msg{ok, q} {
		b, err := m.Pack()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0x12, 0x34, 0x81, 0x80, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{0x12, 0x34, 0x81, 0x80, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 0x0c, 0, 6, 0, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := new(dns.Msg)
		if err := r.Unpack(data); err != nil {
			return
		}
		if err := nodelocal.CheckProbeResponse(q, r); err == nil && (r.Id != q.Id || !r.Response) {
			t.Fatalf("accepted %v as the answer to %v", r, q)
		}
	})
}
