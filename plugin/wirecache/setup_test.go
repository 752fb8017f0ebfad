package wirecache

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin"
	"github.com/nodelocaldns/nodelocaldns/plugin/clamp"

	"github.com/miekg/dns"
)

func TestSetup(t *testing.T) {
	tests := []struct {
		input    string
		keys     []string
		wantErr  string
		zones    []string
		capacity int
		memory   int64
		min, max time.Duration
		allZones bool
		repeats  bool
		noFast   bool
		rcvbuf   int64         // -1: none (0)
		tcp      [2]int        // tcp_connections; zero: the defaults
		refused  time.Duration // -1: none (0); zero: the default
		servfail time.Duration // -1: none (0); zero: the default
	}{
		{input: "wirecache", zones: []string{"."}, capacity: DefaultCapacity, max: DefaultMaxTTL, allZones: true},
		{input: "wirecache", keys: []string{"cluster.local:53"}, zones: []string{"cluster.local."}, capacity: DefaultCapacity, max: DefaultMaxTTL},
		{input: "wirecache example.org example.net", zones: []string{"example.org.", "example.net."}, capacity: DefaultCapacity, max: DefaultMaxTTL},
		{input: "wirecache {\n capacity 50\n ttl 5 30\n}", zones: []string{"."}, capacity: 50, min: 5 * time.Second, max: 30 * time.Second, allZones: true},
		{input: "wirecache {\n ttl 0 1\n}", zones: []string{"."}, capacity: DefaultCapacity, max: time.Second, allZones: true},
		{input: "wirecache {\n max_memory 64MiB\n}", zones: []string{"."}, capacity: DefaultCapacity, memory: 64 << 20, max: DefaultMaxTTL, allZones: true},
		{input: "wirecache {\n max_memory 512Ki\n}", zones: []string{"."}, capacity: DefaultCapacity, memory: 512 << 10, max: DefaultMaxTTL, allZones: true},
		{input: "wirecache {\n max_memory 1G\n}", zones: []string{"."}, capacity: DefaultCapacity, memory: 1 << 30, max: DefaultMaxTTL, allZones: true},
		{input: "wirecache {\n max_memory 1000000\n}", zones: []string{"."}, capacity: DefaultCapacity, memory: 1000000, max: DefaultMaxTTL, allZones: true},
		{input: "wirecache {\n max_memory 4KiB\n}", wantErr: "below"},
		{input: "wirecache {\n max_memory 8 MiB\n}", wantErr: "Wrong argument count"},
		{input: "wirecache {\n max_memory -1MiB\n}", wantErr: "not a size"},
		{input: "wirecache {\n max_memory 8MB\n}", wantErr: "not a size"},
		{input: "wirecache {\n max_memory 9999999999G\n}", wantErr: "not a size"},
		{input: "wirecache {\n max_memory MiB\n}", wantErr: "not a size"},
		{input: "wirecache {\n repeats_only\n}", zones: []string{"."}, capacity: DefaultCapacity, max: DefaultMaxTTL, allZones: true, repeats: true},
		{input: "wirecache {\n repeats_only 2\n}", wantErr: "Wrong argument count"},
		{input: "wirecache {\n capacity 0\n}", wantErr: "capacity must be a positive"},
		{input: "wirecache {\n capacity -3\n}", wantErr: "capacity must be a positive"},
		{input: "wirecache {\n capacity ten\n}", wantErr: "capacity must be a positive"},
		{input: "wirecache {\n capacity\n}", wantErr: "Wrong argument count"},
		{input: "wirecache {\n capacity 1 2\n}", wantErr: "Wrong argument count"},
		{input: "wirecache {\n ttl 5\n}", wantErr: "Wrong argument count"},
		{input: "wirecache {\n ttl 30 5\n}", wantErr: "larger than MAX"},
		{input: "wirecache {\n ttl 0 0\n}", wantErr: "at least 1 second"},
		{input: "wirecache {\n ttl -1 5\n}", wantErr: "not a number of seconds"},
		{input: "wirecache {\n ttl 1 2147483648\n}", wantErr: "not a number of seconds"},
		{input: "wirecache {\n ttl 1 5s\n}", wantErr: "not a number of seconds"},
		{input: "wirecache {\n capacity 5\n capacity 6\n}", wantErr: "given twice"},
		{input: "wirecache {\n prefetch 5\n}", wantErr: "unknown property 'prefetch'"},
		{input: "wirecache\nwirecache", wantErr: plugin.ErrOnce.Error()},
		{input: "wirecache {\n fastpath off\n}", zones: []string{"."}, capacity: DefaultCapacity, max: DefaultMaxTTL, allZones: true, noFast: true},
		{input: "wirecache {\n fastpath on\n}", zones: []string{"."}, capacity: DefaultCapacity, max: DefaultMaxTTL, allZones: true},
		{input: "wirecache {\n fastpath\n}", wantErr: "fastpath takes on or off"},
		{input: "wirecache {\n fastpath no\n}", wantErr: "fastpath takes on or off"},
		{input: "wirecache {\n rcvbuf 4MiB\n}", zones: []string{"."}, capacity: DefaultCapacity, max: DefaultMaxTTL, allZones: true, rcvbuf: 4 << 20},
		{input: "wirecache {\n rcvbuf 0\n}", zones: []string{"."}, capacity: DefaultCapacity, max: DefaultMaxTTL, allZones: true, rcvbuf: -1},
		{input: "wirecache {\n rcvbuf 64KiB\n}", zones: []string{"."}, capacity: DefaultCapacity, max: DefaultMaxTTL, allZones: true, rcvbuf: 64 << 10},
		{input: "wirecache {\n rcvbuf 63KiB\n}", wantErr: "want 0 (the kernel's default) or 64 KiB to 256 MiB"},
		{input: "wirecache {\n rcvbuf 1GiB\n}", wantErr: "want 0 (the kernel's default) or 64 KiB to 256 MiB"},
		{input: "wirecache {\n rcvbuf lots\n}", wantErr: "rcvbuf: "},
		{input: "wirecache {\n rcvbuf\n}", wantErr: "Wrong argument count"},
		{input: "wirecache {\n tcp_connections 500 20\n}", zones: []string{"."}, capacity: DefaultCapacity, max: DefaultMaxTTL, allZones: true, tcp: [2]int{500, 20}},
		{input: "wirecache {\n tcp_connections 500\n}", zones: []string{"."}, capacity: DefaultCapacity, max: DefaultMaxTTL, allZones: true, tcp: [2]int{500, DefaultTCPConnectionsPerClient}},
		{input: "wirecache {\n tcp_connections 10\n}", zones: []string{"."}, capacity: DefaultCapacity, max: DefaultMaxTTL, allZones: true, tcp: [2]int{10, 10}},
		{input: "wirecache {\n tcp_connections 1 1\n}", zones: []string{"."}, capacity: DefaultCapacity, max: DefaultMaxTTL, allZones: true, tcp: [2]int{1, 1}},
		{input: "wirecache {\n tcp_connections\n}", wantErr: "Wrong argument count"},
		{input: "wirecache {\n tcp_connections 1 2 3\n}", wantErr: "Wrong argument count"},
		{input: "wirecache {\n tcp_connections 0\n}", wantErr: "want a number of connections, at least 1"},
		{input: "wirecache {\n tcp_connections many\n}", wantErr: "want a number of connections, at least 1"},
		{input: "wirecache {\n tcp_connections 100 0\n}", wantErr: "per client from 1 to 100"},
		{input: "wirecache {\n tcp_connections 100 101\n}", wantErr: "per client from 1 to 100"},
		{input: "wirecache {\n refused 30s\n}", zones: []string{"."}, capacity: DefaultCapacity, max: DefaultMaxTTL, allZones: true, refused: 30 * time.Second},
		{input: "wirecache {\n refused 0s\n}", zones: []string{"."}, capacity: DefaultCapacity, max: DefaultMaxTTL, allZones: true, refused: -1},
		{input: "wirecache {\n refused 5m\n}", zones: []string{"."}, capacity: DefaultCapacity, max: DefaultMaxTTL, allZones: true, refused: 5 * time.Minute},
		{input: "wirecache {\n refused 6m\n}", wantErr: "not 0s (hold none) or a duration from 1s to 5m0s"},
		{input: "wirecache {\n refused 500ms\n}", wantErr: "not 0s (hold none) or a duration from 1s to 5m0s"},
		{input: "wirecache {\n refused -5s\n}", wantErr: "not 0s (hold none) or a duration from 1s to 5m0s"},
		{input: "wirecache {\n refused 5\n}", wantErr: "not 0s (hold none) or a duration from 1s to 5m0s"},
		{input: "wirecache {\n refused\n}", wantErr: "Wrong argument count"},
		{input: "wirecache {\n servfail 10s\n}", zones: []string{"."}, capacity: DefaultCapacity, max: DefaultMaxTTL, allZones: true, servfail: 10 * time.Second},
		{input: "wirecache {\n servfail 0s\n refused 0s\n}", zones: []string{"."}, capacity: DefaultCapacity, max: DefaultMaxTTL, allZones: true, servfail: -1, refused: -1},
		{input: "wirecache {\n servfail 301s\n}", wantErr: "servfail: \"301s\" is not 0s (hold none) or a duration from 1s to 5m0s"},
		{input: "wirecache {\n servfail 1s 2s\n}", wantErr: "Wrong argument count"},
	}
	for _, tc := range tests {
		t.Run(tc.input, func(t *testing.T) {
			c := caddy.NewTestController("dns", tc.input)
			c.ServerBlockKeys = tc.keys
			if c.ServerBlockKeys == nil {
				c.ServerBlockKeys = []string{"."}
			}
			wc, err := parse(c)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.memory == 0 {
				tc.memory = DefaultMaxMemory
			}
			if want := defaulted(tc.rcvbuf, DefaultRecvBuffer); wc.RecvBuffer != want {
				t.Errorf("rcvbuf %d, want %d", wc.RecvBuffer, want)
			}
			if want := defaulted(tc.refused, DefaultRefusedFor); wc.RefusedFor != want {
				t.Errorf("refused %v, want %v", wc.RefusedFor, want)
			}
			if want := defaulted(tc.servfail, DefaultServfailFor); wc.ServfailFor != want {
				t.Errorf("servfail %v, want %v", wc.ServfailFor, want)
			}
			if tc.tcp == [2]int{} {
				tc.tcp = [2]int{DefaultTCPConnections, DefaultTCPConnectionsPerClient}
			}
			if got := [2]int{wc.TCPConnections, wc.TCPConnectionsPerClient}; got != tc.tcp {
				t.Errorf("tcp_connections %v, want %v", got, tc.tcp)
			}
			if wc.FastPath == tc.noFast {
				t.Errorf("fastpath %v, want %v", wc.FastPath, !tc.noFast)
			}
			if !slices.Equal(wc.Zones, tc.zones) || wc.Capacity != tc.capacity || wc.MaxMemory != tc.memory || wc.MinTTL != tc.min || wc.MaxTTL != tc.max {
				t.Errorf("got zones %v capacity %d max_memory %d ttl %v..%v", wc.Zones, wc.Capacity, wc.MaxMemory, wc.MinTTL, wc.MaxTTL)
			}
			if wc.allZones != tc.allZones {
				t.Errorf("allZones %v, want %v", wc.allZones, tc.allZones)
			}
			if wc.RepeatsOnly != tc.repeats || (wc.doorkeeper != nil) != tc.repeats {
				t.Errorf("repeats_only %v (doorkeeper %v), want %v", wc.RepeatsOnly, wc.doorkeeper != nil, tc.repeats)
			}
			if wc.store.len() != 0 || len(wc.store.shards) == 0 {
				t.Error("store not initialized")
			}
		})
	}
}

