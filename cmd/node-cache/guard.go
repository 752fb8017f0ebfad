//go:build linux

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/nodelocaldns/nodelocaldns/nodelocal"
)

// guardFlags are the -guard mode's own flags. The mode reads -localip, -interfacename, -upstreamsvc,
// -metrics-listen-address and CoreDNS's -dns.port of the cache's flags, so the guard container's arguments
// repeat the cache's.
type guardFlags struct {
	serviceIPs   string
	upstreamIPs  string
	backend      string
	lockPath     string
	interval     time.Duration
	idle         time.Duration
	timeout      time.Duration
	failAfter    int
	recoverAfter int
	probeName    string
	wait         bool
}

func registerGuardFlags(fs *flag.FlagSet) *guardFlags {
	g := &guardFlags{}
	fs.StringVar(&g.serviceIPs, "guard.serviceips", "", "those of -localip that are kube-proxy Service ClusterIPs, removed from the link when failing open; default $KUBE_DNS_SERVICE_HOST when it is one of them")
	fs.StringVar(&g.upstreamIPs, "guard.upstreamips", "", "ClusterIPs (one per family) of the -upstreamsvc Service, where the other local IPs are diverted when failing open; default its $<SERVICE>_SERVICE_HOST and, from the API, its ClusterIP of a family that names none")
	registerBackendFlag(fs, &g.backend)
	fs.StringVar(&g.lockPath, "guard.lockpath", nodelocal.DefaultGuardLockPath, "the guard's lock file (one guard per node)")
	fs.DurationVar(&g.interval, "guard.interval", nodelocal.DefaultGuardInterval, "time between probe rounds while the cache may be failing: from when its lock file (-lockfile) is closed, or a round fails, until it answers again")
	fs.DurationVar(&g.idle, "guard.idleinterval", nodelocal.DefaultGuardIdleInterval, "time between probe rounds while the cache answers and its lock file tells of nothing: the rounds that find a cache that hangs while alive")
	fs.DurationVar(&g.timeout, "guard.timeout", nodelocal.DefaultGuardProbeTimeout, "timeout of each probe")
	fs.IntVar(&g.failAfter, "guard.failafter", nodelocal.DefaultGuardFailAfter, "failed rounds in a row before failing open")
	fs.IntVar(&g.recoverAfter, "guard.recoverafter", nodelocal.DefaultGuardRecoverAfter, "answered rounds in a row, after the cache took the node back, before watching again")
	fs.StringVar(&g.probeName, "guard.probename", "", "name whose SOA the probes ask for, through the cache's plugins and, on a miss, its upstreams; empty sends an EDNS version 1 query the server answers itself (BADVERS); any answer counts")
	fs.BoolVar(&g.wait, "guard.wait", false, "while another guard runs on the node (the old Pod's, in a rolling update that surges), wait for it to exit instead of failing")
	return g
}

// registerBackendFlag defines -guard.backend on fs, into backend: the guard's flag, which -preflight,
// -verify and -cleanup read too.
func registerBackendFlag(fs *flag.FlagSet, backend *string) {
	fs.StringVar(backend, "guard.backend", "auto", "rules backend: auto, legacy, nft (iptables flavours) or nftables")
}

// guardMode is the -guard mode with its flag set.
type guardMode struct {
	fs    *flag.FlagSet
	cache *nodeCacheFlags
	guard *guardFlags
}

// newGuardMode defines the -guard mode's flags, the cache's and its own, on fs (see newModeFlagSet).
func newGuardMode(fs *flag.FlagSet) *guardMode {
	return &guardMode{fs: fs, cache: registerNodeCacheFlags(fs), guard: registerGuardFlags(fs)}
}

// run runs the -guard mode once its flag set is parsed and returns the exit status.
func (m *guardMode) run() int {
	if err := runGuard(m.fs, m.cache, m.guard); err != nil {
		log.Errorf("-guard: %v", err)
		return 1
	}
	return 0
}

