//go:build linux

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nodelocaldns/nodelocaldns/corefile"
)

// Defaults of upstream node-cache's flags, where ours keep them.
const (
	defaultBaseCorefile = "/etc/coredns/Corefile.base"
	defaultCorefile     = "/etc/Corefile"
	defaultKubeDNSCM    = "/etc/kube-dns" // used when it exists and -kubednscm is not given, as node-cache does
	defaultUpstreamSvc  = "kube-dns"
	defaultHealthPort   = "8080"
	defaultSyncInterval = 60 * time.Second
	// servePreferPositive is -servestalepolicy's one policy, named as the cache plugin's.
	servePreferPositive = "prefer_positive"
)

// nodeCacheFlags are upstream node-cache's flags, with its meanings, so that its DaemonSet arguments work
// unchanged. They take effect in drop-in mode, which -localip turns on: the base Corefile is expanded into
// the Corefile CoreDNS runs (see corefile.Expand), and the networking flags become notrack and upstreamsvc
// directives there rather than code of their own.
type nodeCacheFlags struct {
	// uninstall is -daemonset and -kubeconfig, which the cache and the guard read (uninstall.go).
	uninstall               *uninstallFlags
	localIP                 string
	upstreamSvc             string
	baseCorefile            string
	corefile                string
	kubeDNSCM               string
	setupInterface          bool
	setupIptables           bool
	skipTeardown            bool
	handover                bool
	lockFile                string
	interfaceName           string
	syncInterval            syncInterval
	healthPort              string
	metricsListenAddress    string
	prometheusListenAddress string
	reloadWithSignal        bool
	serveStale              bool
	serveStalePolicy        string
	// clusterIPs looks up the -upstreamsvc Service's ClusterIPs for the hand-over; nil asks the API
	// (apiClusterIPs).
	clusterIPs clusterIPsFunc
}

// registerNodeCacheFlags defines the flags on fs. CoreDNS's own -conf, -dns.port and -pidfile are defined
// by coremain and read back from fs when the flags are applied.
func registerNodeCacheFlags(fs *flag.FlagSet) *nodeCacheFlags {
	f := &nodeCacheFlags{syncInterval: syncInterval(defaultSyncInterval), serveStale: true, uninstall: registerUninstallFlags(fs)}
	fs.StringVar(&f.localIP, "localip", "", "comma-separated IP addresses the cache listens on; turns on node-cache's drop-in mode")
	fs.StringVar(&f.upstreamSvc, "upstreamsvc", defaultUpstreamSvc, "Service (in kube-system) in front of the cluster DNS: `forward . __PILLAR__CLUSTER__DNS__` becomes upstreamsvc for it")
	fs.StringVar(&f.baseCorefile, "basecorefile", defaultBaseCorefile, "template Corefile (the node-local-dns ConfigMap)")
	fs.StringVar(&f.corefile, "corefile", defaultCorefile, "where to write the Corefile CoreDNS runs, unless -conf names it")
	fs.StringVar(&f.kubeDNSCM, "kubednscm", "", "directory of the kube-dns ConfigMap (stubDomains, upstreamNameservers); default "+defaultKubeDNSCM+" when it exists")
	fs.BoolVar(&f.setupInterface, "setupinterface", true, "put the local IPs on a node-local interface (notrack; false adds no_interface)")
	fs.BoolVar(&f.setupIptables, "setupiptables", true, "install the NOTRACK rules (notrack; false adds no_rules)")
	fs.BoolVar(&f.skipTeardown, "skipteardown", false, "keep the interface and rules at exit (notrack skip_teardown)")
	fs.BoolVar(&f.handover, "handover", true, "at exit, hand the node to the cluster DNS until the next start answers instead of removing the interface and rules (notrack handover): "+
		"the kube-dns ClusterIPs ($KUBE_DNS_SERVICE_HOST when one of -localip, and the other family's from the API) back to kube-proxy, the other IPs diverted to the -upstreamsvc ClusterIP of their family ($<SERVICE>_SERVICE_HOST, and the other family's from the API); "+
		"not an upstream flag; with -daemonset an uninstall removes everything instead, and -cleanup does otherwise")
	fs.StringVar(&f.lockFile, "lockfile", "", "node-lock file that keeps a second cache off the node (notrack lock); not an upstream flag; default /run/nodelocaldns.lock")
	fs.StringVar(&f.interfaceName, "interfacename", corefile.DefaultInterface, "name of the node-local interface (notrack interface)")
	fs.Var(&f.syncInterval, "syncinterval", `how often the rules and interface are checked (notrack sync), "60" or "60s"`)
	fs.StringVar(&f.healthPort, "health-port", defaultHealthPort, "port of the health plugin, exempted from connection tracking (notrack ports)")
	fs.StringVar(&f.metricsListenAddress, "metrics-listen-address", "", "HOST:PORT for node-cache's own /metrics; empty serves them only through the prometheus plugin")
	fs.StringVar(&f.prometheusListenAddress, "prometheus-listen-address", "", "HOST:PORT for "+corefile.PrometheusEndpointVar+"; default the first -localip, port 9253")
	fs.BoolVar(&f.serveStale, "servestale", true, "add serve_stale (1h, TTL 5s, 1s wait for the upstream) to every cache and wirecache of the Corefile that has none, "+
		"so names keep resolving through an outage of the cluster DNS; false adds none, and the Corefile's own serve_stale, if any, stays as written; not an upstream flag")
	fs.StringVar(&f.serveStalePolicy, "servestalepolicy", "", "prefer_positive: a name whose answer turns NXDOMAIN or empty keeps its last positive answer for the serve_stale window "+
		"(cache serve_stale_policy prefer_positive, wirecache serve_stale ... prefer_positive), which also keeps a deleted name resolving that long; not an upstream flag; default none")
	fs.BoolVar(&f.reloadWithSignal, "reloadwithsignal", false, "reload CoreDNS with SIGUSR1 to itself after writing a new Corefile, instead of leaving it to the reload plugin")
	return f
}

