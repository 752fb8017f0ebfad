package corefile

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The variables of upstream's node-local-dns Corefile template. Those marked "at start" are node-cache's to
// fill in; the others are substituted into the manifest before it is applied, but Expand fills them too
// when it is given their values.
const (
	// LocalDNSVar is the node-local addresses: -localip (at start).
	LocalDNSVar = "__PILLAR__LOCAL__DNS__"
	// DNSServerVar is the kube-dns ClusterIP, which -localip already lists, so node-cache empties it.
	DNSServerVar = "__PILLAR__DNS__SERVER__"
	// DNSDomainVar is the cluster domain.
	DNSDomainVar = "__PILLAR__DNS__DOMAIN__"
	// ClusterDNSVar is the cluster DNS upstream: the -upstreamsvc Service (at start).
	ClusterDNSVar = "__PILLAR__CLUSTER__DNS__"
	// UpstreamServersVar is the kube-dns ConfigMap's upstreamNameservers, or /etc/resolv.conf (at start).
	UpstreamServersVar = "__PILLAR__UPSTREAM__SERVERS__"
	// PrometheusEndpointVar is the prometheus plugin's HOST:PORT (at start).
	PrometheusEndpointVar = "__PROMETHEUS__ENDPOINT__"
)

// Expansion is what node-cache fills into a base Corefile: the values of the template variables, and the
// directives its flags stand for.
type Expansion struct {
	// LocalIPs replace LocalDNSVar: all of them where the variable is an argument of its own (bind), the
	// first where it is the host of a HOST:PORT (health), in brackets if it is IPv6.
	LocalIPs []netip.Addr
	// DNSServer replaces DNSServerVar; node-cache leaves it empty, as -localip lists the ClusterIP already.
	DNSServer []netip.Addr
	// DNSDomain replaces DNSDomainVar.
	DNSDomain string
	// ClusterDNS replaces ClusterDNSVar where Upstream does not.
	ClusterDNS []string
	// Upstream, when set, turns every `forward . __PILLAR__CLUSTER__DNS__` into an upstreamsvc directive
	// for this Service, keeping the forward's transport.
	Upstream *Upstream
	// PrometheusEndpoint replaces PrometheusEndpointVar.
	PrometheusEndpoint string
	// Notrack, when set, is added after the bind of every block that has a bind and no notrack.
	Notrack *Notrack
	// NotrackPorts are TCP ports to exempt besides DNS, such as the health port. The health and ready
	// ports of the Corefile, when they listen on a local address, are added to them: a liveness or
	// readiness probe must not depend on a free conntrack slot any more than a DNS query does.
	NotrackPorts []uint16
	// Port is the DNS port of stub-domain blocks when the base Corefile has no `.` block to copy.
	Port uint16
	// ServeStale, when set, is added to every cache and wirecache directive that has no serve_stale, so
	// a base Corefile written before serve_stale (upstream's template) keeps answering through an
	// upstream outage. A block keeps its own serve_stale; `serve_stale 0s` in a cache turns it off.
	ServeStale *ServeStale
}

// Expand turns a base Corefile into the Corefile node-cache runs: it fills in the template variables, turns
// the cluster DNS forward into upstreamsvc, adds notrack, points the `.` block at the kube-dns ConfigMap's
// upstreamNameservers (over UDP, as node-cache does) or resolv.conf, and adds one block per stub domain,
// a copy of the `.` block forwarding to the stub domain's nameservers.
//
// Anything left unexpanded is an error naming its line: a Corefile with a __PILLAR__ variable in it would
// start, and serve a zone called __PILLAR__DNS__DOMAIN__.
func Expand(base []byte, e Expansion, kd KubeDNS) ([]byte, error) {
	if err := kd.Validate(); err != nil {
		return nil, err
	}
	f, err := Parse(base)
	if err != nil {
		return nil, fmt.Errorf("parsing the base Corefile: %w", err)
	}
	for _, b := range f.Blocks {
		if len(b.Keys) == 1 && strings.HasPrefix(b.Keys[0], "(") {
			return nil, fmt.Errorf("line %d: snippets are not supported in a node-cache base Corefile", b.Line)
		}
		if d := b.Find("import"); len(d) > 0 {
			return nil, fmt.Errorf("line %d: import is not supported in a node-cache base Corefile", d[0].Line)
		}
	}
	if e.Upstream != nil {
		if err := replaceClusterForward(f, *e.Upstream); err != nil {
			return nil, err
		}
	}
	setUpstreamServers(f, kd.UpstreamNameservers)
	if err := substitute(f, e); err != nil {
		return nil, err
	}
	if e.Notrack != nil {
		addNotrack(f, *e.Notrack, notrackPorts(f, e))
	}
	if err := addStubDomains(f, kd.StubDomains, e.Port); err != nil {
		return nil, err
	}
	if e.ServeStale != nil {
		addServeStale(f, *e.ServeStale)
	}
	if err := checkLeftovers(f); err != nil {
		return nil, err
	}
	return f.Format(), nil
}

