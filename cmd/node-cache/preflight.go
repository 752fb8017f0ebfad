//go:build linux

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/nodelocaldns/nodelocaldns/nodelocal/preflight"
)

// preflightFlags are the -preflight mode's own flags. The mode reads -localip and -interfacename of the
// cache's flags, and -guard.backend of the guard's.
type preflightFlags struct {
	resolvConf    string
	xtablesLock   string
	kubeletConfig string
	backend       string
}

func registerPreflightFlags(fs *flag.FlagSet) *preflightFlags {
	p := &preflightFlags{}
	fs.StringVar(&p.resolvConf, "preflight.resolvconf", preflight.DefaultResolvConf, "the resolv.conf the cache forwards to")
	fs.StringVar(&p.xtablesLock, "preflight.xtableslock", preflight.DefaultXtablesLock, "the xtables lock file as the cache's container sees it")
	fs.StringVar(&p.kubeletConfig, "preflight.kubeletconfig", preflight.DefaultKubeletConfig, "kubelet's configuration file, for clusterDNS in IPVS mode")
	registerBackendFlag(fs, &p.backend)
	return p
}

// preflightMode is the -preflight mode with its flag set.
type preflightMode struct {
	cache     *nodeCacheFlags
	preflight *preflightFlags
}

// newPreflightMode defines the -preflight mode's flags, the cache's and its own, on fs (see newModeFlagSet).
func newPreflightMode(fs *flag.FlagSet) *preflightMode {
	return &preflightMode{cache: registerNodeCacheFlags(fs), preflight: registerPreflightFlags(fs)}
}

// run runs the -preflight mode once its flag set is parsed and returns the exit status.
func (m *preflightMode) run() int {
	if err := runPreflight(os.Stdout, m.cache, m.preflight); err != nil {
		log.Errorf("-preflight: %v", err)
		return 1
	}
	return 0
}

// errPreflightFailed is returned when a check found an error; the report says which.
var errPreflightFailed = errors.New("preflight found errors")

// runPreflight is the -preflight mode: it prints one line per finding to w.
func runPreflight(w io.Writer, nc *nodeCacheFlags, p *preflightFlags) error {
	if nc.localIP == "" {
		return errors.New("-preflight needs -localip: the cache's addresses")
	}
	addrs, err := parseIPList(nc.localIP)
	if err != nil {
		return fmt.Errorf("-localip: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fs := preflight.Run(ctx, preflight.Config{
		Interface:     nc.interfaceName,
		Addresses:     addrs,
		Backend:       p.backend,
		ResolvConf:    p.resolvConf,
		XtablesLock:   p.xtablesLock,
		KubeletConfig: p.kubeletConfig,
	})
	for _, f := range fs {
		fmt.Fprintln(w, f)
	}
	if preflight.HasErrors(fs) {
		return errPreflightFailed
	}
	return nil
}
