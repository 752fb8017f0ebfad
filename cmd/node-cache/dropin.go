//go:build linux

package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/nodelocaldns/nodelocaldns/corefile"
	"github.com/nodelocaldns/nodelocaldns/plugin/notrack"
)

// startDropIn, in node-cache's drop-in mode (-localip given), writes the Corefile CoreDNS is about to load
// and keeps it in step with the ConfigMaps until the process ends. fs is the parsed command line and nc the
// node-cache flags on it; directives are the ones compiled in, and a Corefile using others is refused before
// CoreDNS sees it. Without -localip it does nothing and the binary is a plain CoreDNS.
// In the lean build, a Corefile that uses a plugin only the full build has execs the full build (full.go),
// in either mode.
func startDropIn(fs *flag.FlagSet, nc *nodeCacheFlags, directives []string) error {
	build := thisBuild()
	d, err := nc.dropIn(fs)
	if err != nil {
		return err
	}
	if d == nil {
		return build.runFullIfNeeded(plainCorefile(fs))
	}
	return runDropIn(context.Background(), d, directives, build, nc.metricsListenAddress, corefile.DefaultSyncPeriod)
}

// runDropIn writes the first Corefile, execs the full build if that Corefile needs it, then starts the watch
// and, when asked, node-cache's metrics listener. directives are this build's; build says which the full
// build adds, which the drop-in accepts too.
func runDropIn(ctx context.Context, d *corefile.DropIn, directives []string, build buildPair, metricsAddr string, period time.Duration) error {
	d.Directives = slices.Concat(directives, build.fullOnly)
	d.Rejected = func(error) { notrack.SetupErrors.WithLabelValues(notrack.ConfigMapError).Inc() }
	d.Restart = build.restartForFull
	if resolv, err := os.ReadFile(corefile.ResolvConf); err == nil {
		d.Check.ResolvConf = resolv // what `forward . /etc/resolv.conf` will read
	}
	if err := d.Sync(); err != nil && d.Written() == nil {
		return fmt.Errorf("writing %s from %s: %w", d.Output, d.Base, err)
	}
	if err := build.runFullIfNeeded(d.Written()); err != nil {
		return err
	}
	if d.Reload == nil && !slices.Contains(corefileDirectives(d.Written()), "reload") {
		log.Warningf("%s has no reload plugin and -reloadwithsignal is off: ConfigMap changes will "+
			"be written to it but not loaded until the next restart", d.Output)
	}
	go d.Watch(ctx, period)
	if metricsAddr != "" {
		if err := serveMetrics(ctx, metricsAddr, promhttp.Handler()); err != nil {
			return err
		}
	}
	return nil
}

// corefileDirectives lists the directives of a Corefile.
func corefileDirectives(c []byte) []string {
	f, err := corefile.Parse(c)
	if err != nil {
		return nil
	}
	var names []string
	for _, b := range f.Blocks {
		for _, d := range b.Directives {
			names = append(names, d.Name)
		}
	}
	return names
}