// replaceClusterForward turns each `forward . __PILLAR__CLUSTER__DNS__` into upstreamsvc.
func replaceClusterForward(f *File, u Upstream) error {
	for _, b := range f.Blocks {
		for i, d := range b.Directives {
			if d.Name != "forward" || !slices.Contains(d.Args, ClusterDNSVar) {
				continue
			}
			if len(d.Args) != 2 || d.Args[0] != "." {
				return fmt.Errorf("line %d: want `forward . %s` to turn it into upstreamsvc, got `forward %s`",
					d.Line, ClusterDNSVar, strings.Join(d.Args, " "))
			}
			nd, err := upstreamsvcFromForward(d, u)
			if err != nil {
				return err
			}
			b.Directives[i] = nd
		}
	}
	return nil
}

// upstreamsvcFromForward keeps the forward's transport (TCP with force_tcp, else UDP first) and the options
// upstreamsvc shares with forward, and turns max_connect_attempts N, forward's bound on the sends of one query,
// into upstreamsvc's max_attempts N; any other option has no equivalent and is an error.
func upstreamsvcFromForward(fwd *Directive, u Upstream) (*Directive, error) {
	transport := &Directive{Name: "prefer_udp", Line: fwd.Line}
	var carried []*Directive
	for _, o := range fwd.Block {
		switch o.Name {
		case "force_tcp", "prefer_udp":
			transport = &Directive{Name: o.Name, Line: o.Line}
		case "max_concurrent", "expire", "health_check":
			carried = append(carried, o)
		case "max_connect_attempts":
			if len(o.Args) != 1 {
				return nil, fmt.Errorf("line %d: max_connect_attempts takes one number", o.Line)
			}
			if n, err := strconv.Atoi(o.Args[0]); err != nil || n < 1 {
				return nil, fmt.Errorf("line %d: max_connect_attempts %q: upstreamsvc's max_attempts needs a positive number "+
					"(one query is never sent without bound)", o.Line, o.Args[0])
			}
			carried = append(carried, &Directive{Name: "max_attempts", Args: o.Args, Line: o.Line})
		default:
			return nil, fmt.Errorf("line %d: forward option %q has no upstreamsvc equivalent; remove it or "+
				"write the upstreamsvc directive yourself", o.Line, o.Name)
		}
	}
	return upstreamsvcDirective(u, transport, carried, fwd.Line), nil
}

func upstreamsvcDirective(u Upstream, transport *Directive, carried []*Directive, line int) *Directive {
	svc, ns := u.Service, u.Namespace
	if svc == "" {
		svc = DefaultUpstreamService
	}
	if ns == "" {
		ns = DefaultNamespace
	}
	d := &Directive{Name: "upstreamsvc", Args: []string{svc, ns}, Line: line}
	d.Block = append(d.Block, transport)
	if len(u.Fallback) > 0 {
		d.Block = append(d.Block, &Directive{Name: "fallback", Args: slices.Clone(u.Fallback), Line: line})
	}
	d.Block = append(d.Block, carried...)
	return d
}