// syncInterval is -syncinterval. A bare number is seconds ("60"); a duration is itself ("60s", "1m").
// Upstream node-cache declares the flag as a duration but multiplies it by a second, so its users write
// "1ns" for one second; a duration under a millisecond keeps that meaning: its nanoseconds are seconds.
type syncInterval time.Duration

func (s *syncInterval) String() string { return time.Duration(*s).String() }

func (s *syncInterval) Set(v string) error {
	var d time.Duration
	if n, err := strconv.ParseUint(v, 10, 32); err == nil {
		d = time.Duration(n) * time.Second
	} else if d, err = time.ParseDuration(v); err != nil {
		return fmt.Errorf("want seconds (60) or a duration (60s): %w", err)
	}
	if d > 0 && d < time.Millisecond {
		d = time.Duration(d.Nanoseconds()) * time.Second
	}
	if d <= 0 {
		return fmt.Errorf("%q: the interval must be positive", v)
	}
	*s = syncInterval(d)
	return nil
}

// dropInOnly are the flags that mean nothing without -localip.
var dropInOnly = []string{"upstreamsvc", "basecorefile", "corefile", "kubednscm", "setupinterface", "setupiptables",
	"skipteardown", "handover", "interfacename", "syncinterval", "health-port", "metrics-listen-address",
	"prometheus-listen-address", "reloadwithsignal", "servestale"}

