package corefile

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func readTestdata(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// upstreamManifestSed does what upstream's install instructions do to the manifest before applying it.
func upstreamManifestSed(b []byte, localDNS, domain, dnsServer string) []byte {
	s := strings.NewReplacer(LocalDNSVar, localDNS, DNSDomainVar, domain, DNSServerVar, dnsServer).Replace(string(b))
	return []byte(s)
}

// upstreamFlags is the Expansion of upstream's manifest arguments
// -localip 169.254.20.10,10.96.0.10 -upstreamsvc kube-dns-upstream.
func upstreamFlags() Expansion {
	return Expansion{
		LocalIPs:     addrs("169.254.20.10", "10.96.0.10"),
		Upstream:     &Upstream{Service: "kube-dns-upstream"},
		Notrack:      &Notrack{},
		NotrackPorts: []uint16{8080},
		Port:         53,
		ServeStale:   &ServeStale{},
	}
}

func checkGolden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("output differs from %s (run with -update after checking the diff):\n%s", path, got)
	}
}

func TestExpandUpstreamTemplate(t *testing.T) {
	template := readTestdata(t, "upstream-template.Corefile")
	applied := upstreamManifestSed(template, "169.254.20.10", "cluster.local", "10.96.0.10")

	t.Run("as applied", func(t *testing.T) {
		got, err := Expand(applied, upstreamFlags(), KubeDNS{})
		if err != nil {
			t.Fatal(err)
		}
		checkGolden(t, "upstream-template.golden", got)
	})
	t.Run("variables filled by node-cache", func(t *testing.T) {
		// The raw template gives the same Corefile once node-cache knows the domain: -localip already
		// holds the ClusterIP, so __PILLAR__DNS__SERVER__ empties.
		e := upstreamFlags()
		e.DNSDomain = "cluster.local"
		got, err := Expand(template, e, KubeDNS{})
		if err != nil {
			t.Fatal(err)
		}
		checkGolden(t, "upstream-template.golden", got)
	})
	t.Run("with kube-dns ConfigMap", func(t *testing.T) {
		kd := KubeDNS{
			StubDomains:         map[string][]string{"acme.local": {"1.2.3.4"}, "corp.example.com": {"[2001:db8::53]:5353"}},
			UpstreamNameservers: []string{"8.8.8.8", "8.8.4.4"},
		}
		got, err := Expand(applied, upstreamFlags(), kd)
		if err != nil {
			t.Fatal(err)
		}
		checkGolden(t, "upstream-template-kubedns.golden", got)
		f, _ := Parse(got)
		root := rootBlock(f)
		fwd := root.Find("forward")[0]
		if strings.Join(fwd.Args, " ") != ". 8.8.8.8 8.8.4.4" || len(fwd.Block) != 0 {
			t.Errorf("root forward: %v %v", fwd.Args, fwd.Block)
		}
	})
	t.Run("without flags' directives", func(t *testing.T) {
		e := Expansion{LocalIPs: addrs("169.254.20.10", "10.96.0.10"), ClusterDNS: []string{"10.96.0.20"}}
		got, err := Expand(applied, e, KubeDNS{})
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(got, []byte("notrack")) || bytes.Contains(got, []byte("upstreamsvc")) || bytes.Contains(got, []byte("serve_stale")) ||
			!bytes.Contains(got, []byte("forward . 10.96.0.20 {\n        force_tcp")) {
			t.Errorf("unexpected Corefile:\n%s", got)
		}
	})
}

