package corefile

import (
	"bytes"
	"flag"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/bytesize"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/ from the current output")

func addrs(ss ...string) []netip.Addr {
	out := make([]netip.Addr, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParseAddr(s)
	}
	return out
}

// goldenConfigs are the configurations whose Corefiles are kept in testdata/NAME.golden.
var goldenConfigs = map[string]Config{
	"iptables": {
		LocalIPs:      addrs("169.254.20.10"),
		ClusterDNSIPs: addrs("10.96.0.10"),
	},
	"ipvs": {
		Mode:          ModeIPVS,
		LocalIPs:      addrs("169.254.20.10"),
		ClusterDNSIPs: addrs("10.96.0.10"),
	},
	"dualstack": {
		LocalIPs:      addrs("169.254.20.10", "fd00:169:254::10"),
		ClusterDNSIPs: addrs("10.96.0.10", "fd00:10:96::a"),
	},
	"ipv6": {
		LocalIPs:      addrs("fd00:169:254::10"),
		ClusterDNSIPs: addrs("fd00:10:96::a"),
		ClusterDomain: "k8s.example.org",
	},
	"stubdomains": {
		LocalIPs:      addrs("169.254.20.10"),
		ClusterDNSIPs: addrs("10.96.0.10"),
		StubDomains: map[string][]string{
			"acme.local":       {"1.2.3.4"},
			"corp.example.com": {"10.150.0.1:5353", "[2001:db8::53]:53"},
		},
	},
	"custom-upstreams": {
		LocalIPs:      addrs("169.254.20.10"),
		ClusterDNSIPs: addrs("10.96.0.10"),
		NodeUpstreams: []string{"8.8.8.8", "[2001:4860:4860::8888]:53"},
	},
	// Every knob away from its default.
	"tuned": {
		LocalIPs:       addrs("169.254.25.10"),
		ClusterDNSIPs:  addrs("10.32.0.10"),
		Port:           5353,
		Upstream:       Upstream{Service: "coredns-upstream", Namespace: "dns", Fallback: []string{"10.32.0.53"}},
		MaxAttempts:    3,
		Cache:          Cache{Memory: 32 << 20, SuccessCapacity: 39936, SuccessTTL: 60, DenialCapacity: 2048, DenialTTL: 10, OtherTTL: 15},
		Clamp:          Clamp{SuccessMin: 10, DenialMin: 2},
		WireCache:      WireCache{Capacity: 4096, TCPConnections: 300, TCPConnectionsPerClient: 40},
		ServeStale:     ServeStale{For: 30 * time.Minute, TTL: 10 * time.Second, Verify: 500 * time.Millisecond},
		Log:            true,
		HealthPort:     9080,
		ReadyPort:      9181,
		MetricsAddress: "10.0.0.7:9253",
		Notrack:        Notrack{Interface: "nlcache0", Sync: 30 * time.Second, Backend: "nft", SkipTeardown: true},
	},
	"no-notrack": {
		LocalIPs:      addrs("169.254.20.10"),
		ClusterDNSIPs: addrs("10.96.0.10"),
		Mode:          ModeIPVS,
		Notrack:       Notrack{Disabled: true},
		WireCache:     WireCache{Disabled: true},
		ServeStale:    ServeStale{Disabled: true},
	},
}

func TestRenderGolden(t *testing.T) {
	for name, c := range goldenConfigs {
		t.Run(name, func(t *testing.T) {
			got, err := Render(c)
			if err != nil {
				t.Fatal(err)
			}
			checkGolden(t, name+".golden", got)
		})
	}
}

