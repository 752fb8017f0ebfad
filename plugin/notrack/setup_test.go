//go:build linux

package notrack

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin/pkg/transport"
)

var (
	linkLocal = netip.MustParseAddr("169.254.20.10")
	clusterIP = netip.MustParseAddr("10.96.0.10")
)

func TestSetup(t *testing.T) {
	bound := []string{"169.254.20.10", "10.96.0.10"}
	tests := []struct {
		input  string
		listen []string // bind's addresses; nil for no bind
		port   string
		// want, when err is empty
		addrs    []netip.Addr
		wantPort uint16
		extra    []uint16
		settings nodeSettings
		err      string // substring of the expected error, empty for none
	}{
		// good
		{input: `notrack`, listen: bound, addrs: []netip.Addr{clusterIP, linkLocal}, wantPort: 53},
		{input: `notrack {
		}`, listen: bound, port: "5353", addrs: []netip.Addr{clusterIP, linkLocal}, wantPort: 5353},
		{input: `notrack 169.254.20.10`, listen: bound, addrs: []netip.Addr{linkLocal}, wantPort: 53},
		{input: `notrack ::ffff:169.254.20.10 169.254.20.10`, listen: bound, addrs: []netip.Addr{linkLocal}, wantPort: 53},
		{input: `notrack 169.254.20.10 fd00::10`, listen: nil, addrs: []netip.Addr{linkLocal, netip.MustParseAddr("fd00::10")}, wantPort: 53},
		{input: `notrack 10.96.0.10`, listen: []string{"0.0.0.0"}, addrs: []netip.Addr{clusterIP}, wantPort: 53},
		{input: `notrack {
			interface nl0
			ports 8080 9253
			ports 8080 8081
			sync 30s
			backend LEGACY
			lock /tmp/nodelocaldns.lock
			no_interface
			no_rules
			skip_teardown
		}`, listen: bound, addrs: []netip.Addr{clusterIP, linkLocal}, wantPort: 53, extra: []uint16{8080, 8081, 9253},
			settings: nodeSettings{Interface: "nl0", Sync: 30 * time.Second, Backend: "legacy", Lock: "/tmp/nodelocaldns.lock",
				NoInterface: true, NoRules: true, SkipTeardown: true}},
		{input: `notrack {
			handover 10.96.0.11 fd00::b
			service 10.96.0.10
		}`, listen: bound, addrs: []netip.Addr{clusterIP, linkLocal}, wantPort: 53,
			settings: nodeSettings{Interface: "nodelocaldns", Sync: time.Minute, Backend: "auto", Lock: "/run/nodelocaldns.lock",
				Handover: true, HandoverUpstream: "10.96.0.11 fd00::b", ServiceAddresses: "10.96.0.10"}},
		{input: `notrack {
			handover
		}`, listen: bound, addrs: []netip.Addr{clusterIP, linkLocal}, wantPort: 53,
			settings: nodeSettings{Interface: "nodelocaldns", Sync: time.Minute, Backend: "auto", Lock: "/run/nodelocaldns.lock", Handover: true}},

		// bad
		{input: `notrack {
			handover 10.96.0.0/12
		}`, listen: bound, err: "handover: \"10.96.0.0/12\" is not an IP address"},
		{input: `notrack {
			service
		}`, listen: bound, err: "Wrong argument count"},
		{input: `notrack {
			service 0.0.0.0
		}`, listen: bound, err: "service: 0.0.0.0 cannot be a local DNS address"},
		{input: `notrack`, listen: nil, err: "listens on every address"},
		{input: `notrack`, listen: []string{"::"}, err: "listens on every address"},
		{input: `notrack`, listen: []string{}, err: "listens on no address"},
		{input: `notrack 10.0.0.1`, listen: bound, err: "10.0.0.1 is not an address this server block listens on"},
		{input: `notrack nodelocaldns`, listen: bound, err: `"nodelocaldns" is not an IP address`},
		{input: `notrack 169.254.20.0/24`, listen: bound, err: "is not an IP address"},
		{input: `notrack 0.0.0.0`, listen: nil, err: "0.0.0.0 cannot be a local DNS address"},
		{input: `notrack ff02::1`, listen: nil, err: "cannot be a local DNS address"},
		{input: `notrack fe80::1%eth0`, listen: nil, err: "cannot be a local DNS address"},
		{input: `notrack`, listen: bound, port: "x", err: `port "x" is not a port number`},
		{input: "notrack\nnotrack", listen: bound, err: "this plugin can only be used once per Server Block"},
		{input: `notrack {
			ports 0
		}`, listen: bound, err: `ports: "0" is not a port`},
		{input: `notrack {
			ports 65536
		}`, listen: bound, err: `ports: "65536" is not a port`},
		{input: `notrack {
			ports
		}`, listen: bound, err: "Wrong argument count"},
		{input: `notrack {
			sync 10ms
		}`, listen: bound, err: "sync 10ms: must be at least 1s"},
		{input: `notrack {
			sync often
		}`, listen: bound, err: "sync: time: invalid duration"},
		{input: `notrack {
			sync 1m
			sync 2m
		}`, listen: bound, err: "property 'sync' given more than once"},
		{input: `notrack {
			backend iptables
		}`, listen: bound, err: `unknown rules backend "iptables"`},
		{input: `notrack {
			interface
		}`, listen: bound, err: "Wrong argument count"},
		{input: `notrack {
			interface a/b
		}`, listen: bound, err: "invalid link name"},
		{input: `notrack {
			interface averyveryverylongname
		}`, listen: bound, err: "invalid link name"},
		{input: `notrack {
			no_rules please
		}`, listen: bound, err: "Wrong argument count"},
		{input: `notrack {
			lock
		}`, listen: bound, err: "Wrong argument count"},
		{input: `notrack {
			teardown
		}`, listen: bound, err: "unknown property 'teardown'"},
	}
	for i, tc := range tests {
		c := caddy.NewTestController("dns", tc.input)
		cfg := dnsserver.GetConfig(c)
		if tc.listen != nil {
			cfg.ListenHosts = tc.listen
		}
		cfg.Port = tc.port
		cfg.Zone = "cluster.local."
		o, err := parse(c)
		var b *block
		if err == nil {
			b, err = newBlock(cfg, o)
		}
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("test %d: error %v, want one containing %q", i, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("test %d: %v", i, err)
			continue
		}
		if !slices.Equal(b.addrs, tc.addrs) || b.port != tc.wantPort || !slices.Equal(b.extra, tc.extra) {
			t.Errorf("test %d: addrs %v port %d extra %v, want %v %d %v", i, b.addrs, b.port, b.extra, tc.addrs, tc.wantPort, tc.extra)
		}
		want := tc.settings
		if want == (nodeSettings{}) {
			want = nodeSettings{Interface: "nodelocaldns", Sync: time.Minute, Backend: "auto", Lock: "/run/nodelocaldns.lock"}
		}
		if got := o.node.settings(); got != want {
			t.Errorf("test %d: settings %+v, want %+v", i, got, want)
		}
	}
}

