package wirecache

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin"
	clog "github.com/coredns/coredns/plugin/pkg/log"
	"github.com/coredns/coredns/plugin/pkg/transport"

	"github.com/nodelocaldns/nodelocaldns/internal/bytesize"
)

var log = clog.NewWithPlugin(pluginName)

func init() { plugin.Register(pluginName, setup) }

func setup(c *caddy.Controller) error {
	wc, err := parse(c)
	if err != nil {
		return plugin.Error(pluginName, err)
	}

	block := strings.Join(c.ServerBlockKeys, " ")
	fast, first := instanceFastPaths(c)
	if first {
		c.OnShutdown(fast.stop)
		c.OnRestart(fast.reload)
		c.OnRestartFailed(fast.reloadFailed)
	}
	c.OnStartup(func() error {
		// The plugin chain is compiled by now, so the handlers of the whole block are known.
		cfg := dnsserver.GetConfig(c)
		if reasons := stepAsideReasons(cfg); len(reasons) > 0 {
			wc.stepAside = true
			log.Warningf("server block %q: %s; wirecache steps aside there and every query goes through the plugin chain",
				block, strings.Join(reasons, "; "))
		}
		floorer, err := blockTTLFloorer(cfg)
		if err != nil {
			return plugin.Error(pluginName, fmt.Errorf("server block %q: %w", block, err))
		}
		wc.floorer = floorer
		wc.bypass = blockBypassZones(cfg)
		wc.metricsZones = blockMetricsZones(cfg, dnsserver.Directives)
		if wc.FastPath && !wc.stepAside {
			if reasons := fastPathReasons(cfg, dnsserver.Directives); len(reasons) > 0 {
				log.Infof("server block %q: no fast path: %s", block, strings.Join(reasons, "; "))
			} else {
				fast.register(cfg, wc)
				wc.fast = fast
			}
		}
		return nil
	})

	dnsserver.GetConfig(c).AddPlugin(func(next plugin.Handler) plugin.Handler {
		wc.Next = next
		return wc
	})

	return nil
}

// everyQueryPlugins are the plugins that must see every query of their block, either to do their job
// (log, dnstap) or because the answer depends on the client or on the query's arrival (acl, tsig, whoami,
// loadbalance, autopath, firewall, erratic, and dns64, which synthesizes AAAA records for IPv6 clients
// only unless allow_ipv4 is set). A hit would hide the query from them.
var everyQueryPlugins = []string{"log", "dnstap", "acl", "tsig", "whoami", "loadbalance", "autopath", "firewall", "erratic", "dns64"}

// stepAsideReasons says why wirecache must not answer queries in the server block of cfg; none means it may.
func stepAsideReasons(cfg *dnsserver.Config) []string {
	var reasons []string
	for _, name := range everyQueryPlugins {
		if cfg.Handler(name) != nil {
			reasons = append(reasons, name+" must see every query")
		}
	}
	if cfg.ViewName != "" || len(cfg.FilterFuncs) > 0 {
		reasons = append(reasons, "view selects the block per query")
	}
	if cfg.UDPDecorateWriterFunc != nil {
		// miekg/dns sends bytes written with Write past the decorator, and shed relies on seeing every reply.
		reasons = append(reasons, "a UDP writer decorator (shed) must see every reply")
	}
	if cfg.Transport != transport.DNS {
		reasons = append(reasons, fmt.Sprintf("transport %s is not plain DNS over UDP and TCP", cfg.Transport))
	}
	return reasons
}

// serverStepAsideReasons says why wirecache must pass on the UDP queries of srv in every block it serves
// there; none means it need not. A UDP writer decorator that one block sets (shed) applies to every reply
// written through the server's UDP socket, but miekg/dns sends bytes written with Write, as a hit is, past
// it; stepAsideReasons covers the block that sets it, this the other blocks on its address.
func serverStepAsideReasons(srv *dnsserver.Server) []string {
	zones, err := serverZones(srv)
	if err != nil {
		return []string{err.Error()}
	}
	for _, cfgs := range zones {
		for _, cfg := range cfgs {
			if cfg.UDPDecorateWriterFunc != nil {
				return []string{"a block on the address has a UDP writer decorator (shed), which must see every reply"}
			}
		}
	}
	return nil
}

