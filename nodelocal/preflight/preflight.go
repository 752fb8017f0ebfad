//go:build linux

package preflight

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/yaml"

	"github.com/nodelocaldns/nodelocaldns/nodelocal"
	"github.com/nodelocaldns/nodelocaldns/nodelocal/internal/link"
	"github.com/nodelocaldns/nodelocaldns/nodelocal/internal/rules"
)

// Severity grades a preflight Finding.
type Severity string

// The severities. An error means the cache would not work, or would break the node's DNS.
const (
	SeverityOK      Severity = "ok"
	SeverityWarning Severity = "warning"
	SeverityError   Severity = "error"
)

// Finding is what one preflight check found.
type Finding struct {
	// Check names the check, e.g. "kube-proxy mode".
	Check    string
	Severity Severity
	Message  string
	// Fix says what to do about a warning or an error.
	Fix string
}

func (f Finding) String() string {
	s := fmt.Sprintf("[%s] %s: %s", f.Severity, f.Check, f.Message)
	if f.Fix != "" {
		s += " (fix: " + f.Fix + ")"
	}
	return s
}

// HasErrors reports whether any finding is an error.
func HasErrors(fs []Finding) bool {
	return slices.ContainsFunc(fs, func(f Finding) bool { return f.Severity == SeverityError })
}

// Defaults of Config's paths.
const (
	DefaultResolvConf    = "/etc/resolv.conf"
	DefaultXtablesLock   = "/run/xtables.lock"
	DefaultProcStatus    = "/proc/self/status"
	DefaultKubeletConfig = "/var/lib/kubelet/config.yaml"
	// IPVSInterface is the link kube-proxy's IPVS mode puts every ClusterIP on.
	IPVSInterface = "kube-ipvs0"
)

// Config says what the cache is about to do on the node, and where to read the node's state.
// The paths are there so that the checks can be run against synthetic state.
type Config struct {
	// Interface is the cache's link; nodelocal.DefaultInterface when empty.
	Interface string
	// Addresses are the cache's local addresses (the link-local one, and the kube-dns ClusterIP in
	// iptables mode).
	Addresses []netip.Addr
	// Backend is the cache's configured rules backend: auto (or empty), legacy, nft or nftables.
	Backend string
	// ResolvConf is the resolv.conf the cache forwards to; DefaultResolvConf when empty.
	ResolvConf string
	// XtablesLock is the xtables lock file as the cache's container sees it; DefaultXtablesLock when empty.
	XtablesLock string
	// ProcStatus is read for the effective capabilities; DefaultProcStatus when empty.
	ProcStatus string
	// KubeletConfig is kubelet's configuration file, read for clusterDNS in IPVS mode;
	// DefaultKubeletConfig when empty. An unreadable file is a warning.
	KubeletConfig string
}

func (c Config) withDefaults() Config {
	if c.Interface == "" {
		c.Interface = nodelocal.DefaultInterface
	}
	if c.Backend == "" {
		c.Backend = string(rules.Auto)
	}
	if c.ResolvConf == "" {
		c.ResolvConf = DefaultResolvConf
	}
	if c.XtablesLock == "" {
		c.XtablesLock = DefaultXtablesLock
	}
	if c.ProcStatus == "" {
		c.ProcStatus = DefaultProcStatus
	}
	if c.KubeletConfig == "" {
		c.KubeletConfig = DefaultKubeletConfig
	}
	return c
}

// Run runs the rollout checklist against the node it runs on, read-only: kube-proxy's mode and what
// it means for the addresses, the local addresses already in use, the iptables backend, a node cache
// already present, rules of others ahead of the cache's jumps, a resolver loop, the capabilities and the
// xtables lock. Each check adds one or more findings; none changes anything.
func Run(ctx context.Context, cfg Config) []Finding {
	cfg = cfg.withDefaults()
	st := readNodeState(ctx, cfg)
	return slices.Concat(
		checkKubeProxyMode(cfg, st),
		checkAddressesInUse(cfg, st),
		checkBackend(cfg, st),
		checkForeignCache(cfg, st),
		checkRulesAhead(cfg, st),
		checkResolvConf(cfg),
		checkCapabilities(cfg),
		checkXtablesLock(cfg, st),
	)
}

