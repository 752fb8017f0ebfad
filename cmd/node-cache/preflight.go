package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/nodelocaldns/nodelocaldns/nodelocal"
)

// preflightFlags are the flags of the -preflight mode. It shares -localip and -interfacename with the
// drop-in mode, and -guard.backend with the guard.
type preflightFlags struct {
	enabled       bool
	resolvConf    string
	xtablesLock   string
	kubeletConfig string
}

func registerPreflightFlags(fs *flag.FlagSet) *preflightFlags {
	p := &preflightFlags{}
	fs.BoolVar(&p.enabled, "preflight", false, "check the node for the rollout (kube-proxy mode, addresses, backend, other caches, resolver loop, capabilities, xtables lock), print a report and exit non-zero on errors")
	fs.StringVar(&p.resolvConf, "preflight.resolvconf", nodelocal.DefaultResolvConf, "the resolv.conf the cache forwards to")
	fs.StringVar(&p.xtablesLock, "preflight.xtableslock", nodelocal.DefaultXtablesLock, "the xtables lock file as the cache's container sees it")
	fs.StringVar(&p.kubeletConfig, "preflight.kubeletconfig", nodelocal.DefaultKubeletConfig, "kubelet's configuration file, for clusterDNS in IPVS mode")
	return p
}

var preflightOpts = registerPreflightFlags(flag.CommandLine)

// errPreflightFailed is returned when a check found an error; the report says which.
var errPreflightFailed = errors.New("preflight found errors")

// runPreflight is the -preflight mode: it prints one line per finding to w.
func runPreflight(w io.Writer, nc *nodeCacheFlags, g *guardFlags, p *preflightFlags) error {
	if nc.localIP == "" {
		return errors.New("-preflight needs -localip: the cache's addresses")
	}
	addrs, err := parseIPList(nc.localIP)
	if err != nil {
		return fmt.Errorf("-localip: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fs := nodelocal.Preflight(ctx, nodelocal.PreflightConfig{
		Interface:     nc.interfaceName,
		Addresses:     addrs,
		Backend:       g.backend,
		ResolvConf:    p.resolvConf,
		XtablesLock:   p.xtablesLock,
		KubeletConfig: p.kubeletConfig,
	})
	for _, f := range fs {
		fmt.Fprintln(w, f)
	}
	if nodelocal.HasErrors(fs) {
		return errPreflightFailed
	}
	return nil
}

// runSideMode runs the -guard, -preflight, -verify or -cleanup mode when one is asked for and exits with its
// status. Without one it returns, and the binary goes on as the cache.
func runSideMode() {
	if ran, code := sideMode(); ran {
		os.Exit(code)
	}
}

func sideMode() (bool, int) {
	flag.Parse()
	switch {
	case btoi(guardOpts.enabled)+btoi(preflightOpts.enabled)+btoi(verifyOpts.enabled)+btoi(cleanupOpts.enabled) > 1:
		log.Errorf("-guard, -preflight, -verify and -cleanup exclude each other")
		return true, 2
	case cleanupOpts.enabled:
		if err := runCleanup(os.Stdout, nodeCache, guardOpts, cleanupOpts); err != nil {
			log.Errorf("-cleanup: %v", err)
			return true, 1
		}
		return true, 0
	case guardOpts.enabled:
		if err := runGuard(flag.CommandLine, nodeCache, guardOpts); err != nil {
			log.Errorf("-guard: %v", err)
			return true, 1
		}
		return true, 0
	case preflightOpts.enabled:
		if err := runPreflight(os.Stdout, nodeCache, guardOpts, preflightOpts); err != nil {
			log.Errorf("-preflight: %v", err)
			return true, 1
		}
		return true, 0
	case verifyOpts.enabled:
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := runVerify(ctx, os.Stdout, flag.CommandLine, nodeCache, guardOpts, verifyOpts); err != nil {
			log.Errorf("-verify: %v", err)
			if errors.Is(err, errUpstreamUnreachable) {
				return true, exitUpstreamUnreachable
			}
			return true, 1
		}
		return true, 0
	}
	return false, 0
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