// TestRenderShape checks the properties the goldens are meant to show, so that an -update cannot quietly
// accept a Corefile that lost them.
func TestRenderShape(t *testing.T) {
	for name, c := range goldenConfigs {
		t.Run(name, func(t *testing.T) {
			out, err := Render(c)
			if err != nil {
				t.Fatal(err)
			}
			f, err := Parse(out)
			if err != nil {
				t.Fatal(err)
			}
			full := c.withDefaults()
			want := []string{full.ClusterDomain, "in-addr.arpa", "ip6.arpa", "."}
			for d := range c.StubDomains {
				want = append(want, d)
			}
			if len(f.Blocks) != len(want) {
				t.Fatalf("got %d blocks, want %d (%v)", len(f.Blocks), len(want), want)
			}
			var budget int64 // max_memory of the blocks, stub domains aside
			var bindWant []string
			for _, ip := range full.LocalIPs {
				bindWant = append(bindWant, ip.String())
			}
			if full.Mode == ModeIPTables {
				for _, ip := range full.ClusterDNSIPs {
					bindWant = append(bindWant, ip.String())
				}
			}
			for _, b := range f.Blocks {
				binds := b.Find("bind")
				if len(binds) != 1 || strings.Join(binds[0].Args, " ") != strings.Join(bindWant, " ") {
					t.Errorf("block %v: bind %v, want %v", b.Keys, binds, bindWant)
				}
				if got := b.Has("notrack"); got == c.Notrack.Disabled {
					t.Errorf("block %v: notrack present %v, want %v", b.Keys, got, !c.Notrack.Disabled)
				}
				// One cache per block: wirecache, bounded in bytes, unless log or the configuration leaves
				// it out; then the cache plugin.
				wire := !c.WireCache.Disabled && !b.Has("log")
				if b.Has("wirecache") != wire || b.Has("cache") == wire {
					t.Errorf("block %v: wirecache %v, cache %v, with log %v", b.Keys, b.Has("wirecache"), b.Has("cache"), b.Has("log"))
				}
				if wire {
					o := b.Find("wirecache")[0].Option("max_memory")
					if o == nil || len(o.Args) != 1 {
						t.Fatalf("block %v: wirecache without max_memory", b.Keys)
					}
					n, err := bytesize.Parse(o.Args[0])
					if err != nil {
						t.Fatal(err)
					}
					if !isStub(c, b) {
						budget += n
					}
				}
				if !b.Has("loop") || !b.Has("prometheus") || !b.Has("clamp") && !b.Has("cache") {
					t.Errorf("block %v: missing loop, prometheus, or clamp and cache", b.Keys)
				}
			}
			if budget > full.Cache.Memory || !c.WireCache.Disabled && !c.Log && budget < full.Cache.Memory-blockShares.total {
				t.Errorf("the blocks' max_memory add up to %d, want the budget of %d", budget, full.Cache.Memory)
			}
			cluster := f.Blocks[0]
			svc := cluster.Find("upstreamsvc")
			if len(svc) != 1 || svc[0].Option("force_tcp") == nil {
				t.Errorf("cluster block: want upstreamsvc with force_tcp, got %v", svc)
			}
			if cache := cluster.Find("cache"); len(cache) > 0 {
				if s, d := cache[0].Option("success"), cache[0].Option("denial"); s == nil || d == nil {
					t.Errorf("cluster cache lacks success or denial: %+v", cache)
				}
			}
			if !cluster.Has("clamp") {
				t.Error("cluster block has no clamp")
			}
			health := cluster.Find("health")
			wantHealth := netip.AddrPortFrom(full.LocalIPs[0], full.HealthPort).String()
			if len(health) != 1 || health[0].Args[0] != wantHealth {
				t.Errorf("health %v, want %s", health, wantHealth)
			}
			hazards, err := Check(out, CheckOptions{ClusterDomain: full.ClusterDomain, ResolvConf: []byte("nameserver 10.0.0.2\n"),
				MemoryLimit: 1 << 30})
			if err != nil || len(hazards) > 0 {
				t.Errorf("Check: %v %v", hazards, err)
			}
		})
	}
}

// port is the ":PORT" of the blocks of c.
func port(c Config) string { return ":" + strconv.Itoa(int(c.Port)) }

// isStub reports whether b is a stub domain's block, a copy of the `.` block.
func isStub(c Config, b *Block) bool {
	for d := range c.StubDomains {
		if b.Keys[0] == d+port(c.withDefaults()) {
			return true
		}
	}
	return false
}