// setUpstreamServers fills UpstreamServersVar. Custom nameservers are reached over UDP, as node-cache does
// (they are outside the cluster, with no DNAT in between), so a force_tcp next to the variable goes.
func setUpstreamServers(f *File, servers []string) {
	for _, b := range f.Blocks {
		for _, d := range b.Directives {
			i := slices.Index(d.Args, UpstreamServersVar)
			if d.Name != "forward" || i < 0 {
				continue
			}
			if len(servers) == 0 {
				d.Args = slices.Replace(d.Args, i, i+1, ResolvConf)
				continue
			}
			d.Args = slices.Replace(d.Args, i, i+1, servers...)
			d.Block = slices.DeleteFunc(d.Block, func(o *Directive) bool { return o.Name == "force_tcp" })
		}
	}
}

// substitute replaces the template variables in every key and argument.
func substitute(f *File, e Expansion) error {
	var errs []error
	sub := func(tokens []string, line int) []string {
		var out []string
		for _, t := range tokens {
			expanded, err := substituteToken(t, e)
			if err != nil {
				errs = append(errs, fmt.Errorf("line %d: %w", line, err))
				out = append(out, t)
				continue
			}
			out = append(out, expanded...)
		}
		return out
	}
	var walk func([]*Directive)
	walk = func(dirs []*Directive) {
		for _, d := range dirs {
			d.Args = sub(d.Args, d.Line)
			walk(d.Block)
		}
	}
	for _, b := range f.Blocks {
		b.Keys = sub(b.Keys, b.Line)
		walk(b.Directives)
	}
	return errors.Join(errs...)
}

// substituteToken expands a token that is a variable into its values, and a variable inside a longer
// token (HOST:PORT, ZONE:PORT) into its first value.
func substituteToken(t string, e Expansion) ([]string, error) {
	values := map[string][]string{
		LocalDNSVar:           addrStrings(e.LocalIPs),
		DNSServerVar:          addrStrings(e.DNSServer),
		ClusterDNSVar:         e.ClusterDNS,
		PrometheusEndpointVar: nonEmpty(e.PrometheusEndpoint),
		DNSDomainVar:          nonEmpty(e.DNSDomain),
	}
	if v, ok := values[t]; ok {
		if len(v) == 0 && t != DNSServerVar {
			return []string{t}, nil // left for checkLeftovers, which names it
		}
		return v, nil
	}
	for _, name := range slices.Sorted(maps.Keys(values)) {
		before, after, ok := strings.Cut(t, name)
		if !ok {
			continue
		}
		v := values[name]
		if len(v) == 0 {
			continue
		}
		first := v[0]
		rest := after
		if ip, err := netip.ParseAddr(first); err == nil && ip.Is6() && strings.HasPrefix(rest, ":") {
			first = "[" + first + "]"
		}
		return substituteToken(before+first+rest, e)
	}
	return []string{t}, nil
}

func addrStrings(ips []netip.Addr) []string {
	out := make([]string, len(ips))
	for i, ip := range ips {
		out[i] = ip.String()
	}
	return out
}

func nonEmpty(s string) []string {
	if s == "" {
		return nil
	}
	return []string{s}
}

// notrackPorts are the extra ports: the ones asked for, and the health and ready ports on local addresses.
func notrackPorts(f *File, e Expansion) []uint16 {
	ports := slices.Clone(e.NotrackPorts)
	for _, b := range f.Blocks {
		for _, d := range b.Directives {
			if (d.Name != "health" && d.Name != "ready") || len(d.Args) == 0 {
				continue
			}
			host, port, err := net.SplitHostPort(d.Args[0])
			if err != nil {
				continue
			}
			ip, err := netip.ParseAddr(host)
			p, perr := strconv.ParseUint(port, 10, 16)
			if err != nil || perr != nil || !slices.Contains(e.LocalIPs, ip) {
				continue
			}
			ports = append(ports, uint16(p))
		}
	}
	slices.Sort(ports)
	return slices.Compact(ports)
}

// addNotrack puts a notrack after the bind of every block that binds and has none. The extra ports go to
// the block with health (or the first one), where a reader looks for them; every block's addresses are
// the same, so one directive covers them.
func addNotrack(f *File, n Notrack, ports []uint16) {
	var targets []*Block
	for _, b := range f.Blocks {
		if b.Has("bind") && !b.Has("notrack") {
			targets = append(targets, b)
		}
	}
	if len(targets) == 0 {
		return
	}
	portsAt := targets[0]
	for _, b := range targets {
		if b.Has("health") {
			portsAt = b
			break
		}
	}
	for _, b := range targets {
		var p []uint16
		if b == portsAt {
			p = ports
		}
		b.insertAfter("bind", notrackDirective(n, p, b.Find("bind")[0].Line))
	}
}

