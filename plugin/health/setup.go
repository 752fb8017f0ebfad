package health

import (
	"fmt"
	"net"
	"time"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/plugin"
	clog "github.com/coredns/coredns/plugin/pkg/log"
)

const pluginName = "health"

var log = clog.NewWithPlugin(pluginName)

func init() { plugin.Register(pluginName, setup) }

func setup(c *caddy.Controller) error {
	addr, lameduck, err := parse(c)
	if err != nil {
		return plugin.Error(pluginName, err)
	}
	h := New(addr, lameduck)
	c.OnStartup(h.OnStartup)
	c.OnRestart(h.OnRestart)
	c.OnFinalShutdown(h.OnFinalShutdown)
	c.OnRestartFailed(h.OnStartup)
	return nil
}

// parse reads `health [ADDRESS] { lameduck DURATION }`, CoreDNS's syntax.
func parse(c *caddy.Controller) (addr string, lameduck time.Duration, err error) {
	for c.Next() {
		args := c.RemainingArgs()
		switch len(args) {
		case 0:
		case 1:
			addr = args[0]
			if _, _, err := net.SplitHostPort(addr); err != nil {
				return "", 0, err
			}
		default:
			return "", 0, c.ArgErr()
		}
		for c.NextBlock() {
			switch c.Val() {
			case "lameduck":
				args := c.RemainingArgs()
				if len(args) != 1 {
					return "", 0, c.ArgErr()
				}
				d, err := time.ParseDuration(args[0])
				if err != nil {
					return "", 0, fmt.Errorf("unable to parse lameduck duration value: '%v' : %v", args[0], err)
				}
				lameduck = d
			default:
				return "", 0, c.Errf("unknown property '%s'", c.Val())
			}
		}
	}
	return addr, lameduck, nil
}
