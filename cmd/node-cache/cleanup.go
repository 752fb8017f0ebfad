//go:build linux

package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/nodelocaldns/nodelocaldns/nodelocal"
)

// cleanupFlags are the -cleanup mode's own flags. The mode reads -interfacename and -lockfile of the cache's
// flags, and -guard.backend of the guard's.
type cleanupFlags struct {
	timeout time.Duration
	backend string
}

func registerCleanupFlags(fs *flag.FlagSet) *cleanupFlags {
	c := &cleanupFlags{}
	fs.DurationVar(&c.timeout, "cleanup.timeout", 30*time.Second, "bound of the -cleanup mode, the xtables lock wait included")
	registerBackendFlag(fs, &c.backend)
	return c
}

// cleanupMode is the -cleanup mode with its flag set.
type cleanupMode struct {
	cache   *nodeCacheFlags
	cleanup *cleanupFlags
}

// newCleanupMode defines the -cleanup mode's flags, the cache's and its own, on fs (see newModeFlagSet).
func newCleanupMode(fs *flag.FlagSet) *cleanupMode {
	return &cleanupMode{cache: registerNodeCacheFlags(fs), cleanup: registerCleanupFlags(fs)}
}

// run runs the -cleanup mode once its flag set is parsed and returns the exit status.
func (m *cleanupMode) run() int {
	if err := runCleanup(os.Stdout, m.cache, m.cleanup); err != nil {
		log.Errorf("-cleanup: %v", err)
		return 1
	}
	return 0
}

// runCleanup is the -cleanup mode.
func runCleanup(w io.Writer, nc *nodeCacheFlags, c *cleanupFlags) error {
	if c.timeout <= 0 {
		return fmt.Errorf("-cleanup.timeout %v: must be positive", c.timeout)
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	if err := nodelocal.Cleanup(ctx, cleanupConfig(nc, c.backend)); err != nil {
		return err
	}
	fmt.Fprintf(w, "node-cache -cleanup: removed the rules, the divert and %s from this node\n", nc.interfaceName)
	return nil
}

// cleanupConfig is the node as -cleanup, and the guard at the end of an uninstall, clean it up.
func cleanupConfig(nc *nodeCacheFlags, backend string) nodelocal.Config {
	return nodelocal.Config{Interface: nc.interfaceName, Backend: backend, LockPath: nc.lockFile, Logger: log}
}