// guardConfig builds the guard's configuration from the flags; getenv reads the Service variables
// Kubernetes gives every container.
func (g *guardFlags) guardConfig(fs *flag.FlagSet, nc *nodeCacheFlags, getenv func(string) string) (nodelocal.GuardConfig, error) {
	cfg := nodelocal.GuardConfig{
		Interface:     nc.interfaceName,
		Backend:       g.backend,
		LockPath:      g.lockPath,
		CacheLockPath: nc.lockFile,
		Interval:      g.interval,
		IdleInterval:  g.idle,
		ProbeTimeout:  g.timeout,
		FailAfter:     g.failAfter,
		RecoverAfter:  g.recoverAfter,
		ProbeName:     g.probeName,
	}
	var errs []error
	if g.interval <= 0 || g.idle <= 0 || g.timeout <= 0 || g.failAfter <= 0 || g.recoverAfter <= 0 {
		errs = append(errs, errors.New("-guard.interval, -guard.idleinterval, -guard.timeout, -guard.failafter and -guard.recoverafter must be positive"))
	}
	var err error
	if nc.localIP == "" {
		errs = append(errs, errors.New("-guard needs -localip: the cache's addresses"))
	} else if cfg.Addresses, err = parseIPList(nc.localIP); err != nil {
		errs = append(errs, fmt.Errorf("-localip: %w", err))
	}
	port, err := parsePort(lookupFlag(fs, "dns.port", "53"))
	if err != nil {
		errs = append(errs, fmt.Errorf("-dns.port: %w", err))
	}
	cfg.DNSPort = port

	if g.serviceIPs == "" {
		cfg.ServiceAddresses = kubeDNSAddresses(cfg.Addresses, getenv)
	} else if cfg.ServiceAddresses, err = parseIPList(g.serviceIPs); err != nil {
		errs = append(errs, fmt.Errorf("-guard.serviceips: %w", err))
	}
	upstream, from := g.upstreamIPs, "-guard.upstreamips"
	if upstream == "" {
		from = serviceHostVar(nc.upstreamSvc)
		upstream = getenv(from)
	}
	if upstream != "" {
		if cfg.Upstream, err = parseIPList(upstream); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", from, err))
		}
	}
	return cfg, errors.Join(errs...)
}

// serviceHostVar is the variable Kubernetes sets to a Service's ClusterIP: KUBE_DNS_UPSTREAM_SERVICE_HOST
// for kube-dns-upstream.
func serviceHostVar(service string) string {
	return strings.ToUpper(strings.ReplaceAll(service, "-", "_")) + "_SERVICE_HOST"
}

func parseIPList(s string) ([]netip.Addr, error) {
	var out []netip.Addr
	for f := range strings.SplitSeq(s, ",") {
		ip, err := netip.ParseAddr(strings.TrimSpace(f))
		if err != nil || ip.Zone() != "" || ip.IsUnspecified() {
			return nil, fmt.Errorf("%q is not a unicast IP address", f)
		}
		out = append(out, ip)
	}
	return out, nil
}

// Guard metrics, on a registry of their own: the guard process serves nothing of CoreDNS's.
func guardMetrics(g *nodelocal.Guard) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	factory := promauto.With(reg)
	factory.NewCounterFunc(prometheus.CounterOpts{
		Namespace: "coredns", Subsystem: "nodecache", Name: "guard_failovers_total",
		Help: "Times the guard failed the node-local DNS cache open.",
	}, func() float64 { return float64(g.Failovers()) })
	factory.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "coredns", Subsystem: "nodecache", Name: "guard_state",
		Help: "0 while the guard watches the cache, 1 while the node has failed open.",
	}, func() float64 { return float64(g.State()) })
	return reg
}

// runGuard is the -guard mode: it runs a nodelocal.Guard until SIGTERM or SIGINT.
func runGuard(fs *flag.FlagSet, nc *nodeCacheFlags, g *guardFlags) error {
	cfg, err := g.guardConfig(fs, nc, os.Getenv)
	if err != nil {
		return err
	}
	if g.upstreamIPs == "" { // the kubelet's variable names one family's ClusterIP at most
		cfg.Upstream = completeUpstream(context.Background(), nc.upstreamSvc, divertedAddrs(cfg.Addresses, cfg.ServiceAddresses), cfg.Upstream, apiClusterIPs(nc.uninstall.kubeconfig))
	}
	cfg.Logger = log
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	uninstall, err := startUninstallWatch(nc.uninstall, nil) // -daemonset (uninstall.go)
	if err != nil {
		return err
	}
	var guard *nodelocal.Guard
	if g.wait {
		guard, err = nodelocal.NewGuardWhenFree(ctx, cfg, time.Second)
		if ctx.Err() != nil {
			return nil // told to stop while waiting
		}
	} else {
		guard, err = nodelocal.NewGuard(cfg)
	}
	if err != nil {
		return err
	}
	defer guard.Close()
	if addr := nc.metricsListenAddress; addr != "" {
		if err := serveMetrics(ctx, addr, promhttp.HandlerFor(guardMetrics(guard), promhttp.HandlerOpts{})); err != nil {
			return err
		}
	}
	trimAfterStart() // trim.go
	// The guard leaves the node as it is when it stops: a failed-open node stays failed open until the
	// cache takes it back. In an uninstall no cache takes it back, so what is left goes.
	if err := guard.Run(ctx); err != nil {
		return err
	}
	if gone, why := uninstall.decision(); gone {
		return cleanUpAfterUninstall(cleanupConfig(nc, g.backend), why)
	}
	return nil
}
