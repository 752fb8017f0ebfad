package clamp

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin"
	clog "github.com/coredns/coredns/plugin/pkg/log"
)

var log = clog.NewWithPlugin(pluginName)

func init() { plugin.Register(pluginName, setup) }

func setup(c *caddy.Controller) error {
	cl, err := parse(c)
	if err != nil {
		return plugin.Error(pluginName, err)
	}

	dnsserver.GetConfig(c).AddPlugin(func(next plugin.Handler) plugin.Handler {
		cl.Next = next
		return cl
	})

	return nil
}

// maxTTL is the largest TTL RFC 2181 section 8 allows.
const maxTTL = math.MaxInt32

func parse(c *caddy.Controller) (*Clamp, error) {
	cl := New()

	i := 0
	for c.Next() {
		if i > 0 {
			return nil, plugin.ErrOnce
		}
		i++

		// clamp [ZONES...]
		cl.Zones = plugin.OriginsFromArgsOrServerBlock(c.RemainingArgs(), c.ServerBlockKeys)

		seen := map[string]bool{}
		for c.NextBlock() {
			property := c.Val()
			var win *Window
			switch property {
			case "success":
				win = &cl.Success
			case "denial":
				win = &cl.Denial
			default:
				return nil, c.Errf("unknown property '%s'", property)
			}
			if seen[property] {
				return nil, c.Errf("property '%s' given more than once", property)
			}
			seen[property] = true

			args := c.RemainingArgs()
			if len(args) != 2 {
				return nil, c.ArgErr()
			}
			w, err := parseWindow(args[0], args[1])
			if err != nil {
				return nil, c.Errf("%s: %v", property, err)
			}
			*win = w
		}
	}
	log.Debugf("success window %d-%d, denial window %d-%d for %v",
		cl.Success.Min, cl.Success.Max, cl.Denial.Min, cl.Denial.Max, cl.Zones)

	return cl, nil
}

func parseWindow(minArg, maxArg string) (Window, error) {
	lo, err := parseTTL("MIN", minArg)
	if err != nil {
		return Window{}, err
	}
	hi, err := parseTTL("MAX", maxArg)
	if err != nil {
		return Window{}, err
	}
	if lo > hi {
		return Window{}, fmt.Errorf("MIN %d is greater than MAX %d", lo, hi)
	}
	return Window{Min: lo, Max: hi}, nil
}

func parseTTL(name, arg string) (uint32, error) {
	v, err := strconv.ParseInt(arg, 10, 64)
	if err != nil {
		if errors.Is(err, strconv.ErrRange) {
			if strings.HasPrefix(arg, "-") {
				return 0, fmt.Errorf("%s %s is negative", name, arg)
			}
			return 0, fmt.Errorf("%s %s is over %d, the largest TTL", name, arg, maxTTL)
		}
		return 0, fmt.Errorf("%s '%s' is not a number of seconds", name, arg)
	}
	if v < 0 {
		return 0, fmt.Errorf("%s %d is negative", name, v)
	}
	if v > maxTTL {
		return 0, fmt.Errorf("%s %d is over %d, the largest TTL", name, v, maxTTL)
	}
	return uint32(v), nil
}
