//go:build linux

package nodelocal

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/nodelocaldns/nodelocaldns/nodelocal/internal/link"
	"github.com/nodelocaldns/nodelocaldns/nodelocal/internal/nodelock"
	"github.com/nodelocaldns/nodelocaldns/nodelocal/internal/rules"
)

// DefaultInterface is the link's name unless configured otherwise.
const DefaultInterface = link.DefaultName

// DefaultDNSPort is the DNS port unless a Claim says otherwise.
const DefaultDNSPort = 53

// DefaultLockPath is the node lock file unless configured otherwise.
const DefaultLockPath = nodelock.DefaultPath

// Logger is where a Reconciler reports what it did. CoreDNS's plugin/pkg/log (clog.NewWithPlugin) fits.
type Logger interface {
	Infof(format string, args ...any)
	Warningf(format string, args ...any)
	Errorf(format string, args ...any)
}

// Config is what a Reconciler manages and how. It is fixed for the Reconciler's life; what changes at
// run time (addresses, ports, whether rules are wanted yet) comes through Claims.
type Config struct {
	// Interface names the link that holds the addresses; DefaultInterface when empty.
	Interface string
	// NoInterface leaves links and addresses to someone else.
	NoInterface bool
	// NoRules leaves iptables to someone else.
	NoRules bool
	// Backend is "auto" (or empty: use where kube-proxy's rules are), "legacy", "nft" (iptables flavours)
	// or "nftables" (tables of our own over netlink, for kube-proxy's nftables mode; no iptables needed).
	Backend string
	// BackendWait is how long auto waits for kube-proxy's rules to appear on a node that has none yet before
	// it falls back to what the node's other rules suggest; DefaultBackendWait when zero. Rules wait too.
	BackendWait time.Duration
	// LockPath is the node lock file; DefaultLockPath when empty.
	LockPath string
	// LockWait bounds each wait for the xtables lock; rules.DefaultLockWait when zero.
	LockWait time.Duration
	// Logger receives what the Reconciler did; nothing is logged when nil.
	Logger Logger
	// AddLink creates links; netlink.LinkAdd when nil. Tests use it to stand in for kernels with or
	// without the dummy link type.
	AddLink link.AddFunc
}

func (c Config) withDefaults() Config {
	if c.Interface == "" {
		c.Interface = DefaultInterface
	}
	if c.Backend == "" {
		c.Backend = string(rules.Auto)
	}
	if c.LockPath == "" {
		c.LockPath = DefaultLockPath
	}
	if c.LockWait == 0 {
		c.LockWait = rules.DefaultLockWait
	}
	if c.BackendWait == 0 {
		c.BackendWait = DefaultBackendWait
	}
	if c.Logger == nil {
		c.Logger = discard{}
	}
	return c
}

// DefaultBackendWait is how long backend auto waits for kube-proxy's rules on a node that has none.
const DefaultBackendWait = time.Minute

func (c Config) validate() error {
	if !c.NoInterface {
		if err := link.ValidName(c.Interface); err != nil {
			return err
		}
	}
	if _, err := rules.ParseMode(c.Backend); err != nil {
		return err
	}
	if c.LockWait < 0 {
		return fmt.Errorf("negative xtables lock wait %v", c.LockWait)
	}
	if c.BackendWait < 0 {
		return fmt.Errorf("negative backend wait %v", c.BackendWait)
	}
	return nil
}

// Claim is what one user of a shared Reconciler (one CoreDNS server block, say) needs. The Reconciler
// serves the union of its leases' claims.
type Claim struct {
	// Addresses are the local addresses to serve on, IPv4 and IPv6 alike. At least one.
	Addresses []netip.Addr
	// DNSPort is the DNS port (UDP and TCP); DefaultDNSPort when zero.
	DNSPort uint16
	// ExtraTCPPorts are further TCP ports on the same addresses, such as a health endpoint.
	ExtraTCPPorts []uint16
	// DeferRules holds the lease's rules back until Lease.EnableRules: the addresses come first so that a
	// server can bind them, the rules when it answers.
	DeferRules bool
}

func (c Claim) normalize() (Claim, error) {
	if len(c.Addresses) == 0 {
		return c, errors.New("a claim needs at least one address")
	}
	addrs := make([]netip.Addr, 0, len(c.Addresses))
	for _, a := range c.Addresses {
		if err := checkLocalAddress(a); err != nil {
			return c, err
		}
		addrs = append(addrs, a.Unmap())
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	c.Addresses = slices.Compact(addrs)
	if c.DNSPort == 0 {
		c.DNSPort = DefaultDNSPort
	}
	ports := slices.Clone(c.ExtraTCPPorts)
	if slices.Contains(ports, 0) {
		return c, errors.New("extra TCP port 0")
	}
	slices.Sort(ports)
	c.ExtraTCPPorts = slices.Compact(ports)
	return c, nil
}

// checkLocalAddress checks that a can be one of a cache's local addresses, as a Claim or a guard names them.
func checkLocalAddress(a netip.Addr) error {
	if !a.IsValid() || a.IsUnspecified() || a.IsMulticast() || a.Zone() != "" {
		return fmt.Errorf("address %q cannot be a local DNS address", a)
	}
	return nil
}

type discard struct{}

func (discard) Infof(string, ...any)    {}
func (discard) Warningf(string, ...any) {}
func (discard) Errorf(string, ...any)   {}