// defaulted reads a TestSetup field that is zero for the default and -1 for none (0).
func defaulted[T ~int64](v, def T) T {
	switch v {
	case 0:
		return def
	case -1:
		return 0
	}
	return v
}

func TestSetupAddsPlugin(t *testing.T) {
	c := caddy.NewTestController("dns", "wirecache")
	if err := setup(c); err != nil {
		t.Fatal(err)
	}
	plugins := dnsserver.GetConfig(c).Plugin
	if len(plugins) != 1 {
		t.Fatalf("%d plugins added, want 1", len(plugins))
	}
	if h := plugins[0](nil); h.Name() != pluginName {
		t.Errorf("handler %q added", h.Name())
	}
	if err := setup(caddy.NewTestController("dns", "wirecache {\n bogus\n}")); err == nil || !strings.HasPrefix(err.Error(), "plugin/wirecache") {
		t.Errorf("error %v, want a plugin/wirecache error", err)
	}
}

// named is a handler that only has a name, standing in for a plugin of the server block.
type named string

func (n named) ServeDNS(context.Context, dns.ResponseWriter, *dns.Msg) (int, error) { return 0, nil }
func (n named) Name() string                                                        { return string(n) }

// compiledConfig returns a server block with the given handlers, compiled and registered as caddy does before
// OnStartup.
func compiledConfig(t *testing.T, handlers ...plugin.Handler) *dnsserver.Config {
	t.Helper()
	cfg := &dnsserver.Config{Zone: ".", Port: "0", Transport: "dns"}
	for _, h := range handlers {
		cfg.AddPlugin(func(plugin.Handler) plugin.Handler { return h })
	}
	if _, err := dnsserver.NewServer("dns://127.0.0.1:0", []*dnsserver.Config{cfg}); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestBlockTTLFloorer(t *testing.T) {
	cl := clamp.New()
	floorer, err := blockTTLFloorer(compiledConfig(t, named(pluginName), cl, named("cache"), named("forward")))
	if err != nil || floorer != ttlFloorer(cl) {
		t.Errorf("block with clamp: %v, %v; want the clamp handler", floorer, err)
	}
	if floorer, err := blockTTLFloorer(compiledConfig(t, named(pluginName), named("cache"), named("forward"))); err != nil || floorer != nil {
		t.Errorf("block without clamp: %v, %v; want nothing", floorer, err)
	}
	// Another plugin under the name clamp: starting without its floor would break its window silently.
	if _, err := blockTTLFloorer(compiledConfig(t, named(pluginName), named(clampPlugin), named("forward"))); err == nil || !strings.Contains(err.Error(), "TTL floor") {
		t.Errorf("block with a clamp that reports no floor: error %v", err)
	}
}

func TestStepAsideReasons(t *testing.T) {
	config := func(names ...string) *dnsserver.Config {
		cfg := &dnsserver.Config{Zone: ".", Port: "0", Transport: "dns"}
		for _, name := range names {
			cfg.AddPlugin(func(plugin.Handler) plugin.Handler { return named(name) })
		}
		// NewServer compiles the chain and registers each handler under its name, as caddy does before
		// OnStartup.
		if _, err := dnsserver.NewServer("dns://127.0.0.1:0", []*dnsserver.Config{cfg}); err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	for _, name := range everyQueryPlugins {
		if reasons := stepAsideReasons(config(pluginName, "cache", name, "forward")); len(reasons) != 1 || !strings.HasPrefix(reasons[0], name) {
			t.Errorf("block with %s: reasons %q", name, reasons)
		}
	}
	if reasons := stepAsideReasons(config(pluginName, "prometheus", "errors", "clamp", "cache", "forward")); len(reasons) != 0 {
		t.Errorf("node-cache block: reasons %q, want none", reasons)
	}
	view := config(pluginName, "cache")
	view.ViewName = "internal"
	if reasons := stepAsideReasons(view); len(reasons) != 1 || !strings.Contains(reasons[0], "view") {
		t.Errorf("block with a view: reasons %q", reasons)
	}
	shed := config(pluginName, "cache")
	shed.UDPDecorateWriterFunc = func(*dnsserver.Server) dns.DecorateWriter { return nil }
	if reasons := stepAsideReasons(shed); len(reasons) != 1 || !strings.Contains(reasons[0], "shed") {
		t.Errorf("block with shed: reasons %q", reasons)
	}
	tls := config(pluginName, "cache")
	tls.Transport = "tls"
	if reasons := stepAsideReasons(tls); len(reasons) != 1 || !strings.Contains(reasons[0], "transport tls") {
		t.Errorf("DNS over TLS block: reasons %q", reasons)
	}
}