// TestExpandServeStale: every cache and wirecache without serve_stale gets the one asked for; one written in
// the base Corefile, `serve_stale 0s` (off) included, is kept.
func TestExpandServeStale(t *testing.T) {
	base := `cluster.local:53 {
    wirecache
    cache {
        success 9984 30
    }
    forward . 10.96.0.20
}
in-addr.arpa:53 {
    wirecache {
        serve_stale 10m 2s
    }
    cache 30 {
        serve_stale 0s
    }
    forward . 10.96.0.20
}
.:53 {
    cache 30
    forward . /etc/resolv.conf
}
`
	got, err := Expand([]byte(base), Expansion{ServeStale: &ServeStale{For: 30 * time.Minute}}, KubeDNS{})
	if err != nil {
		t.Fatal(err)
	}
	want := `cluster.local:53 {
    wirecache {
        serve_stale 30m 5s 1s
    }
    cache {
        success 9984 30
        serve_stale 30m verify 1s 5s
    }
    forward . 10.96.0.20
}

in-addr.arpa:53 {
    wirecache {
        serve_stale 10m 2s
    }
    cache 30 {
        serve_stale 0s
    }
    forward . 10.96.0.20
}

.:53 {
    cache 30 {
        serve_stale 30m verify 1s 5s
    }
    forward . /etc/resolv.conf
}
`
	if string(got) != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
}

func TestExpandSubstitution(t *testing.T) {
	tests := []struct {
		name string
		in   string
		e    Expansion
		want string
	}{
		{
			name: "IPv6 local address in HOST:PORT gets brackets",
			in:   ".:53 {\n bind __PILLAR__LOCAL__DNS__\n health __PILLAR__LOCAL__DNS__:8080\n}\n",
			e:    Expansion{LocalIPs: addrs("fd00::10", "fd00:10:96::a")},
			want: ".:53 {\n    bind fd00::10 fd00:10:96::a\n    health [fd00::10]:8080\n}\n",
		},
		{
			name: "empty DNS server disappears",
			in:   ".:53 {\n bind __PILLAR__LOCAL__DNS__ __PILLAR__DNS__SERVER__\n}\n",
			e:    Expansion{LocalIPs: addrs("169.254.20.10")},
			want: ".:53 {\n    bind 169.254.20.10\n}\n",
		},
		{
			name: "DNS server kept when given",
			in:   ".:53 {\n bind __PILLAR__LOCAL__DNS__ __PILLAR__DNS__SERVER__\n}\n",
			e:    Expansion{LocalIPs: addrs("169.254.20.10"), DNSServer: addrs("10.96.0.10")},
			want: ".:53 {\n    bind 169.254.20.10 10.96.0.10\n}\n",
		},
		{
			name: "domain and prometheus endpoint",
			in:   "__PILLAR__DNS__DOMAIN__:53 {\n prometheus __PROMETHEUS__ENDPOINT__\n}\n",
			e:    Expansion{DNSDomain: "k8s.local", PrometheusEndpoint: "10.0.0.7:9253"},
			want: "k8s.local:53 {\n    prometheus 10.0.0.7:9253\n}\n",
		},
		{
			name: "forward without force_tcp keeps UDP first",
			in:   "cluster.local:53 {\n forward . __PILLAR__CLUSTER__DNS__ {\n  max_concurrent 1000\n  expire 10s\n }\n}\n",
			e:    Expansion{Upstream: &Upstream{Service: "kube-dns", Namespace: "dns"}},
			want: "cluster.local:53 {\n    upstreamsvc kube-dns dns {\n        prefer_udp\n        max_concurrent 1000\n        expire 10s\n    }\n}\n",
		},
		{
			name: "forward's max_connect_attempts is upstreamsvc's max_attempts",
			in:   "cluster.local:53 {\n forward . __PILLAR__CLUSTER__DNS__ {\n  force_tcp\n  max_connect_attempts 3\n }\n}\n",
			e:    Expansion{Upstream: &Upstream{}},
			want: "cluster.local:53 {\n    upstreamsvc kube-dns-upstream kube-system {\n        force_tcp\n        max_attempts 3\n    }\n}\n",
		},
		{
			name: "existing notrack wins",
			in:   ".:53 {\n bind 169.254.20.10\n notrack {\n  no_rules\n }\n}\nexample.org:53 {\n bind 169.254.20.10\n}\n",
			e:    Expansion{Notrack: &Notrack{Interface: "nl0", NoInterface: true}, LocalIPs: addrs("169.254.20.10")},
			want: ".:53 {\n    bind 169.254.20.10\n    notrack {\n        no_rules\n    }\n}\n\nexample.org:53 {\n    bind 169.254.20.10\n    notrack {\n        interface nl0\n        no_interface\n    }\n}\n",
		},
		{
			name: "stub domain without a root block",
			in:   "cluster.local:53 {\n bind 169.254.20.10\n}\n",
			e:    Expansion{Port: 5353},
			want: "cluster.local:53 {\n    bind 169.254.20.10\n}\n\nacme.local:5353 {\n    errors\n    cache 30\n    forward . 1.2.3.4\n}\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var kd KubeDNS
			if strings.Contains(tt.name, "stub domain") {
				kd.StubDomains = map[string][]string{"acme.local": {"1.2.3.4"}}
			}
			got, err := Expand([]byte(tt.in), tt.e, kd)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tt.want {
				t.Errorf("got\n%s\nwant\n%s", got, tt.want)
			}
		})
	}
}