// nodeState is what the checks read from the node, read once.
type nodeState struct {
	links     map[string]linkInfo
	linksErr  error
	routes    []routeInfo
	routesErr error
	// saves holds each installed backend's iptables-save output (IPv4 and IPv6 together), familySaves the
	// same per family.
	saves       map[rules.Mode][]byte
	familySaves map[rules.Mode]map[rules.Family][]byte
	// kubeProxyNFT lists kube-proxy's nftables-mode tables ("ip kube-proxy"), read over netlink so that
	// a node image without the nft command sees them too; kubeProxyNFTErr says why they could not be read.
	kubeProxyNFT    []string
	kubeProxyNFTErr error
}

type linkInfo struct {
	alias string
	addrs []netip.Addr
}

type routeInfo struct {
	dst  netip.Prefix
	link string
}

func readNodeState(ctx context.Context, _ Config) nodeState {
	st := nodeState{links: map[string]linkInfo{}, saves: map[rules.Mode][]byte{}, familySaves: map[rules.Mode]map[rules.Family][]byte{}}
	names := map[int]string{}
	links, err := netlink.LinkList()
	if err != nil {
		st.linksErr = err
	}
	for _, l := range links {
		info := linkInfo{alias: l.Attrs().Alias}
		names[l.Attrs().Index] = l.Attrs().Name
		addrs, err := netlink.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			st.linksErr = err
		}
		for _, a := range addrs {
			if ip, ok := netip.AddrFromSlice(a.IP); ok {
				info.addrs = append(info.addrs, ip.Unmap())
			}
		}
		st.links[l.Attrs().Name] = info
	}
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil {
		st.routesErr = err
	}
	for _, r := range routes {
		if r.Dst == nil {
			continue // the default route holds every address; it says nothing
		}
		ip, ok := netip.AddrFromSlice(r.Dst.IP)
		if !ok {
			continue
		}
		ones, _ := r.Dst.Mask.Size()
		if ones == 0 {
			continue
		}
		st.routes = append(st.routes, routeInfo{dst: netip.PrefixFrom(ip.Unmap(), ones), link: names[r.LinkIndex]})
	}
	for _, mode := range []rules.Mode{rules.Legacy, rules.NFT} {
		var all []byte
		found := false
		for i, prefix := range []string{"iptables", "ip6tables"} {
			path, err := exec.LookPath(prefix + "-" + string(mode) + "-save")
			if err != nil {
				continue
			}
			found = true
			// A family or table the kernel lacks simply has no rules to find.
			out, _ := exec.CommandContext(ctx, path).Output()
			all = append(all, out...)
			if st.familySaves[mode] == nil {
				st.familySaves[mode] = map[rules.Family][]byte{}
			}
			st.familySaves[mode][rules.Families[i]] = out
		}
		if found {
			st.saves[mode] = all
		}
	}
	st.kubeProxyNFT, st.kubeProxyNFTErr = rules.NewNFTablesManager().KubeProxyTables(ctx)
	return st
}

var (
	kubeServicesChain = regexp.MustCompile(`(?m)^:KUBE-SERVICES\s`)
	kubeChainLine     = regexp.MustCompile(`(?m)^:KUBE-`)
	upstreamComment   = regexp.MustCompile(`(?m)^-A .*NodeLocal DNS Cache`)
)

func checkKubeProxyMode(cfg Config, st nodeState) []Finding {
	const check = "kube-proxy mode"
	if ipvs, ok := st.links[IPVSInterface]; ok {
		var bound []netip.Addr
		for _, a := range cfg.Addresses {
			if slices.Contains(ipvs.addrs, a) {
				bound = append(bound, a)
			}
		}
		if len(bound) > 0 {
			return []Finding{{check, SeverityError,
				fmt.Sprintf("IPVS: %s holds %v, a ClusterIP kube-proxy serves; the cache cannot take it over", IPVSInterface, bound),
				"serve only the link-local address (drop the ClusterIP from -localip); once the cache is Ready on the node, point kubelet's clusterDNS at that address"}}
		}
		return []Finding{checkKubeletClusterDNS(cfg, ipvs.addrs)}
	}
	if len(st.kubeProxyNFT) > 0 {
		return []Finding{{Check: check, Severity: SeverityOK, Message: fmt.Sprintf("nftables (table %s)", strings.Join(st.kubeProxyNFT, ", "))}}
	}
	for _, mode := range []rules.Mode{rules.NFT, rules.Legacy} {
		if kubeServicesChain.Match(st.saves[mode]) {
			return []Finding{{Check: check, Severity: SeverityOK, Message: fmt.Sprintf("iptables (KUBE-SERVICES in iptables-%s)", mode)}}
		}
	}
	return []Finding{{check, SeverityWarning, "no kube-proxy rules found (no " + IPVSInterface + ", no KUBE-SERVICES chain, no nft table kube-proxy)",
		"run on a node where kube-proxy runs, or check that the cluster's Service proxy still DNATs the kube-dns ClusterIP: the fail-open path relies on it"}}
}

