package wirecache

import (
	"context"
	"crypto/tls"
	"maps"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin"
	"github.com/coredns/coredns/request"

	"github.com/miekg/dns"
	"github.com/pires/go-proxyproto"
)

// TestFastPathKnowsEveryServerOption fails when CoreDNS's server or server block configuration has a field
// the fast path does not classify, or when a field it classifies is gone: a new listener wrapper, writer
// decorator or server option must be decided on (honoured, or the address kept in the chain) before it
// ships. At run time such a field keeps every address in the chain (serverOptionReasons).
func TestFastPathKnowsEveryServerOption(t *testing.T) {
	for _, tc := range []struct {
		typ  reflect.Type
		uses map[string]fieldUse
	}{
		{reflect.TypeFor[dnsserver.Server](), serverFieldUses},
		{reflect.TypeFor[dnsserver.Config](), configFieldUses},
	} {
		if unknown := unknownFields(tc.typ, tc.uses); len(unknown) > 0 {
			t.Errorf("%v has fields the fast path does not classify: %s", tc.typ, strings.Join(unknown, ", "))
		}
		for name, u := range tc.uses {
			if _, ok := tc.typ.FieldByName(name); !ok {
				t.Errorf("%v has no field %s any more (classified %d: %s)", tc.typ, name, u.use, u.why)
			}
			if u.why == "" {
				t.Errorf("%v.%s is classified without a reason", tc.typ, name)
			}
		}
	}
	// A field the tables do not know keeps the address in the chain.
	uses := maps.Clone(serverFieldUses)
	delete(uses, "connPolicy")
	if unknown := unknownFields(reflect.TypeFor[dnsserver.Server](), uses); !slices.Equal(unknown, []string{"connPolicy"}) {
		t.Errorf("unknown fields %v, want connPolicy", unknown)
	}
}

// TestServerOptionReasons sets each option that keeps an address in the chain on one block of a server, and
// each option the fast path honours, and checks which give a reason.
func TestServerOptionReasons(t *testing.T) {
	one := 1
	for _, tc := range []struct {
		name   string
		set    func(*dnsserver.Config)
		reason string // "" when the fast path may serve the address
	}{
		{"nothing", func(*dnsserver.Config) {}, ""},
		{"proxyproto", func(c *dnsserver.Config) {
			c.ProxyProtoConnPolicy = func(proxyproto.ConnPolicyOptions) (proxyproto.Policy, error) { return proxyproto.USE, nil }
		}, "proxyproto"},
		{"proxyproto session tracking", func(c *dnsserver.Config) { c.ProxyProtoUDPSessionTrackingTTL = time.Minute }, "session tracking"},
		{"proxyproto tlv_metadata", func(c *dnsserver.Config) { c.ProxyProtoTLVMetadata = true }, "TLV"},
		{"shed", func(c *dnsserver.Config) {
			c.UDPDecorateWriterFunc = func(*dnsserver.Server) dns.DecorateWriter { return nil }
		}, "shed"},
		{"opcode", func(c *dnsserver.Config) { c.AllowOpcode(dns.OpcodeUpdate) }, "opcodes"},
		{"view", func(c *dnsserver.Config) {
			c.ViewName = "v"
			c.FilterFuncs = []dnsserver.FilterFunc{func(context.Context, *request.Request) bool { return true }}
		}, "view"},
		{"timeouts", func(c *dnsserver.Config) {
			c.ReadTimeout, c.WriteTimeout, c.IdleTimeout, c.MaxTCPQueries = time.Second, time.Second, time.Second, &one
		}, ""},
		{"tsig", func(c *dnsserver.Config) { c.TsigSecret = map[string]string{"key.": "c2VjcmV0"} }, ""},
		{"multisocket", func(c *dnsserver.Config) { c.NumSockets = 2 }, ""},
		{"debug", func(c *dnsserver.Config) { c.Debug, c.Stacktrace = true, true }, ""},
		{"root", func(c *dnsserver.Config) { c.Root = "/tmp" }, ""},
		{"tls", func(c *dnsserver.Config) { c.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS13} }, ""},
		{"transport limits", func(c *dnsserver.Config) {
			c.MaxQUICStreams, c.MaxQUICConnections, c.MaxQUICWorkerPoolSize = &one, &one, &one
			c.MaxGRPCStreams, c.MaxGRPCConnections = &one, &one
			c.MaxHTTPSConnections, c.MaxHTTPSStreams, c.MaxHTTPS3Streams, c.MaxHTTPS3Connections = &one, &one, &one, &one
			c.HTTPRequestValidateFunc = func(*http.Request) bool { return true }
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The option on the block of another zone than wirecache's: it applies to the whole address.
			other := &dnsserver.Config{Zone: "example.net.", ListenHosts: []string{"127.0.0.1"}, Port: "53", Transport: "dns"}
			root := &dnsserver.Config{Zone: ".", ListenHosts: []string{"127.0.0.1"}, Port: "53", Transport: "dns"}
			tc.set(other)
			srv, err := dnsserver.NewServer("dns://127.0.0.1:53", []*dnsserver.Config{other, root})
			if err != nil {
				t.Fatal(err)
			}
			zones, err := serverZones(srv)
			if err != nil {
				t.Fatal(err)
			}
			reasons := serverOptionReasons(srv, zones)
			switch {
			case tc.reason == "" && len(reasons) > 0:
				t.Errorf("reasons %q, want none", reasons)
			case tc.reason != "" && !slices.ContainsFunc(reasons, func(r string) bool { return strings.Contains(r, tc.reason) }):
				t.Errorf("reasons %q, want one about %s", reasons, tc.reason)
			}
		})
	}
}