func TestExpandErrors(t *testing.T) {
	template := readTestdata(t, "upstream-template.Corefile")
	tests := []struct {
		name string
		in   []byte
		e    Expansion
		kd   KubeDNS
		want []string
	}{
		{
			name: "domain left in the template",
			in:   template,
			e:    upstreamFlags(),
			want: []string{"line 3: __PILLAR__DNS__DOMAIN__ is not substituted", "substitute the cluster domain"},
		},
		{
			name: "no -localip",
			in:   upstreamManifestSed(template, LocalDNSVar, "cluster.local", ""),
			e:    Expansion{Upstream: &Upstream{}},
			want: []string{"line 11: __PILLAR__LOCAL__DNS__ is not substituted; pass -localip"},
		},
		{
			name: "no upstream service and no cluster DNS",
			in:   upstreamManifestSed(template, "169.254.20.10", "cluster.local", ""),
			e:    Expansion{LocalIPs: addrs("169.254.20.10")},
			want: []string{"line 12: __PILLAR__CLUSTER__DNS__ is not substituted; pass -upstreamsvc"},
		},
		{
			name: "import",
			in:   []byte(".:53 {\n import common\n}\n"),
			want: []string{"line 2: import is not supported"},
		},
		{
			name: "snippet",
			in:   []byte("(common) {\n errors\n}\n.:53 {\n errors\n}\n"),
			want: []string{"line 1: snippets are not supported"},
		},
		{
			name: "forward option without equivalent",
			in:   []byte("cluster.local:53 {\n forward . __PILLAR__CLUSTER__DNS__ {\n  policy sequential\n }\n}\n"),
			e:    Expansion{Upstream: &Upstream{}},
			want: []string{"line 3: forward option \"policy\" has no upstreamsvc equivalent"},
		},
		{
			name: "unbounded max_connect_attempts",
			in:   []byte("cluster.local:53 {\n forward . __PILLAR__CLUSTER__DNS__ {\n  max_connect_attempts 0\n }\n}\n"),
			e:    Expansion{Upstream: &Upstream{}},
			want: []string{"line 3: max_connect_attempts \"0\": upstreamsvc's max_attempts needs a positive number"},
		},
		{
			name: "cluster DNS among other targets",
			in:   []byte("cluster.local:53 {\n forward . 10.0.0.1 __PILLAR__CLUSTER__DNS__\n}\n"),
			e:    Expansion{Upstream: &Upstream{}},
			want: []string{"line 2: want `forward . __PILLAR__CLUSTER__DNS__`"},
		},
		{
			name: "stub domain is the cluster domain",
			in:   []byte("cluster.local:53 {\n bind 169.254.20.10\n}\n.:53 {\n bind 169.254.20.10\n forward . /etc/resolv.conf\n}\n"),
			kd:   KubeDNS{StubDomains: map[string][]string{"cluster.local": {"10.0.0.1"}}},
			want: []string{"stub domain \"cluster.local\" would serve cluster.local:53, which the server block on line 1 serves already"},
		},
		{
			name: "invalid kube-dns settings",
			in:   []byte(".:53 {\n forward . __PILLAR__UPSTREAM__SERVERS__\n}\n"),
			kd:   KubeDNS{UpstreamNameservers: []string{"[2001:db8::1]:0"}},
			want: []string{"upstreamNameservers"},
		},
		{
			name: "unbalanced braces",
			in:   []byte(".:53 {\n forward . 1.1.1.1 {\n}\n"),
			want: []string{"missing closing brace"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Expand(tt.in, tt.e, tt.kd)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

// TestRenderIsExpandOfTemplate pins down the one code path: Render is the template expanded with what the
// flags of an equivalent node-cache would give.
func TestRenderIsExpandOfTemplate(t *testing.T) {
	for name, c := range goldenConfigs {
		t.Run(name, func(t *testing.T) {
			tpl, err := Template(c)
			if err != nil {
				t.Fatal(err)
			}
			for _, v := range []string{LocalDNSVar, ClusterDNSVar, UpstreamServersVar, PrometheusEndpointVar} {
				if !bytes.Contains(tpl, []byte(v)) {
					t.Errorf("template lacks %s", v)
				}
			}
			if bytes.Contains(tpl, []byte("notrack")) || bytes.Contains(tpl, []byte("upstreamsvc")) {
				t.Error("template carries directives the flags are meant to add")
			}
			hazards, err := Check(tpl, CheckOptions{ClusterDomain: c.withDefaults().ClusterDomain})
			if err != nil || len(hazards) > 0 {
				t.Errorf("Check(template): %v %v", hazards, err)
			}
		})
	}
}

// TestExpandServeStalePreferPositive: with PreferPositive every cache gets serve_stale_policy
// prefer_positive beside its serve_stale, written or added, and every wirecache's serve_stale gets
// prefer_positive; a policy in the base Corefile stays, and so does a serve_stale turned off.
func TestExpandServeStalePreferPositive(t *testing.T) {
	base := `cluster.local:53 {
    wirecache
    cache {
        success 9984 30
    }
    forward . 10.96.0.20
}
in-addr.arpa:53 {
    wirecache {
        serve_stale 10m
    }
    cache 30 {
        serve_stale 10m immediate
    }
    forward . 10.96.0.20
}
ip6.arpa:53 {
    cache 30 {
        serve_stale 0s
    }
    forward . 10.96.0.20
}
.:53 {
    cache 30 {
        serve_stale 1h
        serve_stale_policy prefer_positive
    }
    forward . /etc/resolv.conf
}
`
	got, err := Expand([]byte(base), Expansion{ServeStale: &ServeStale{PreferPositive: true}}, KubeDNS{})
	if err != nil {
		t.Fatal(err)
	}
	want := `cluster.local:53 {
    wirecache {
        serve_stale 1h 5s 1s prefer_positive
    }
    cache {
        success 9984 30
        serve_stale 1h verify 1s 5s
        serve_stale_policy prefer_positive
    }
    forward . 10.96.0.20
}

in-addr.arpa:53 {
    wirecache {
        serve_stale 10m prefer_positive
    }
    cache 30 {
        serve_stale 10m immediate
        serve_stale_policy prefer_positive
    }
    forward . 10.96.0.20
}

ip6.arpa:53 {
    cache 30 {
        serve_stale 0s
    }
    forward . 10.96.0.20
}

.:53 {
    cache 30 {
        serve_stale 1h
        serve_stale_policy prefer_positive
    }
    forward . /etc/resolv.conf
}
`
	if string(got) != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
}