// kubeletConfiguration is the part of kubelet's KubeletConfiguration file (kubelet.config.k8s.io/v1beta1)
// the preflight reads.
type kubeletConfiguration struct {
	ClusterDNS []string `json:"clusterDNS"`
}

// checkKubeletClusterDNS reads clusterDNS from kubelet's configuration: in IPVS mode Pods must be told the
// link-local address, since the ClusterIP stays kube-proxy's. Before the rollout kubelet still names the
// kube-dns ClusterIP, and must: pointing it at the link-local address before the cache answers there would
// send every new Pod's lookups to an address nothing serves. So that is guidance in the safe order, not an
// error. ipvsAddrs are the ClusterIPs on kube-ipvs0.
func checkKubeletClusterDNS(cfg Config, ipvsAddrs []netip.Addr) Finding {
	const check = "kube-proxy mode"
	order := fmt.Sprintf("roll out the cache first; once its Pod is Ready on this node (node-cache -verify passes), set kubelet's clusterDNS to %s, restart kubelet, then restart the workloads so that their resolv.conf names it",
		cfg.Addresses[0])
	data, err := os.ReadFile(cfg.KubeletConfig)
	if err != nil {
		return Finding{check, SeverityWarning, fmt.Sprintf("IPVS; could not read kubelet's configuration: %v", err), order}
	}
	var kc kubeletConfiguration
	if err := yaml.Unmarshal(data, &kc); err != nil {
		return Finding{check, SeverityWarning, fmt.Sprintf("IPVS; could not parse kubelet's configuration %s: %v", cfg.KubeletConfig, err), order}
	}
	var clusterIPs []string
	for _, s := range kc.ClusterDNS {
		a, err := netip.ParseAddr(s)
		if err != nil {
			continue
		}
		if slices.Contains(cfg.Addresses, a.Unmap()) {
			return Finding{Check: check, Severity: SeverityOK, Message: fmt.Sprintf("IPVS; kubelet's clusterDNS is %v", kc.ClusterDNS)}
		}
		if slices.Contains(ipvsAddrs, a.Unmap()) {
			clusterIPs = append(clusterIPs, s)
		}
	}
	if len(clusterIPs) > 0 {
		return Finding{check, SeverityWarning, fmt.Sprintf("IPVS: kubelet's clusterDNS is %v, the kube-dns ClusterIP on %s: right until the cache serves this node, after which Pods must be pointed at %s",
			kc.ClusterDNS, IPVSInterface, cfg.Addresses[0]), order}
	}
	return Finding{check, SeverityWarning, fmt.Sprintf("IPVS: kubelet's clusterDNS is %v, neither one of the cache's addresses nor a ClusterIP on %s: Pods would bypass the cache",
		kc.ClusterDNS, IPVSInterface), order}
}

func checkAddressesInUse(cfg Config, st nodeState) []Finding {
	const check = "local addresses"
	if st.linksErr != nil || st.routesErr != nil {
		return []Finding{{check, SeverityError, fmt.Sprintf("could not read links and routes: %v", errors.Join(st.linksErr, st.routesErr)), "run with CAP_NET_ADMIN in the host's network namespace"}}
	}
	var fs []Finding
	for _, a := range cfg.Addresses {
		for name, l := range st.links {
			if name == cfg.Interface || name == IPVSInterface || !slices.Contains(l.addrs, a) {
				continue // kube-ipvs0 is the kube-proxy check's business
			}
			fs = append(fs, Finding{check, SeverityError, fmt.Sprintf("%s is already on link %s", a, name),
				fmt.Sprintf("choose another local address, or remove %s from %s", a, name)})
		}
		for _, r := range st.routes {
			if r.link == cfg.Interface || r.link == IPVSInterface || !r.dst.Contains(a) || r.dst.Bits() == a.BitLen() {
				continue
			}
			fs = append(fs, Finding{check, SeverityWarning, fmt.Sprintf("%s is inside route %s dev %s: the node sends that range elsewhere", a, r.dst, r.link),
				"make sure nothing on the node needs that route for this address (a cloud metadata range, say), or choose another address"})
		}
	}
	if len(fs) == 0 {
		fs = append(fs, Finding{Check: check, Severity: SeverityOK, Message: fmt.Sprintf("%v are on no other link and in no route", cfg.Addresses)})
	}
	return fs
}