func TestSetupRefusesOtherTransports(t *testing.T) {
	c := caddy.NewTestController("dns", `notrack`)
	cfg := dnsserver.GetConfig(c)
	cfg.ListenHosts = []string{"169.254.20.10"}
	cfg.Transport = transport.TLS
	o, err := parse(c)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := newBlock(cfg, o); err == nil || !strings.Contains(err.Error(), "not tls://") {
		t.Fatalf("error %v, want one about tls://", err)
	}
}

// TestSetupSharesOneInstance checks that the blocks of one Corefile end up in one instance, whose node-wide
// settings any block may give and blocks that give them must agree on.
func TestSetupSharesOneInstance(t *testing.T) {
	c := caddy.NewTestController("dns", "notrack {\n sync 30s\n ports 8080\n}\n")
	dnsserver.GetConfig(c).ListenHosts = []string{"169.254.20.10", "10.96.0.10"}
	dnsserver.GetConfig(c).Zone = "example.org."
	if err := setup(c); err != nil {
		t.Fatal(err)
	}
	in := instanceOf(c)

	// A second block of the same Corefile: same address, no sync, another extra port.
	o, err := parse(caddy.NewTestController("dns", "notrack 169.254.20.10 {\n ports 9253\n skip_teardown\n}\n"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := &dnsserver.Config{ListenHosts: []string{"169.254.20.10"}, Port: "53", Zone: "."}
	b, err := newBlock(cfg, o)
	if err != nil {
		t.Fatal(err)
	}
	if err := in.add(b, o.node); err != nil {
		t.Fatal(err)
	}
	s := in.opts.settings()
	if s.Sync != 30*time.Second || !s.SkipTeardown {
		t.Errorf("settings %+v: want sync 30s from the first block and skip_teardown from the second", s)
	}
	keys := in.keys()
	want := []claimKey{{endpoint{clusterIP, 53}, "8080"}, {endpoint{linkLocal, 53}, "8080,9253"}}
	if !slices.Equal(keys, want) {
		t.Errorf("keys %v, want %v", keys, want)
	}
	if c := keys[1].claim(true); !slices.Equal(c.ExtraTCPPorts, []uint16{8080, 9253}) || !c.DeferRules || c.DNSPort != 53 {
		t.Errorf("claim %+v", c)
	}
	if c := (claimKey{endpoint{linkLocal, 53}, ""}).claim(false); len(c.ExtraTCPPorts) != 0 || c.DeferRules {
		t.Errorf("claim %+v", c)
	}
	dns, tcp := in.listenAddrs()
	if !slices.Equal(dns, []string{"10.96.0.10:53", "169.254.20.10:53"}) ||
		!slices.Equal(tcp, []string{"10.96.0.10:8080", "169.254.20.10:8080", "169.254.20.10:9253"}) {
		t.Errorf("listen addresses %v and %v", dns, tcp)
	}
	names := in.probeNames()
	if !strings.HasSuffix(names[endpoint{clusterIP, 53}], ".example.org.") || names[endpoint{linkLocal, 53}] == "" {
		t.Errorf("probe names %v", names)
	}

	// A third block that disagrees.
	o, err = parse(caddy.NewTestController("dns", "notrack {\n sync 1m\n}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := in.add(b, o.node); err == nil || !strings.Contains(err.Error(), "sync is 30s at") || !strings.Contains(err.Error(), "but 1m0s at") {
		t.Errorf("conflicting sync: error %v", err)
	}
}

func TestRestartNeeded(t *testing.T) {
	base := nodeSettings{Interface: "nodelocaldns", Sync: time.Minute, Backend: "auto", Lock: "/run/nodelocaldns.lock"}
	same := base
	same.Sync, same.SkipTeardown = time.Second, true
	if err := base.restartNeeded(same); err != nil {
		t.Errorf("sync and skip_teardown change by reload, got %v", err)
	}
	other := base
	other.Interface, other.NoRules = "nl0", true
	err := base.restartNeeded(other)
	if err == nil || !strings.Contains(err.Error(), "interface nodelocaldns -> nl0, no_rules false -> true") {
		t.Errorf("error %v", err)
	}
}
