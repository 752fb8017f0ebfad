//go:build !linux

package notrack

import (
	"fmt"
	"runtime"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/plugin"

	"github.com/nodelocaldns/nodelocaldns/nodelocal"
)

const pluginName = "notrack"

// On systems other than Linux notrack has no link to put addresses on and no rules to install, but it
// registers all the same, so that a CoreDNS built there with this repository's plugin.cfg compiles; a
// Corefile that uses it fails to load, saying why.
func init() { plugin.Register(pluginName, setup) }

func setup(*caddy.Controller) error {
	return plugin.Error(pluginName, fmt.Errorf("notrack needs Linux, and this CoreDNS is built for %s: %w", runtime.GOOS, nodelocal.ErrNotLinux))
}