func checkBackend(cfg Config, st nodeState) []Finding {
	const check = "rules backend"
	mode, err := rules.ParseMode(cfg.Backend)
	if err != nil {
		return []Finding{{check, SeverityError, err.Error(), "use auto, legacy, nft or nftables"}}
	}
	if st.kubeProxyNFTErr != nil {
		return []Finding{{check, SeverityWarning, fmt.Sprintf("could not look for kube-proxy's nftables tables: %v", st.kubeProxyNFTErr),
			"check that the container has CAP_NET_ADMIN and runs in the host's network namespace"}}
	}
	if len(st.kubeProxyNFT) > 0 {
		tables := strings.Join(st.kubeProxyNFT, ", ")
		var iptKube []string
		for _, m := range []rules.Mode{rules.Legacy, rules.NFT} {
			if kubeServicesChain.Match(st.saves[m]) {
				iptKube = append(iptKube, "iptables-"+string(m))
			}
		}
		switch {
		case len(iptKube) > 0:
			return []Finding{{check, SeverityError, fmt.Sprintf("kube-proxy's rules are both in nftables (table %s) and in %s: auto refuses to guess", tables, strings.Join(iptKube, " and ")),
				"find which mode kube-proxy runs in now (its logs, its ConfigMap) and remove the other's rules (kube-proxy --cleanup), or set the backend explicitly"}}
		case mode == rules.Auto || mode == rules.NFTables:
			return []Finding{{Check: check, Severity: SeverityOK, Message: fmt.Sprintf("kube-proxy runs in nftables mode (table %s); the cache uses %s: table inet %s, written over netlink, no iptables needed",
				tables, rules.NFTables, rules.NFTablesTable)}}
		}
		return []Finding{{check, SeverityWarning, fmt.Sprintf("kube-proxy runs in nftables mode (table %s), but the cache is configured for iptables-%s: its NOTRACK rules work, "+
			"but the node image needs iptables and the cache's rules are not where kube-proxy's are", tables, mode), "set the backend to auto or nftables"}}
	}
	if mode == rules.NFTables {
		return []Finding{{Check: check, Severity: SeverityOK, Message: fmt.Sprintf("configured for nftables: table inet %s, written over netlink", rules.NFTablesTable)}}
	}
	if len(st.saves) == 0 {
		return []Finding{{check, SeverityError, "neither iptables-legacy-save nor iptables-nft-save is installed", "install iptables 1.8 with both backends"}}
	}
	var kube []rules.Mode
	for _, m := range []rules.Mode{rules.Legacy, rules.NFT} {
		if kubeChainLine.Match(st.saves[m]) {
			kube = append(kube, m)
		}
	}
	switch {
	case len(kube) == 2:
		return []Finding{{check, SeverityWarning, "KUBE-* chains are in both iptables-legacy and iptables-nft: an old kube-proxy or kubelet left rules behind",
			"find which backend kube-proxy uses now (its logs) and set the cache's backend to it"}}
	case len(kube) == 0 && mode == rules.Auto:
		return []Finding{{check, SeverityWarning, "no kube-proxy rules in iptables or nftables yet: the cache waits up to " + nodelocal.DefaultBackendWait.String() +
			" for them, then falls back to what the node's other rules suggest (iptables-nft when there are none)",
			"start kube-proxy first, or set the backend explicitly on nodes without kube-proxy"}}
	case len(kube) == 0:
		return []Finding{{Check: check, Severity: SeverityOK, Message: "no KUBE-* chains in iptables; the cache uses " + string(mode) + " as configured"}}
	case mode != rules.Auto && mode != kube[0]:
		return []Finding{{check, SeverityError, fmt.Sprintf("the cache is configured for %s, but kube-proxy's rules are in iptables-%s: the rules would not order with each other", mode, kube[0]),
			fmt.Sprintf("set the backend to %s or auto", kube[0])}}
	}
	return []Finding{{Check: check, Severity: SeverityOK, Message: fmt.Sprintf("kube-proxy's rules are in iptables-%s; the cache uses %s", kube[0], mode)}}
}