func notrackDirective(n Notrack, ports []uint16, line int) *Directive {
	d := &Directive{Name: "notrack", Line: line}
	opt := func(name string, args ...string) {
		d.Block = append(d.Block, &Directive{Name: name, Args: args, Line: line})
	}
	if n.Interface != "" && n.Interface != DefaultInterface {
		opt("interface", n.Interface)
	}
	if len(ports) > 0 {
		args := make([]string, len(ports))
		for i, p := range ports {
			args[i] = strconv.Itoa(int(p))
		}
		opt("ports", args...)
	}
	if n.Sync > 0 {
		opt("sync", formatDuration(n.Sync))
	}
	if n.Backend != "" {
		opt("backend", n.Backend)
	}
	if n.NoInterface {
		opt("no_interface")
	}
	if n.NoRules {
		opt("no_rules")
	}
	if n.SkipTeardown {
		opt("skip_teardown")
	}
	if n.Lock != "" {
		opt("lock", n.Lock)
	}
	if n.Handover {
		opt("handover", addrStrings(n.HandoverUpstream)...)
		if len(n.ServiceAddresses) > 0 {
			opt("service", addrStrings(n.ServiceAddresses)...)
		}
	}
	return d
}

// formatDuration writes whole seconds as "60s" rather than Go's "1m0s".
func formatDuration(d time.Duration) string {
	if d%time.Second == 0 {
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	}
	return d.String()
}

// addServeStale puts serve_stale into every cache and wirecache directive that has none, and with
// s.PreferPositive the prefer_positive policy into those that have their own serve_stale but no policy. A
// wirecache in a
// block with log steps aside and would hold nothing, but its serve_stale is still written: the block may
// lose its log on the next ConfigMap edit.
func addServeStale(f *File, s ServeStale) {
	for _, b := range f.Blocks {
		for _, d := range b.Directives {
			switch {
			case d.Name != "cache" && d.Name != "wirecache":
			case d.Option("serve_stale") == nil:
				add := []*Directive{wireCacheServeStale(s)}
				if d.Name == "cache" {
					add = cacheServeStale(s)
					if d.Option("serve_stale_policy") != nil {
						add = add[:1] // the ConfigMap's own policy stays
					}
				}
				for _, o := range add {
					o.Line = d.Line
					d.Block = append(d.Block, o)
				}
			case !s.PreferPositive || staleOff(d.Option("serve_stale")):
			case d.Name == "cache" && d.Option("serve_stale_policy") == nil:
				// The ConfigMap's serve_stale stays; the policy asked for joins it.
				o := cachePreferPositive()
				o.Line = d.Line
				d.Block = append(d.Block, o)
			case d.Name == "wirecache":
				if o := d.Option("serve_stale"); !slices.Contains(o.Args, "prefer_positive") {
					o.Args = append(o.Args, "prefer_positive")
				}
			}
		}
	}
}

// staleOff reports whether a serve_stale line turns serving stale off (a DURATION of 0).
func staleOff(o *Directive) bool {
	if len(o.Args) == 0 {
		return false
	}
	d, err := time.ParseDuration(o.Args[0])
	return err == nil && d == 0
}

// Directives a stub-domain block does not copy from the `.` block: they open one listener per process.
var notCopied = []string{"health", "ready", "pprof"}

