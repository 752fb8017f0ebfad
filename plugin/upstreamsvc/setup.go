package upstreamsvc

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin"
	"github.com/coredns/coredns/plugin/dnstap"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/nodelocaldns/nodelocaldns/internal/kubeclient"
)

func init() { plugin.Register(pluginName, setup) }

func setup(c *caddy.Controller) error {
	cfg, err := parse(c)
	if err != nil {
		return plugin.Error(pluginName, err)
	}
	watch, apiReason, err := sharedWatch(c, cfg)
	if err != nil {
		return plugin.Error(pluginName, err)
	}
	initial, err := resolveInitial(&cfg, watch, apiReason, os.LookupEnv)
	if err != nil {
		return plugin.Error(pluginName, err)
	}
	own := listenersOf(dnsserver.GetConfig(c))
	if err := own.refuse(initial, cfg.origin(initial)); err != nil {
		return plugin.Error(pluginName, err)
	}

	u := New(cfg)
	u.initial = initial
	u.own = own
	u.watch = watch
	u.pool = sharedProxyPool(c)
	u.zones = strings.Join(plugin.OriginsFromArgsOrServerBlock(nil, c.ServerBlockKeys), ",")

	dnsserver.GetConfig(c).AddPlugin(func(next plugin.Handler) plugin.Handler {
		u.Next = next
		return u
	})
	c.OnStartup(func() error {
		if taph := dnsserver.GetConfig(c).Handler("dnstap"); taph != nil {
			u.tap = taph.(*dnstap.Dnstap)
		}
		return u.OnStartup()
	})
	c.OnShutdown(u.OnShutdown)
	return nil
}

// resolveInitial picks the address to start with: the API's answer, else the environment, else the
// fallback. A Service the API reports but that cannot be forwarded to is an error, not a reason to
// guess. When the API did not answer, the watch keeps trying and switches once it does.
func resolveInitial(cfg *Config, watch *serviceWatch, apiReason string, lookupEnv func(string) (string, bool)) (upstreamSet, error) {
	if watch != nil {
		v, known, err := watch.snapshot()
		switch {
		case known && v.exists && v.problem == nil:
			return cfg.apiSet(v), nil
		case known && v.exists:
			return upstreamSet{}, v.problem
		case known:
			apiReason = fmt.Sprintf("the Kubernetes API has no Service %s", watch)
		default:
			apiReason = apiFailure(watch, err)
		}
	}
	set, found, err := cfg.envSet(lookupEnv)
	if err == nil && !found && len(cfg.Fallback) > 0 {
		set, found = cfg.fallbackSet(), true
	}
	switch {
	case err != nil:
		return upstreamSet{}, err
	case !found:
		return upstreamSet{}, cfg.unresolvableError(apiReason)
	}
	if watch != nil {
		log.Warningf("%s; using %s from %s until the API has it", apiReason, strings.Join(set.addrs, ","), set.source)
	}
	return set, nil
}

// apiFailure says why the API gave no answer during setup. A refusal (401, 403) is told apart from
// silence: its fix is the plugin's credentials or Role, not the network.
func apiFailure(w *serviceWatch, err error) string {
	if apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) {
		return fmt.Sprintf("the Kubernetes API refused to list Service %s (the plugin's credentials need list and watch on it): %v", w, err)
	}
	return fmt.Sprintf("the Kubernetes API did not answer: %v", err)
}

// watchKey identifies a shared serviceWatch in the caddy instance's storage.
type watchKey struct{ kubeconfig, namespace, service string }

// sharedWatch returns the instance's watch for the Service, creating (and priming) it on first use.
// Without API access it returns nil and the reason. The instance storage lives for one Corefile
// load, so a reload builds new watches and the old instance's OnShutdown stops the old ones.
func sharedWatch(c *caddy.Controller, cfg Config) (*serviceWatch, string, error) {
	key := watchKey{cfg.Kubeconfig, cfg.Namespace, cfg.Service}
	if w, ok := c.Get(key).(*serviceWatch); ok {
		return w, "", nil
	}
	rc, reason, err := kubeclient.Config(cfg.Kubeconfig, userAgent)
	if err != nil || rc == nil {
		return nil, reason, err
	}
	client, err := newServiceClient(rc)
	if err != nil {
		return nil, "", err
	}
	w := newServiceWatch(client, cfg.Namespace, cfg.Service)
	ctx, cancel := context.WithTimeout(context.Background(), apiStartupTimeout)
	w.prime(ctx)
	cancel()
	c.Set(key, w)
	c.OnStartup(w.start)
	c.OnShutdown(w.stop)
	return w, "", nil
}

