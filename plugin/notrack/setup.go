//go:build linux

package notrack

import (
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin"
	clog "github.com/coredns/coredns/plugin/pkg/log"
	"github.com/coredns/coredns/plugin/pkg/transport"

	"github.com/nodelocaldns/nodelocaldns/nodelocal"
)

const pluginName = "notrack"

var log = clog.NewWithPlugin(pluginName)

// Defaults of the node-wide properties.
const (
	defaultSync    = time.Minute
	defaultBackend = "auto"
	minSync        = time.Second
)

func init() { plugin.Register(pluginName, setup) }

func setup(c *caddy.Controller) error {
	o, err := parse(c)
	if err != nil {
		return plugin.Error(pluginName, err)
	}
	b, err := newBlock(dnsserver.GetConfig(c), o)
	if err != nil {
		return plugin.Error(pluginName, err)
	}
	in := instanceOf(c)
	if err := in.add(b, o.node); err != nil {
		return plugin.Error(pluginName, err)
	}
	dnsserver.GetConfig(c).AddPlugin(func(next plugin.Handler) plugin.Handler {
		b.handler.Next = next
		return b.handler
	})
	return nil
}

// options is what one notrack directive says.
type options struct {
	// addrs are the ADDRESS arguments; empty means bind's addresses.
	addrs []netip.Addr
	// ports are the extra TCP ports.
	ports []uint16
	node  nodeOptions
}

// setting is a node-wide property as one block gives it, or does not.
type setting[T comparable] struct {
	val T
	set bool
	// where names the line, for conflicts between blocks.
	where string
}

func (s *setting[T]) merge(name string, other setting[T]) error {
	switch {
	case !other.set:
		return nil
	case !s.set:
		*s = other
		return nil
	case s.val != other.val:
		return fmt.Errorf("%s is %v at %s but %v at %s: it applies to the whole process, so every block that gives it must agree",
			name, s.val, s.where, other.val, other.where)
	}
	return nil
}

// nodeOptions are the properties that apply to the node rather than to one server block. Any block may
// give them; blocks that give one must agree.
type nodeOptions struct {
	iface        setting[string]
	sync         setting[time.Duration]
	backend      setting[string]
	lock         setting[string]
	noInterface  setting[bool]
	noRules      setting[bool]
	skipTeardown setting[bool]
	// handover holds the upstream addresses, space separated; set when the property is given.
	handover setting[string]
	service  setting[string]
}

func (o *nodeOptions) merge(other nodeOptions) error {
	for _, err := range []error{
		o.iface.merge("interface", other.iface),
		o.sync.merge("sync", other.sync),
		o.backend.merge("backend", other.backend),
		o.lock.merge("lock", other.lock),
		o.noInterface.merge("no_interface", other.noInterface),
		o.noRules.merge("no_rules", other.noRules),
		o.skipTeardown.merge("skip_teardown", other.skipTeardown),
		o.handover.merge("handover", other.handover),
		o.service.merge("service", other.service),
	} {
		if err != nil {
			return err
		}
	}
	return nil
}

// settings resolves the options into what the process runs with, defaults filled in.
func (o nodeOptions) settings() nodeSettings {
	s := nodeSettings{
		Interface:        nodelocal.DefaultInterface,
		Sync:             defaultSync,
		Backend:          defaultBackend,
		Lock:             nodelocal.DefaultLockPath,
		NoInterface:      o.noInterface.val,
		NoRules:          o.noRules.val,
		SkipTeardown:     o.skipTeardown.val,
		Handover:         o.handover.set,
		HandoverUpstream: o.handover.val,
		ServiceAddresses: o.service.val,
	}
	if o.iface.set {
		s.Interface = o.iface.val
	}
	if o.sync.set {
		s.Sync = o.sync.val
	}
	if o.backend.set {
		s.Backend = o.backend.val
	}
	if o.lock.set {
		s.Lock = o.lock.val
	}
	return s
}