// clampPlugin is the plugin that keeps every TTL of its block inside a window; a hit must honour its minimum.
const clampPlugin = "clamp"

// blockTTLFloorer returns the block's clamp, which tells the least TTL of each answer wirecache stores, or nil
// when the block has no clamp.
func blockTTLFloorer(cfg *dnsserver.Config) (ttlFloorer, error) {
	h := cfg.Handler(clampPlugin)
	if h == nil {
		return nil, nil
	}
	floorer, ok := h.(ttlFloorer)
	if !ok {
		// Serving hits without the floor would break the window clamp promises; refusing to start says so.
		return nil, fmt.Errorf("the %s handler (%T) does not report its TTL floor, so hits could go below its window", clampPlugin, h)
	}
	return floorer, nil
}

// maxStaleWait bounds serve_stale's WAIT: a client gives up on a query after a few seconds, so a longer wait
// is a mistake.
const maxStaleWait = time.Minute

// maxTTL is the largest TTL RFC 2181 section 8 allows.
const maxTTL = math.MaxInt32

func parse(c *caddy.Controller) (*WireCache, error) {
	wc := New()

	i := 0
	for c.Next() {
		if i > 0 {
			return nil, plugin.ErrOnce
		}
		i++

		// wirecache [ZONES...]
		wc.Zones = plugin.OriginsFromArgsOrServerBlock(c.RemainingArgs(), c.ServerBlockKeys)

		seen := map[string]bool{}
		for c.NextBlock() {
			property := c.Val()
			if seen[property] {
				return nil, c.Errf("property '%s' given twice", property)
			}
			seen[property] = true
			args := c.RemainingArgs()
			switch property {
			case "capacity":
				if len(args) != 1 {
					return nil, c.ArgErr()
				}
				capacity, err := strconv.Atoi(args[0])
				if err != nil || capacity <= 0 {
					return nil, c.Errf("capacity must be a positive number of entries, got %q", args[0])
				}
				wc.Capacity = capacity
			case "max_memory":
				if len(args) != 1 {
					return nil, c.ArgErr()
				}
				n, err := bytesize.Parse(args[0])
				if err != nil {
					return nil, c.Errf("max_memory: %v", err)
				}
				if n < MinMaxMemory {
					return nil, c.Errf("max_memory %s is below %d bytes, the room one answer of the largest size stored takes", args[0], MinMaxMemory)
				}
				wc.MaxMemory = n
			case "ttl":
				if len(args) != 2 {
					return nil, c.ArgErr()
				}
				minTTL, err := parseSeconds(args[0])
				if err != nil {
					return nil, c.Errf("ttl MIN: %v", err)
				}
				maxTTL, err := parseSeconds(args[1])
				if err != nil {
					return nil, c.Errf("ttl MAX: %v", err)
				}
				if maxTTL == 0 {
					return nil, c.Err("ttl MAX must be at least 1 second")
				}
				if minTTL > maxTTL {
					return nil, c.Errf("ttl MIN (%s) is larger than MAX (%s)", args[0], args[1])
				}
				wc.MinTTL, wc.MaxTTL = minTTL, maxTTL
			case "refused", "servfail":
				if len(args) != 1 {
					return nil, c.ArgErr()
				}
				d, err := time.ParseDuration(args[0])
				if err != nil || d != 0 && (d < time.Second || d > MaxFailureFor) {
					return nil, c.Errf("%s: %q is not 0s (hold none) or a duration from 1s to %s", property, args[0], MaxFailureFor)
				}
				if property == "refused" {
					wc.RefusedFor = d
				} else {
					wc.ServfailFor = d
				}
			case "serve_stale":
				wc.PreferPositive = false
				if n := len(args); n > 0 && args[n-1] == "prefer_positive" {
					wc.PreferPositive, args = true, args[:n-1]
				}
				if len(args) > 3 {
					return nil, c.ArgErr()
				}
				wc.StaleFor, wc.StaleTTL = DefaultStaleFor, DefaultStaleTTL
				if len(args) > 0 {
					d, err := time.ParseDuration(args[0])
					if err != nil || d <= 0 {
						return nil, c.Errf("serve_stale DURATION: %q is not a positive duration", args[0])
					}
					wc.StaleFor = d
				}
				if len(args) > 1 {
					// A duration of whole seconds, as the cache plugin's serve_stale RESPONSE_TTL.
					d, err := time.ParseDuration(args[1])
					if err != nil || d < 0 || d%time.Second != 0 || d/time.Second > maxTTL {
						return nil, c.Errf("serve_stale TTL: %q is not a whole number of seconds from 0s to %ds", args[1], maxTTL)
					}
					wc.StaleTTL = uint32(d / time.Second)
				}
				if len(args) > 2 {
					d, err := time.ParseDuration(args[2])
					if err != nil || d < 0 || d > maxStaleWait {
						return nil, c.Errf("serve_stale WAIT: %q is not a duration from 0s to %s", args[2], maxStaleWait)
					}
					wc.StaleWait = d
				}
			case "repeats_only":
				if len(args) != 0 {
					return nil, c.ArgErr()
				}
				wc.RepeatsOnly = true
			case "fastpath":
				if len(args) != 1 || (args[0] != "on" && args[0] != "off") {
					return nil, c.Errf("fastpath takes on or off")
				}
				wc.FastPath = args[0] == "on"
			case "rcvbuf":
				if len(args) != 1 {
					return nil, c.ArgErr()
				}
				n, err := bytesize.Parse(args[0])
				if err != nil {
					return nil, c.Errf("rcvbuf: %v", err)
				}
				if n != 0 && (n < MinRecvBuffer || n > MaxRecvBuffer) {
					return nil, c.Errf("rcvbuf %s: want 0 (the kernel's default) or %d KiB to %d MiB", args[0], MinRecvBuffer>>10, MaxRecvBuffer>>20)
				}
				wc.RecvBuffer = n
			case "tcp_connections":
				if len(args) < 1 || len(args) > 2 {
					return nil, c.ArgErr()
				}
				total, err := strconv.Atoi(args[0])
				if err != nil || total < 1 {
					return nil, c.Errf("tcp_connections %s: want a number of connections, at least 1", args[0])
				}
				perClient := min(total, DefaultTCPConnectionsPerClient)
				if len(args) == 2 {
					if perClient, err = strconv.Atoi(args[1]); err != nil || perClient < 1 || perClient > total {
						return nil, c.Errf("tcp_connections %s %s: want a number of connections per client from 1 to %d", args[0], args[1], total)
					}
				}
				wc.TCPConnections, wc.TCPConnectionsPerClient = total, perClient
			default:
				return nil, c.Errf("unknown property '%s'", property)
			}
		}
	}
	wc.prepare()
	return wc, nil
}

// parseSeconds parses a TTL in seconds, as the cache plugin's windows take it.
func parseSeconds(s string) (time.Duration, error) {
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil || n > maxTTL {
		return 0, fmt.Errorf("%q is not a number of seconds from 0 to %d", s, maxTTL)
	}
	return time.Duration(n) * time.Second, nil
}

// zoneBypasser is a handler whose zones no cache may hold (cache.ZoneBypasser: dynupdate's zones, whose
// records change with every UPDATE): wirecache neither stores nor serves answers in them.
type zoneBypasser interface {
	CacheBypassZones() []string
}

// blockBypassZones returns the zones the block's handlers say no cache may hold.
func blockBypassZones(cfg *dnsserver.Config) []string {
	var zones []string
	for _, h := range cfg.Handlers() {
		if b, ok := h.(zoneBypasser); ok {
			zones = append(zones, b.CacheBypassZones()...)
		}
	}
	return zones
}