// dropIn turns the parsed flags into a corefile.DropIn, or returns nil when -localip is absent and the
// binary is a plain CoreDNS. It names the Corefile it writes in -conf, so that CoreDNS loads it.
func (f *nodeCacheFlags) dropIn(fs *flag.FlagSet) (*corefile.DropIn, error) {
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	if f.localIP == "" {
		var stray []string
		for _, name := range dropInOnly {
			if set[name] {
				stray = append(stray, "-"+name)
			}
		}
		if len(stray) > 0 {
			return nil, fmt.Errorf("%s only apply with -localip (node-cache's drop-in mode)", strings.Join(stray, ", "))
		}
		return nil, nil
	}

	var errs []error
	var localIPs []netip.Addr
	for s := range strings.SplitSeq(f.localIP, ",") {
		ip, err := netip.ParseAddr(strings.TrimSpace(s))
		if err != nil || ip.Zone() != "" || ip.IsUnspecified() {
			errs = append(errs, fmt.Errorf("-localip: %q is not a unicast IP address", s))
			continue
		}
		localIPs = append(localIPs, ip)
	}
	healthPort, err := parsePort(f.healthPort)
	if err != nil {
		errs = append(errs, fmt.Errorf("-health-port: %w", err))
	}
	dnsPort, err := parsePort(lookupFlag(fs, "dns.port", "53"))
	if err != nil {
		errs = append(errs, fmt.Errorf("-dns.port: %w", err))
	}
	for name, addr := range map[string]string{"metrics-listen-address": f.metricsListenAddress, "prometheus-listen-address": f.prometheusListenAddress} {
		if addr == "" {
			continue
		}
		if _, port, err := net.SplitHostPort(addr); err != nil {
			errs = append(errs, fmt.Errorf("-%s: %q is not HOST:PORT (IPv6 in brackets): %w", name, addr, err))
		} else if _, err := parsePort(port); err != nil {
			errs = append(errs, fmt.Errorf("-%s: %w", name, err))
		}
	}
	if f.serveStalePolicy != "" && f.serveStalePolicy != servePreferPositive {
		errs = append(errs, fmt.Errorf("-servestalepolicy: %q is not a policy; the one there is is %s", f.serveStalePolicy, servePreferPositive))
	}
	if f.serveStalePolicy != "" && !f.serveStale {
		errs = append(errs, fmt.Errorf("-servestalepolicy %s needs the serve_stale that -servestale=false leaves out", f.serveStalePolicy))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}

	prometheus := f.prometheusListenAddress
	if prometheus == "" {
		prometheus = netip.AddrPortFrom(localIPs[0], corefile.DefaultMetricsPort).String()
	}
	notrack := corefile.Notrack{
		Interface:    f.interfaceName,
		NoInterface:  !f.setupInterface,
		NoRules:      !f.setupIptables,
		SkipTeardown: f.skipTeardown,
		Lock:         f.lockFile,
	}
	if set["syncinterval"] {
		notrack.Sync = time.Duration(f.syncInterval)
	}
	if f.handover && f.setupIptables && !f.skipTeardown {
		if err := f.handoverAddresses(&notrack, localIPs, os.Getenv); err != nil {
			return nil, err
		}
	}

	kubeDNSDir := f.kubeDNSCM
	if kubeDNSDir == "" {
		if st, err := os.Stat(defaultKubeDNSCM); err == nil && st.IsDir() {
			kubeDNSDir = defaultKubeDNSCM
		}
	}
	output := lookupFlag(fs, "conf", "")
	if output == "" {
		output = f.corefile
		if err := fs.Set("conf", output); err != nil {
			return nil, fmt.Errorf("pointing -conf at %s: %w", output, err)
		}
	}
	d := &corefile.DropIn{
		Base:       f.baseCorefile,
		KubeDNSDir: kubeDNSDir,
		Output:     output,
		Expansion: corefile.Expansion{
			LocalIPs:           localIPs,
			Upstream:           &corefile.Upstream{Service: f.upstreamSvc},
			PrometheusEndpoint: prometheus,
			Notrack:            &notrack,
			NotrackPorts:       []uint16{healthPort},
			Port:               dnsPort,
		},
	}
	if f.serveStale {
		// Upstream's template has no serve_stale; without it, every name fails within 30 s of the
		// cluster DNS going away.
		d.Expansion.ServeStale = &corefile.ServeStale{PreferPositive: f.serveStalePolicy == servePreferPositive}
	}
	if f.reloadWithSignal {
		d.Reload = func() error { return syscall.Kill(os.Getpid(), syscall.SIGUSR1) }
	}
	return d, nil
}

// handoverAddresses turns the hand-over on and fills in its addresses from the variables Kubernetes gives
// every container of kube-system: the kube-dns ClusterIP, when it is one of the local IPs, and the
// ClusterIP of -upstreamsvc, where the other local IPs are diverted; on a dual-stack node the API gives
// the ClusterIPs of the other family, which no variable names (completeKubeDNS, completeUpstream).
func (f *nodeCacheFlags) handoverAddresses(n *corefile.Notrack, localIPs []netip.Addr, getenv func(string) string) error {
	n.Handover = true
	lookup := f.clusterIPs
	if lookup == nil {
		lookup = apiClusterIPs(f.uninstall.kubeconfig)
	}
	n.ServiceAddresses = completeKubeDNS(context.Background(), localIPs, kubeDNSAddresses(localIPs, getenv), lookup)
	from := serviceHostVar(f.upstreamSvc)
	if v := getenv(from); v != "" {
		ips, err := parseIPList(v)
		if err != nil {
			return fmt.Errorf("-handover: $%s: %w", from, err)
		}
		n.HandoverUpstream = ips
	}
	n.HandoverUpstream = completeUpstream(context.Background(), f.upstreamSvc, divertedAddrs(localIPs, n.ServiceAddresses), n.HandoverUpstream, lookup)
	return nil
}

func lookupFlag(fs *flag.FlagSet, name, def string) string {
	if fl := fs.Lookup(name); fl != nil {
		return fl.Value.String()
	}
	return def
}

func parsePort(s string) (uint16, error) {
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("%q is not a port in 1-65535", s)
	}
	return uint16(n), nil
}