// nodeSettings are the node-wide settings of one Corefile.
type nodeSettings struct {
	Interface    string
	Sync         time.Duration
	Backend      string
	Lock         string
	NoInterface  bool
	NoRules      bool
	SkipTeardown bool
	// Handover hands the node to the cluster DNS at exit instead of tearing it down: the addresses that are
	// not ServiceAddresses are diverted to the kube-dns-upstream Service at HandoverUpstream (space-separated
	// addresses, one per family); ServiceAddresses are the kube-dns ClusterIPs among the addresses.
	Handover         bool
	HandoverUpstream string
	ServiceAddresses string
}

// managesNothing is true when the link and the rules are both left to others.
func (s nodeSettings) managesNothing() bool { return s.NoInterface && s.NoRules }

// restartNeeded says why a running process cannot switch from s to next by a reload: the link, the lock
// and the iptables backend belong to a Reconciler for its whole life. Sync and skip_teardown can change.
func (s nodeSettings) restartNeeded(next nodeSettings) error {
	var diffs []string
	diff := func(name string, a, b any) {
		if a != b {
			diffs = append(diffs, fmt.Sprintf("%s %v -> %v", name, a, b))
		}
	}
	diff("interface", s.Interface, next.Interface)
	diff("backend", s.Backend, next.Backend)
	diff("lock", s.Lock, next.Lock)
	diff("no_interface", s.NoInterface, next.NoInterface)
	diff("no_rules", s.NoRules, next.NoRules)
	if len(diffs) == 0 {
		return nil
	}
	return fmt.Errorf("cannot change %s by a reload: the running link and rules were set up with the old values; restart CoreDNS to apply them",
		strings.Join(diffs, ", "))
}

func (s nodeSettings) reconcilerConfig() nodelocal.Config {
	return nodelocal.Config{
		Interface:   s.Interface,
		NoInterface: s.NoInterface,
		NoRules:     s.NoRules,
		Backend:     s.Backend,
		LockPath:    s.Lock,
		Logger:      log,
	}
}

func parse(c *caddy.Controller) (options, error) {
	var o options
	for i := 0; c.Next(); i++ {
		if i > 0 {
			return o, plugin.ErrOnce
		}
		for _, arg := range c.RemainingArgs() {
			a, err := parseAddress(arg)
			if err != nil {
				return o, err
			}
			o.addrs = append(o.addrs, a)
		}
		seen := map[string]bool{}
		for c.NextBlock() {
			property := c.Val()
			where := fmt.Sprintf("%s:%d", c.File(), c.Line())
			if seen[property] && property != "ports" {
				return o, c.Errf("property '%s' given more than once", property)
			}
			seen[property] = true
			args := c.RemainingArgs()
			switch property {
			case "interface":
				if len(args) != 1 {
					return o, c.ArgErr()
				}
				if err := nodelocal.ValidInterfaceName(args[0]); err != nil {
					return o, c.Errf("interface: %v", err)
				}
				o.node.iface = setting[string]{args[0], true, where}
			case "ports":
				if len(args) == 0 {
					return o, c.ArgErr()
				}
				for _, a := range args {
					p, err := strconv.ParseUint(a, 10, 16)
					if err != nil || p == 0 {
						return o, c.Errf("ports: %q is not a port (1-65535)", a)
					}
					o.ports = append(o.ports, uint16(p))
				}
			case "sync":
				if len(args) != 1 {
					return o, c.ArgErr()
				}
				d, err := time.ParseDuration(args[0])
				if err != nil {
					return o, c.Errf("sync: %v", err)
				}
				if d < minSync {
					return o, c.Errf("sync %s: must be at least %s", d, minSync)
				}
				o.node.sync = setting[time.Duration]{d, true, where}
			case "backend":
				if len(args) != 1 {
					return o, c.ArgErr()
				}
				mode, err := nodelocal.ParseBackend(args[0])
				if err != nil {
					return o, c.Errf("backend: %v", err)
				}
				o.node.backend = setting[string]{mode, true, where}
			case "lock":
				if len(args) != 1 {
					return o, c.ArgErr()
				}
				path := args[0]
				if root := dnsserver.GetConfig(c).Root; root != "" && !filepath.IsAbs(path) {
					path = filepath.Join(root, path)
				}
				o.node.lock = setting[string]{filepath.Clean(path), true, where}
			case "handover", "service":
				if property == "service" && len(args) == 0 {
					return o, c.ArgErr()
				}
				var addrs []string
				for _, arg := range args {
					a, err := parseAddress(arg)
					if err != nil {
						return o, c.Errf("%s: %v", property, err)
					}
					addrs = append(addrs, a.String())
				}
				slices.Sort(addrs)
				v := setting[string]{strings.Join(slices.Compact(addrs), " "), true, where}
				if property == "handover" {
					o.node.handover = v
				} else {
					o.node.service = v
				}
			case "no_interface", "no_rules", "skip_teardown":
				if len(args) != 0 {
					return o, c.ArgErr()
				}
				flag := setting[bool]{true, true, where}
				switch property {
				case "no_interface":
					o.node.noInterface = flag
				case "no_rules":
					o.node.noRules = flag
				default:
					o.node.skipTeardown = flag
				}
			default:
				return o, c.Errf("unknown property '%s'", property)
			}
		}
	}
	slices.Sort(o.ports)
	o.ports = slices.Compact(o.ports)
	return o, nil
}