func checkForeignCache(cfg Config, st nodeState) []Finding {
	const check = "other node cache"
	var fs []Finding
	for _, m := range []rules.Mode{rules.Legacy, rules.NFT} {
		if upstreamComment.Match(st.saves[m]) {
			fs = append(fs, Finding{check, SeverityError, fmt.Sprintf("iptables-%s holds rules commented \"NodeLocal DNS Cache\": upstream's node-local-dns runs, or ran, here", m),
				"remove the upstream node-local-dns DaemonSet (its teardown removes its rules) before rolling this one out"})
		}
	}
	if l, ok := st.links[cfg.Interface]; ok && l.alias != link.DefaultAlias {
		fs = append(fs, Finding{check, SeverityError, fmt.Sprintf("link %s exists and was not created by nodelocaldns (alias %q): another node cache owns it", cfg.Interface, l.alias),
			"remove the other node cache, or give this one another -interfacename"})
	}
	if len(fs) == 0 {
		fs = append(fs, Finding{Check: check, Severity: SeverityOK, Message: "no upstream node-local-dns rules or link"})
	}
	return fs
}

// checkRulesAhead names the rules of others in the hook chains the cache's rules jump from that end the
// table's walk (kubernetes-sigs/node-local-dns#13: a raw-table ACCEPT above the cache's NOTRACK makes TCP
// lookups time out). Ahead of a jump of the cache's that is there already, each is an error: traffic to the
// cache misses its rules now. With no jump yet, each is a warning: the cache inserts its jump at position 1,
// above them, and puts it back there every sync, but something that re-inserts its rule at the top wins
// between syncs.
func checkRulesAhead(cfg Config, st nodeState) []Finding {
	const check = "rules ahead"
	var fs []Finding
	for _, mode := range []rules.Mode{rules.Legacy, rules.NFT} {
		for _, fam := range rules.Families {
			var addrs []netip.Addr
			for _, a := range cfg.Addresses {
				if rules.FamilyOf(a) == fam {
					addrs = append(addrs, a)
				}
			}
			out := st.familySaves[mode][fam]
			if len(addrs) == 0 || len(out) == 0 {
				continue
			}
			rs := rules.NodeCache(fam, rules.NodeCacheSpec{Endpoints: rules.Endpoints(addrs, 53, nil)})
			for _, c := range rs.Chains {
				ts, err := rules.ParseTable(out, c.Table)
				if err != nil {
					fs = append(fs, Finding{check, SeverityWarning, fmt.Sprintf("reading iptables-%s %s %s: %v", mode, fam, c.Table, err), ""})
					continue
				}
				for _, h := range c.Hooks {
					hr := ts.Chains[h]
					if ahead := rules.RulesAhead(fam, c.Table, h, hr, c.Name); len(ahead) > 0 {
						for _, a := range ahead {
							fs = append(fs, Finding{check, SeverityError,
								fmt.Sprintf("iptables-%s %s is ahead of the cache's jump to %s: the traffic it matches misses the cache's rules", mode, a, c.Name),
								"find the component that inserts it (its comment, its chain) and make it append instead; the cache moves its jump back to the top every sync period"})
						}
						continue
					}
					if slices.ContainsFunc(hr, func(r rules.Rule) bool { return r.Target() == c.Name }) {
						continue // the jump is first
					}
					for i, r := range hr {
						if !rules.EndsWalk(r) {
							continue
						}
						a := rules.AheadRule{Family: fam, Table: c.Table, Chain: h, Position: i + 1, Rule: r}
						fs = append(fs, Finding{check, SeverityWarning,
							fmt.Sprintf("iptables-%s %s ends the table's walk: the cache will insert its jump above it, but if its owner re-inserts it at the top, the traffic it matches misses the cache's rules until the cache's next sync", mode, a),
							"make sure the component that owns it appends its rules, or watch coredns_nodecache_rules_ahead_total once the cache runs"})
					}
				}
			}
		}
	}
	if len(fs) == 0 {
		fs = append(fs, Finding{Check: check, Severity: SeverityOK, Message: "no rule of another's ahead of where the cache's jumps go"})
	}
	return fs
}