// TestServerStepAsideReasons: a UDP writer decorator on any block of an address makes wirecache pass the
// address's UDP queries on in every block, since it writes hits with Write, which miekg/dns sends past the
// decorator.
func TestServerStepAsideReasons(t *testing.T) {
	other := &dnsserver.Config{Zone: "example.net.", ListenHosts: []string{"127.0.0.1"}, Port: "53", Transport: "dns"}
	root := &dnsserver.Config{Zone: ".", ListenHosts: []string{"127.0.0.1"}, Port: "53", Transport: "dns"}
	srv, err := dnsserver.NewServer("dns://127.0.0.1:53", []*dnsserver.Config{other, root})
	if err != nil {
		t.Fatal(err)
	}
	if reasons := serverStepAsideReasons(srv); len(reasons) > 0 {
		t.Errorf("no decorator: reasons %q", reasons)
	}
	other.UDPDecorateWriterFunc = func(*dnsserver.Server) dns.DecorateWriter { return nil }
	if srv, err = dnsserver.NewServer("dns://127.0.0.1:53", []*dnsserver.Config{other, root}); err != nil {
		t.Fatal(err)
	}
	if reasons := serverStepAsideReasons(srv); len(reasons) != 1 || !strings.Contains(reasons[0], "shed") {
		t.Errorf("a decorator in another block: reasons %q, want one about shed", reasons)
	}
}

// testOptionDirective is a test plugin that sets the server block options no plugin this module builds sets
// (tls and dynupdate need modules it does not require), as those plugins set them:
//
//	wirecachetestoption tls | opcode OPCODE | validate | decorator NAME | bypass ZONE...
//
// decorator installs a UDP writer decorator that counts every reply written through it in decorated[NAME];
// bypass adds a handler that passes every query on and says, as dynupdate does, that no cache may hold ZONE.
const testOptionDirective = "wirecachetestoption"

// decorated counts the replies each decorator of testOptionDirective saw, by name.
var decorated sync.Map // string -> *atomic.Int64

func decoratedWrites(name string) *atomic.Int64 {
	n, _ := decorated.LoadOrStore(name, new(atomic.Int64))
	return n.(*atomic.Int64)
}

func init() { plugin.Register(testOptionDirective, setupTestOption) }

func setupTestOption(c *caddy.Controller) error {
	cfg := dnsserver.GetConfig(c)
	for c.Next() {
		args := c.RemainingArgs()
		if len(args) == 0 {
			return c.ArgErr()
		}
		switch args[0] {
		case "tls":
			cfg.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS13}
		case "opcode":
			opcode, ok := dns.StringToOpcode[strings.ToUpper(args[len(args)-1])]
			if len(args) != 2 || !ok {
				return c.ArgErr()
			}
			cfg.AllowOpcode(opcode)
		case "validate":
			cfg.HTTPRequestValidateFunc = func(*http.Request) bool { return true }
		case "decorator":
			if len(args) != 2 {
				return c.ArgErr()
			}
			writes := decoratedWrites(args[1])
			cfg.UDPDecorateWriterFunc = func(*dnsserver.Server) dns.DecorateWriter {
				return func(w dns.Writer) dns.Writer { return countingWriter{w, writes} }
			}
		case "bypass":
			if len(args) < 2 {
				return c.ArgErr()
			}
			zones := plugin.OriginsFromArgsOrServerBlock(args[1:], c.ServerBlockKeys)
			cfg.AddPlugin(func(next plugin.Handler) plugin.Handler { return bypassHandler{next, zones} })
		default:
			return c.Errf("unknown option '%s'", args[0])
		}
	}
	return nil
}

// countingWriter counts the replies written through it, before they leave.
type countingWriter struct {
	dns.Writer
	writes *atomic.Int64
}

func (w countingWriter) Write(b []byte) (int, error) {
	w.writes.Add(1)
	return w.Writer.Write(b)
}

// TestFastPathOnePerAddress: under multisocket an address has several servers, built from the same blocks;
// the blocks' first queries may come through different ones, and the address must still get one fast path
// (two would take turns steering the group to themselves).
func TestFastPathOnePerAddress(t *testing.T) {
	cfg := &dnsserver.Config{Zone: ".", ListenHosts: []string{"127.0.0.1"}, Port: "53", Transport: "dns", NumSockets: 2}
	f := &fastPaths{blocks: map[*dnsserver.Config]*WireCache{}, servers: map[string]*fastPath{}}
	for range 2 {
		srv, err := dnsserver.NewServer("dns://127.0.0.1:53", []*dnsserver.Config{cfg})
		if err != nil {
			t.Fatal(err)
		}
		f.notice(context.WithValue(context.Background(), dnsserver.Key{}, srv))
	}
	f.starting.Wait()
	if len(f.servers) != 1 {
		t.Errorf("%d fast paths tried for one address, want one", len(f.servers))
	}
}

// bypassHandler passes every query on, and says that no cache may hold its zones (cache.ZoneBypasser).
type bypassHandler struct {
	next  plugin.Handler
	zones []string
}

func (h bypassHandler) ServeDNS(ctx context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
	return plugin.NextOrFailure(h.Name(), h.next, ctx, w, r)
}
func (h bypassHandler) Name() string               { return testOptionDirective }
func (h bypassHandler) CacheBypassZones() []string { return h.zones }