func parse(c *caddy.Controller) (Config, error) {
	cfg := Config{
		Service:     defaultService,
		Namespace:   defaultNamespace,
		Expire:      defaultExpire,
		HealthCheck: defaultHealthCheck,
		MaxAttempts: defaultMaxAttempts,
	}
	var (
		fallback  []string
		transport string
	)
	for i := 0; c.Next(); i++ {
		if i > 0 {
			return cfg, plugin.ErrOnce
		}
		args := c.RemainingArgs()
		switch len(args) {
		case 2:
			cfg.Namespace = args[1]
			fallthrough
		case 1:
			cfg.Service = args[0]
		case 0:
		default:
			return cfg, c.ArgErr()
		}
		if errs := validation.IsDNS1035Label(cfg.Service); len(errs) > 0 {
			return cfg, fmt.Errorf("invalid Service name %q: %s", cfg.Service, strings.Join(errs, "; "))
		}
		if errs := validation.IsDNS1123Label(cfg.Namespace); len(errs) > 0 {
			return cfg, fmt.Errorf("invalid namespace %q: %s", cfg.Namespace, strings.Join(errs, "; "))
		}

		for c.NextBlock() {
			switch c.Val() {
			case "port":
				if !c.NextArg() {
					return cfg, c.ArgErr()
				}
				n, err := strconv.ParseInt(c.Val(), 10, 32)
				if err != nil || !validPort(n) {
					return cfg, fmt.Errorf("port %q: want 1-65535", c.Val())
				}
				cfg.Port = uint16(n)
				if c.NextArg() {
					return cfg, c.ArgErr()
				}
			case "force_tcp", "prefer_udp":
				if c.NextArg() {
					return cfg, c.ArgErr()
				}
				if transport != "" && transport != c.Val() {
					return cfg, fmt.Errorf("force_tcp and prefer_udp are mutually exclusive")
				}
				transport = c.Val()
				cfg.PreferUDP = transport == "prefer_udp"
			case "kubeconfig":
				args := c.RemainingArgs()
				if len(args) != 1 {
					return cfg, c.ArgErr()
				}
				cfg.Kubeconfig = args[0]
				if root := dnsserver.GetConfig(c).Root; root != "" && !filepath.IsAbs(cfg.Kubeconfig) {
					cfg.Kubeconfig = filepath.Join(root, cfg.Kubeconfig)
				}
			case "fallback":
				args := c.RemainingArgs()
				if len(args) == 0 {
					return cfg, c.ArgErr()
				}
				fallback = append(fallback, args...)
			case "max_concurrent":
				if !c.NextArg() {
					return cfg, c.ArgErr()
				}
				n, err := strconv.ParseInt(c.Val(), 10, 64)
				if err != nil || n <= 0 {
					return cfg, fmt.Errorf("max_concurrent %q: want a positive integer", c.Val())
				}
				cfg.MaxConcurrent = n
				if c.NextArg() {
					return cfg, c.ArgErr()
				}
			case "max_attempts":
				if !c.NextArg() {
					return cfg, c.ArgErr()
				}
				n, err := strconv.ParseInt(c.Val(), 10, 32)
				if err != nil || n <= 0 {
					return cfg, fmt.Errorf("max_attempts %q: want a positive integer, the most times one query is sent upstream (no unbounded retries)", c.Val())
				}
				cfg.MaxAttempts = int(n)
				if c.NextArg() {
					return cfg, c.ArgErr()
				}
			case "expire":
				d, err := durationArg(c, minExpire)
				if err != nil {
					return cfg, err
				}
				cfg.Expire = d
			case "health_check":
				d, err := durationArg(c, time.Millisecond)
				if err != nil {
					return cfg, err
				}
				cfg.HealthCheck = d
			default:
				return cfg, c.Errf("unknown property '%s'", c.Val())
			}
		}
	}

	port := cfg.Port
	if port == 0 {
		port = defaultPort
	}
	for _, s := range fallback {
		ap, err := parseFallback(s, port)
		if err != nil {
			return cfg, err
		}
		cfg.Fallback = append(cfg.Fallback, ap)
	}
	return cfg, nil
}

// durationArg reads the one duration argument of the current property; it must be at least minimum.
func durationArg(c *caddy.Controller, minimum time.Duration) (time.Duration, error) {
	property := c.Val()
	if !c.NextArg() {
		return 0, c.ArgErr()
	}
	d, err := time.ParseDuration(c.Val())
	if err != nil {
		return 0, fmt.Errorf("%s: %w", property, err)
	}
	if d < minimum {
		return 0, fmt.Errorf("%s %s: must be at least %s", property, d, minimum)
	}
	if c.NextArg() {
		return 0, c.ArgErr()
	}
	return d, nil
}