func parseAddress(s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%q is not an IP address", s)
	}
	a = a.Unmap()
	if !a.IsValid() || a.IsUnspecified() || a.IsMulticast() || a.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("%s cannot be a local DNS address", a)
	}
	return a, nil
}

// newBlock works out what a server block claims: its addresses (the arguments, or bind's), its DNS port
// and the extra ports, and where it listens, so that the start can check those are free.
func newBlock(cfg *dnsserver.Config, o options) (*block, error) {
	if cfg.Transport != "" && cfg.Transport != transport.DNS {
		return nil, fmt.Errorf("notrack serves plain DNS (UDP and TCP) server blocks, not %s://", cfg.Transport)
	}
	portStr := cfg.Port
	if portStr == "" {
		portStr = dnsserver.Port
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil || port == 0 {
		return nil, fmt.Errorf("server block port %q is not a port number", portStr)
	}
	wildcard := false
	var bound []netip.Addr
	for _, h := range cfg.ListenHosts {
		if h == "" {
			wildcard = true
			continue
		}
		a, err := netip.ParseAddr(h)
		if err != nil {
			return nil, fmt.Errorf("listen address %q is not an IP address", h)
		}
		if a.IsUnspecified() {
			wildcard = true
			continue
		}
		bound = append(bound, a.Unmap())
	}
	addrs := o.addrs
	switch {
	case len(addrs) == 0 && wildcard:
		return nil, fmt.Errorf("the server block listens on every address (no bind, or bind to 0.0.0.0 or ::): name the node-local addresses, as `notrack ADDRESS...` or with bind")
	case len(addrs) == 0 && len(bound) == 0:
		return nil, fmt.Errorf("the server block listens on no address (bind to an interface that has none?): name the node-local addresses as `notrack ADDRESS...`")
	case len(addrs) == 0:
		addrs = bound
	case !wildcard:
		for _, a := range addrs {
			if !slices.Contains(bound, a) {
				return nil, fmt.Errorf("%s is not an address this server block listens on (bind %v)", a, cfg.ListenHosts)
			}
		}
	}
	addrs = slices.Clone(addrs)
	slices.SortFunc(addrs, netip.Addr.Compare)
	addrs = slices.Compact(addrs)

	b := &block{
		zone:  cfg.Zone,
		port:  uint16(port),
		extra: o.ports,
		addrs: addrs,
	}
	if b.zone == "" {
		b.zone = "."
	}
	for _, h := range cfg.ListenHosts {
		b.listen = append(b.listen, net.JoinHostPort(h, portStr))
	}
	b.handler = &Notrack{block: b}
	return b, nil
}