func TestRenderIPv6Brackets(t *testing.T) {
	out, err := Render(goldenConfigs["ipv6"])
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"health [fd00:169:254::10]:8080", "ready [fd00:169:254::10]:8181",
		"prometheus [fd00:169:254::10]:9253", "bind fd00:169:254::10 fd00:10:96::a", "k8s.example.org:53 {"} {
		if !bytes.Contains(out, []byte(want)) {
			t.Errorf("missing %q in\n%s", want, out)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	good := goldenConfigs["iptables"]
	tests := []struct {
		name   string
		change func(*Config)
		want   string
	}{
		{"no local IPs", func(c *Config) { c.LocalIPs = nil }, "no local IPs"},
		{"unspecified local IP", func(c *Config) { c.LocalIPs = addrs("0.0.0.0") }, "unicast"},
		{"iptables without cluster DNS", func(c *Config) { c.ClusterDNSIPs = nil }, "kube-dns ClusterIPs"},
		{"unknown mode", func(c *Config) { c.Mode = "nftables" }, "mode"},
		{"bad domain", func(c *Config) { c.ClusterDomain = "Cluster_Local" }, "cluster domain"},
		{"bad service", func(c *Config) { c.Upstream.Service = "9dns" }, "upstream service"},
		{"bad fallback", func(c *Config) { c.Upstream.Fallback = []string{"dns.example.com"} }, "fallback"},
		{"bad stub", func(c *Config) { c.StubDomains = map[string][]string{"acme.local": {"1.2.3.4:0"}} }, "port"},
		{"four upstreams", func(c *Config) { c.NodeUpstreams = []string{"1.1.1.1", "1.0.0.1", "8.8.8.8", "8.8.4.4"} }, "at most 3"},
		{"clamp upside down", func(c *Config) { c.Clamp.SuccessMin = 60 }, "clamp"},
		{"port clash", func(c *Config) { c.ReadyPort = 8080 }, "collide"},
		{"metrics without port", func(c *Config) { c.MetricsAddress = "169.254.20.10" }, "metrics address"},
		{"bad backend", func(c *Config) { c.Notrack.Backend = "ebtables" }, "backend"},
		{"stale TTL in milliseconds", func(c *Config) { c.ServeStale.TTL = 1500 * time.Millisecond }, "whole number of seconds"},
		{"negative stale window", func(c *Config) { c.ServeStale.For = -time.Hour }, "negative"},
		{"cache memory too small", func(c *Config) { c.Cache.Memory = 64 << 10 }, "cache memory"},
		{"negative max attempts", func(c *Config) { c.MaxAttempts = -1 }, "max attempts is negative"},
		{"negative TCP connections", func(c *Config) { c.WireCache.TCPConnections = -1 }, "TCP connections"},
		{"more TCP connections per client than in all", func(c *Config) {
			c.WireCache.TCPConnections, c.WireCache.TCPConnectionsPerClient = 100, 200
		}, "TCP connections"},
		{"more TCP connections per client than the default in all", func(c *Config) { c.WireCache.TCPConnectionsPerClient = 2000 }, "TCP connections"},
	}
	if err := good.Validate(); err != nil {
		t.Fatalf("good config: %v", err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := good
			c.LocalIPs = append([]netip.Addr(nil), good.LocalIPs...)
			tt.change(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want an error containing %q", err, tt.want)
			}
			if _, rerr := Render(c); rerr == nil {
				t.Error("Render accepted an invalid config")
			}
		})
	}
}

func TestRenderHandover(t *testing.T) {
	cfg := Config{LocalIPs: []netip.Addr{netip.MustParseAddr("169.254.20.10")}, ClusterDNSIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")},
		Notrack: Notrack{Handover: true, HandoverUpstream: []netip.Addr{netip.MustParseAddr("10.96.0.11")},
			ServiceAddresses: []netip.Addr{netip.MustParseAddr("10.96.0.10")}}}
	out, err := Render(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"handover 10.96.0.11\n", "service 10.96.0.10\n"} {
		if strings.Count(string(out), want) != strings.Count(string(out), "notrack") {
			t.Errorf("every notrack block should say %q:\n%s", want, out)
		}
	}
	cfg.Notrack = Notrack{Handover: true}
	if out, err = Render(cfg); err != nil || !strings.Contains(string(out), "handover\n") || strings.Contains(string(out), "service") {
		t.Errorf("a hand-over without addresses: %v\n%s", err, out)
	}
}