// addStubDomains appends, in domain order, one block per stub domain: a copy of the `.` block with its
// forward pointed at the stub domain's nameservers, or a minimal block when there is no `.` block.
func addStubDomains(f *File, stubs map[string][]string, port uint16) error {
	if len(stubs) == 0 {
		return nil
	}
	root := rootBlock(f)
	if port == 0 {
		port = DefaultPort
	}
	if root != nil {
		if _, p, ok := splitKey(root.Keys[0]); ok && p != "" {
			if n, err := strconv.ParseUint(p, 10, 16); err == nil {
				port = uint16(n)
			}
		}
	}
	taken := map[string]int{}
	for _, b := range f.Blocks {
		for _, k := range b.Keys {
			zone, p, _ := splitKey(k)
			if p == "" {
				p = strconv.Itoa(int(port))
			}
			taken[zone+":"+p] = b.Line
		}
	}
	for _, domain := range slices.Sorted(maps.Keys(stubs)) {
		zone := strings.TrimSuffix(strings.ToLower(domain), ".")
		key := zone + ":" + strconv.Itoa(int(port))
		if line, dup := taken[key]; dup {
			return fmt.Errorf("stub domain %q would serve %s, which the server block on line %d serves already",
				domain, key, line)
		}
		taken[key] = 0
		forward := &Directive{Name: "forward", Args: append([]string{"."}, stubs[domain]...)}
		b := &Block{Keys: []string{key}}
		if root == nil {
			b.Directives = []*Directive{{Name: "errors"}, {Name: "cache", Args: []string{"30"}}, forward}
			f.Blocks = append(f.Blocks, b)
			continue
		}
		placed := false
		for _, d := range root.Directives {
			switch {
			case slices.Contains(notCopied, d.Name):
			case d.Name == "forward":
				if !placed {
					b.Directives = append(b.Directives, forward)
					placed = true
				}
			default:
				b.Directives = append(b.Directives, cloneDirective(d))
			}
		}
		if !placed {
			b.Directives = append(b.Directives, forward)
		}
		f.Blocks = append(f.Blocks, b)
	}
	return nil
}

// rootBlock is the block serving the root zone, which stub-domain blocks copy.
func rootBlock(f *File) *Block {
	for _, b := range f.Blocks {
		for _, k := range b.Keys {
			if zone, _, ok := splitKey(k); ok && zone == "." {
				return b
			}
		}
	}
	return nil
}

// splitKey takes a server block key apart: [dns://]ZONE[:PORT]. ok is false for other transports.
func splitKey(key string) (zone, port string, ok bool) {
	if scheme, rest, found := strings.Cut(key, "://"); found {
		if scheme != "dns" {
			return "", "", false
		}
		key = rest
	}
	zone = key
	if i := strings.LastIndex(key, ":"); i >= 0 && !strings.Contains(key[i:], "]") {
		zone, port = key[:i], key[i+1:]
	}
	if zone == "" {
		zone = "."
	}
	if zone != "." {
		zone = strings.TrimSuffix(strings.ToLower(zone), ".")
	}
	return zone, port, true
}

func cloneDirective(d *Directive) *Directive {
	c := &Directive{Name: d.Name, Args: slices.Clone(d.Args), Line: d.Line}
	for _, o := range d.Block {
		c.Block = append(c.Block, cloneDirective(o))
	}
	return c
}

// checkLeftovers names every template variable that nothing filled in, with the flag or value that fills it.
func checkLeftovers(f *File) error {
	var errs []error
	report := func(tokens []string, line int) {
		for _, t := range tokens {
			for _, v := range []string{LocalDNSVar, DNSServerVar, DNSDomainVar, ClusterDNSVar, UpstreamServersVar, PrometheusEndpointVar} {
				if strings.Contains(t, v) {
					errs = append(errs, fmt.Errorf("line %d: %s is not substituted; %s", line, v, fillHint[v]))
				}
			}
		}
	}
	var walk func([]*Directive)
	walk = func(dirs []*Directive) {
		for _, d := range dirs {
			report(append([]string{d.Name}, d.Args...), d.Line)
			walk(d.Block)
		}
	}
	for _, b := range f.Blocks {
		report(b.Keys, b.Line)
		walk(b.Directives)
	}
	return errors.Join(errs...)
}

var fillHint = map[string]string{
	LocalDNSVar:           "pass -localip",
	DNSServerVar:          "it is emptied whenever -localip is given",
	DNSDomainVar:          "substitute the cluster domain into the manifest before applying it, as upstream's instructions do",
	ClusterDNSVar:         "pass -upstreamsvc, or use it only as `forward . " + ClusterDNSVar + "`",
	UpstreamServersVar:    "use it only as an argument of forward",
	PrometheusEndpointVar: "pass -prometheus-listen-address",
}
