package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/nodelocaldns/nodelocaldns/nodelocal"
)

// cleanupFlags are the flags of the -cleanup mode. It shares -interfacename and -lockfile with the
// drop-in mode, and -guard.backend with the guard.
type cleanupFlags struct {
	enabled bool
	timeout time.Duration
}

func registerCleanupFlags(fs *flag.FlagSet) *cleanupFlags {
	c := &cleanupFlags{}
	fs.BoolVar(&c.enabled, "cleanup", false, "remove everything a node cache and its guard left on the node (rules, divert, interface) and exit: for an uninstall "+
		"that did not (no -daemonset, or a cache killed before it was done), after the DaemonSet is gone; fails while a cache runs on the node")
	fs.DurationVar(&c.timeout, "cleanup.timeout", 30*time.Second, "bound of the -cleanup mode, the xtables lock wait included")
	return c
}

var cleanupOpts = registerCleanupFlags(flag.CommandLine)

// runCleanup is the -cleanup mode.
func runCleanup(w io.Writer, nc *nodeCacheFlags, g *guardFlags, c *cleanupFlags) error {
	if c.timeout <= 0 {
		return fmt.Errorf("-cleanup.timeout %v: must be positive", c.timeout)
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	if err := nodelocal.Cleanup(ctx, cleanupConfig(nc, g)); err != nil {
		return err
	}
	fmt.Fprintf(w, "node-cache -cleanup: removed the rules, the divert and %s from this node\n", nc.interfaceName)
	return nil
}

// cleanupConfig is the node as -cleanup, and the guard at the end of an uninstall, clean it up.
func cleanupConfig(nc *nodeCacheFlags, g *guardFlags) nodelocal.Config {
	return nodelocal.Config{Interface: nc.interfaceName, Backend: g.backend, LockPath: nc.lockFile, Logger: log}
}