func checkResolvConf(cfg Config) []Finding {
	const check = "resolv.conf"
	data, err := os.ReadFile(cfg.ResolvConf)
	if err != nil {
		return []Finding{{check, SeverityWarning, fmt.Sprintf("could not read it: %v", err), "the cache forwards names outside the cluster to the resolvers of " + cfg.ResolvConf + "; mount the node's"}}
	}
	var servers []string
	var fs []Finding
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || f[0] != "nameserver" {
			continue
		}
		servers = append(servers, f[1])
		if a, err := netip.ParseAddr(f[1]); err == nil && slices.Contains(cfg.Addresses, a.Unmap()) {
			fs = append(fs, Finding{check, SeverityError, fmt.Sprintf("%s names %s, one of the cache's own addresses: the cache would forward to itself", cfg.ResolvConf, a),
				"point the node's resolv.conf (kubelet's --resolv-conf) at the real upstream resolvers"})
		}
	}
	if len(servers) == 0 {
		fs = append(fs, Finding{check, SeverityWarning, cfg.ResolvConf + " names no nameserver", "give the node upstream resolvers"})
	}
	if len(fs) == 0 {
		fs = append(fs, Finding{Check: check, Severity: SeverityOK, Message: "nameservers " + strings.Join(servers, ", ")})
	}
	return fs
}

// Capability bits, from linux/capability.h.
const (
	capNetAdmin = 12
	capNetRaw   = 13
)

func checkCapabilities(cfg Config) []Finding {
	const check = "capabilities"
	data, err := os.ReadFile(cfg.ProcStatus)
	if err != nil {
		return []Finding{{check, SeverityError, fmt.Sprintf("could not read %s: %v", cfg.ProcStatus, err), ""}}
	}
	eff, err := capEff(data)
	if err != nil {
		return []Finding{{check, SeverityError, fmt.Sprintf("%s: %v", cfg.ProcStatus, err), ""}}
	}
	var missing []string
	if eff&(1<<capNetAdmin) == 0 {
		missing = append(missing, "NET_ADMIN")
	}
	if eff&(1<<capNetRaw) == 0 {
		missing = append(missing, "NET_RAW")
	}
	if len(missing) > 0 {
		return []Finding{{check, SeverityError, "missing " + strings.Join(missing, " and ") + ": the cache cannot add its link or rules",
			"add them to the container's securityContext.capabilities"}}
	}
	return []Finding{{Check: check, Severity: SeverityOK, Message: "NET_ADMIN and NET_RAW are effective"}}
}

// capEff parses the CapEff line of /proc/<pid>/status.
func capEff(status []byte) (uint64, error) {
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "CapEff:"); ok {
			v, err := strconv.ParseUint(strings.TrimSpace(rest), 16, 64)
			if err != nil {
				return 0, fmt.Errorf("CapEff %q: %w", strings.TrimSpace(rest), err)
			}
			return v, nil
		}
	}
	return 0, errors.New("no CapEff line")
}

func checkXtablesLock(cfg Config, st nodeState) []Finding {
	const check = "xtables lock"
	fi, err := os.Stat(cfg.XtablesLock)
	if err == nil && fi.Mode().IsRegular() {
		return []Finding{{Check: check, Severity: SeverityOK, Message: cfg.XtablesLock + " exists"}}
	}
	msg := cfg.XtablesLock + " is missing or not a file"
	fix := "mount the host's " + DefaultXtablesLock + " (hostPath, type FileOrCreate): without it iptables-legacy in the container and kube-proxy do not exclude each other"
	mode, _ := rules.ParseMode(cfg.Backend)
	if mode == rules.NFTables || (mode == rules.Auto && len(st.kubeProxyNFT) > 0) {
		return []Finding{{Check: check, Severity: SeverityOK, Message: "not needed: the nftables backend runs no iptables command"}}
	}
	legacy := mode == rules.Legacy || (mode == rules.Auto && kubeChainLine.Match(st.saves[rules.Legacy]) && !kubeChainLine.Match(st.saves[rules.NFT]))
	if legacy {
		return []Finding{{check, SeverityError, msg + " and the backend is legacy", fix}}
	}
	return []Finding{{check, SeverityWarning, msg + " (iptables-nft does not need it; legacy does)", fix}}
}
