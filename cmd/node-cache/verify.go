//go:build linux

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"

	"github.com/nodelocaldns/nodelocaldns/corefile"
	"github.com/nodelocaldns/nodelocaldns/nodelocal"
)

// verifyFlags are the -verify mode's own flags. The mode reads -localip, -interfacename, -upstreamsvc,
// -health-port, -kubednscm, -corefile, -prometheus-listen-address and CoreDNS's -conf and -dns.port of the
// cache's flags, and -guard.backend of the guard's, so that it runs with the cache's own arguments.
type verifyFlags struct {
	domain    string
	name      string
	external  string
	readyPort string
	timeout   time.Duration
	backend   string
}

func registerVerifyFlags(fs *flag.FlagSet) *verifyFlags {
	v := &verifyFlags{}
	fs.StringVar(&v.domain, "verify.domain", corefile.DefaultClusterDomain, "the cluster domain")
	fs.StringVar(&v.name, "verify.name", "", "a cluster name that must resolve; default kubernetes.default.svc.<domain>; its address is also looked up in reverse")
	fs.StringVar(&v.external, "verify.external", "kubernetes.io", "a name outside the cluster that must resolve")
	fs.StringVar(&v.readyPort, "verify.readyport", strconv.Itoa(corefile.DefaultReadyPort), "port of the ready plugin on the first -localip address, instead of where the Corefile's ready listens")
	fs.DurationVar(&v.timeout, "verify.timeout", 2*time.Second, "timeout of each lookup and HTTP check")
	registerBackendFlag(fs, &v.backend)
	return v
}

// verifyMode is the -verify mode with its flag set.
type verifyMode struct {
	fs     *flag.FlagSet
	cache  *nodeCacheFlags
	verify *verifyFlags
}

// newVerifyMode defines the -verify mode's flags, the cache's and its own, on fs (see newModeFlagSet).
func newVerifyMode(fs *flag.FlagSet) *verifyMode {
	return &verifyMode{fs: fs, cache: registerNodeCacheFlags(fs), verify: registerVerifyFlags(fs)}
}

// run runs the -verify mode once its flag set is parsed and returns the exit status.
func (m *verifyMode) run() int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := runVerify(ctx, os.Stdout, m.fs, m.cache, m.verify); err != nil {
		log.Errorf("-verify: %v", err)
		if errors.Is(err, errUpstreamUnreachable) {
			return exitUpstreamUnreachable
		}
		return 1
	}
	return 0
}

// errVerifyFailed is returned when a check of the cache failed; the table says which.
var errVerifyFailed = errors.New("verification failed")

// errUpstreamUnreachable is returned when every failure is the cluster DNS upstream's: the cache answers, but
// kube-dns-upstream does not answer it. -verify exits with exitUpstreamUnreachable then, so that a rollout
// script tells a cluster-DNS outage from a broken cache.
var errUpstreamUnreachable = errors.New("the cluster DNS upstream does not answer; the node cache's own checks passed")

// exitUpstreamUnreachable is the exit status of -verify for errUpstreamUnreachable (1 is a failure of the
// cache, 2 a usage error).
const exitUpstreamUnreachable = 3

// verifyResult is one row of the -verify table.
type verifyResult struct {
	check, target string
	ok            bool
	// skipped marks a check that does not apply to what the Corefile serves (no ready plugin, no notrack);
	// detail says why. It neither passes nor fails.
	skipped bool
	detail  string
	// viaUpstream marks an answer the cache gets from the cluster DNS upstream (the cluster name, its
	// reverse), asked of the cache's address server.
	viaUpstream bool
	server      netip.Addr
	// upstreamFault is set on a failed viaUpstream row when the upstream does not answer but the cache
	// answers on server: the failure is the upstream's, shown as UPSTREAM and not counted against the cache.
	upstreamFault bool
}

// result is the RESULT column of r.
func (r verifyResult) result() string {
	switch {
	case r.skipped:
		return "skipped"
	case r.ok:
		return "ok"
	case r.upstreamFault:
		return "UPSTREAM"
	}
	return "FAIL"
}

// verifier holds what -verify checks and collects the results.
type verifier struct {
	listen  []netip.Addr
	iface   string
	backend string
	dnsPort uint16
	// served is the Corefile the cache serves (-conf), which says what the other checks ask: the blocks
	// and their ports, the health and ready addresses, whether notrack keeps the link and rules. nil when it
	// could not be read (a failed corefile row): the checks then follow the flags.
	served *corefile.File
	// confPath is where served was read from.
	confPath string
	// healthPort and readyPort are the flags' ports, on the first local address, for when the Corefile
	// cannot be read; readyPortSet says -verify.readyport was given, which then wins over the Corefile.
	healthPort   uint16
	readyPort    uint16
	readyPortSet bool
	domain       string
	name         string
	external     string
	stubs        []string
	timeout      time.Duration
	// metricsURL is the cache's /metrics (its prometheus plugin), where upstreamsvc says where it forwards.
	metricsURL string
	// upstreamService is the Service in front of the cluster DNS, for its address in the environment when
	// the metrics do not give one.
	upstreamService string
	lookupEnv       func(string) (string, bool)

	results []verifyResult
	// trackedBefore holds the conntrack entries for the cache's addresses from before the first lookup
	// (noteTrackedBefore); nil when the conntrack check is skipped.
	trackedBefore map[udpFlow]bool
	// lookups are the flows of the UDP queries answered, for the conntrack check; uncheckable counts, by
	// server address, those answered from a port conntrack had an entry for before.
	lookups     []udpFlow
	uncheckable map[netip.Addr]int
	// answeredOn holds the cache's addresses that answered at least one lookup (any rcode).
	answeredOn map[netip.Addr]bool
}

func (v *verifier) add(check, target string, ok bool, format string, args ...any) {
	v.results = append(v.results, verifyResult{check: check, target: target, ok: ok, detail: fmt.Sprintf(format, args...)})
}

// skip adds a row for a check that does not apply to what the Corefile serves, with the reason.
func (v *verifier) skip(check, target string, format string, args ...any) {
	v.results = append(v.results, verifyResult{check: check, target: target, skipped: true, detail: fmt.Sprintf(format, args...)})
}

// runVerify is the -verify mode: it runs every check and prints the table to w.
func runVerify(ctx context.Context, w io.Writer, fs *flag.FlagSet, nc *nodeCacheFlags, vf *verifyFlags) error {
	v, err := newVerifier(fs, nc, vf)
	if err != nil {
		return err
	}
	v.readCorefile()
	if why := v.notrackSkip("no_interface"); why != "" {
		v.skip("link", v.iface, "%s", why)
	} else {
		v.checkLink()
	}
	rulesSkip := v.notrackSkip("no_rules")
	if rulesSkip != "" {
		v.skip("rules", "notrack", "%s", rulesSkip)
	} else {
		v.checkRules(ctx)
	}
	if rulesSkip == "" {
		v.noteTrackedBefore()
	}
	v.checkAnswers(ctx)
	v.checkUpstream(ctx)
	if rulesSkip != "" {
		v.skip("conntrack", "notrack", "%s: the cache's lookups may be tracked", rulesSkip)
	} else {
		v.checkConntrack()
	}
	v.checkHTTP(ctx, "ready", "/ready", corefile.DefaultReadyPort, v.readyPort, v.readyPortSet)
	v.checkHTTP(ctx, "health", "/health", corefile.DefaultHealthPort, v.healthPort, false)
	return printResults(w, v.results)
}

// printResults prints the table of results and a summary to w. It returns errVerifyFailed when a check of the
// cache failed, errUpstreamUnreachable when only the cluster DNS upstream's checks did.
func printResults(w io.Writer, results []verifyResult) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tTARGET\tRESULT\tDETAIL")
	var cacheFailed, upstreamFailed, attributed, skipped int
	var upstreams []string
	for _, r := range results {
		switch {
		case r.skipped:
			skipped++
		case r.ok:
		case r.upstreamFault:
			attributed++
		case r.check == upstreamCheck:
			upstreamFailed++
			upstreams = append(upstreams, r.target)
		default:
			cacheFailed++
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.check, r.target, r.result(), r.detail)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	run := len(results) - skipped
	var skippedNote string
	if skipped > 0 {
		skippedNote = fmt.Sprintf(" (%d skipped: they do not apply to the Corefile the cache serves)", skipped)
	}
	switch {
	case cacheFailed > 0:
		fmt.Fprintf(w, "%d of %d checks failed%s\n", cacheFailed+upstreamFailed, run-attributed, skippedNote)
		return errVerifyFailed
	case upstreamFailed > 0:
		fmt.Fprintf(w, "%d of %d checks failed%s", upstreamFailed, run, skippedNote)
		if attributed > 0 {
			fmt.Fprintf(w, " and %d are UPSTREAM", attributed)
		}
		fmt.Fprintf(w, ", all because the cluster DNS upstream %s does not answer this node; the node cache's own checks passed\n",
			strings.Join(upstreams, ", "))
		return errUpstreamUnreachable
	}
	fmt.Fprintf(w, "all %d checks passed%s\n", run, skippedNote)
	return nil
}

func newVerifier(fs *flag.FlagSet, nc *nodeCacheFlags, vf *verifyFlags) (*verifier, error) {
	v := &verifier{iface: nc.interfaceName, domain: strings.TrimSuffix(vf.domain, "."), external: vf.external, timeout: vf.timeout,
		upstreamService: defaultVerifyUpstreamSvc, lookupEnv: os.LookupEnv, answeredOn: map[netip.Addr]bool{}}
	var errs []error
	var err error
	if nc.localIP == "" {
		errs = append(errs, errors.New("-verify needs -localip: the cache's addresses, as its container has them"))
	} else if v.listen, err = parseIPList(nc.localIP); err != nil {
		errs = append(errs, fmt.Errorf("-localip: %w", err))
	}
	fs.Visit(func(fl *flag.Flag) {
		if fl.Name == "upstreamsvc" {
			v.upstreamService = nc.upstreamSvc
		}
	})
	conf := lookupFlag(fs, "conf", "")
	if conf == "" {
		conf = nc.corefile
	}
	v.confPath = conf
	fs.Visit(func(fl *flag.Flag) {
		if fl.Name == "verify.readyport" {
			v.readyPortSet = true
		}
	})
	if metrics := cacheMetricsAddress(nc.prometheusListenAddress, conf, v.listen); metrics != "" {
		v.metricsURL = "http://" + metrics + "/metrics"
	}
	if v.backend, err = nodelocal.ParseBackend(vf.backend); err != nil {
		errs = append(errs, fmt.Errorf("-guard.backend: %w", err))
	}
	if v.dnsPort, err = parsePort(lookupFlag(fs, "dns.port", "53")); err != nil {
		errs = append(errs, fmt.Errorf("-dns.port: %w", err))
	}
	if v.healthPort, err = parsePort(nc.healthPort); err != nil {
		errs = append(errs, fmt.Errorf("-health-port: %w", err))
	}
	if v.readyPort, err = parsePort(vf.readyPort); err != nil {
		errs = append(errs, fmt.Errorf("-verify.readyport: %w", err))
	}
	if vf.timeout <= 0 {
		errs = append(errs, errors.New("-verify.timeout must be positive"))
	}
	v.name = vf.name
	if v.name == "" {
		v.name = "kubernetes.default.svc." + v.domain
	}
	// The stub domains of the kube-dns ConfigMap the cache merges, where it would find it.
	dir := nc.kubeDNSCM
	if dir == "" {
		if st, err := os.Stat(defaultKubeDNSCM); err == nil && st.IsDir() {
			dir = defaultKubeDNSCM
		}
	}
	if dir != "" {
		kd, err := corefile.ReadKubeDNSDir(dir)
		if err != nil {
			errs = append(errs, fmt.Errorf("-kubednscm: %w", err))
		}
		for d := range kd.StubDomains {
			v.stubs = append(v.stubs, d)
		}
		sort.Strings(v.stubs)
	}
	return v, errors.Join(errs...)
}

// checkLink checks that the node-local link is there, up, and holds every address.
func (v *verifier) checkLink() {
	l, err := netlink.LinkByName(v.iface)
	if err != nil {
		v.add("link", v.iface, false, "no such link: %v", err)
		return
	}
	if l.Attrs().Flags&net.FlagUp == 0 {
		v.add("link", v.iface, false, "down")
	} else {
		v.add("link", v.iface, true, "%s, up", l.Type())
	}
	addrs, err := netlink.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		v.add("addresses", v.iface, false, "listing them: %v", err)
		return
	}
	var have []netip.Addr
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			have = append(have, ip.Unmap())
		}
	}
	for _, ip := range v.listen {
		if slices.Contains(have, ip) {
			v.add("address", ip.String(), true, "on %s", v.iface)
		} else {
			v.add("address", ip.String(), false, "not on %s (it holds %v)", v.iface, have)
		}
	}
}

// checkRules checks, in the backend the cache uses, that the cache's rules cover every address and DNS
// port and see traffic first; that the guard has not failed the node open; and that no other backend holds
// rules of the cache's (nodelocal.InspectRules).
func (v *verifier) checkRules(ctx context.Context) {
	for _, c := range nodelocal.InspectRules(ctx, v.backend, v.listen, v.dnsPort) {
		v.add(c.Check, c.Target, c.OK, "%s", c.Detail)
	}
}

// checkAnswers asks every local address for the cluster name (UDP and TCP), its reverse, the external name
// and each stub domain.
func (v *verifier) checkAnswers(ctx context.Context) {
	for _, ip := range v.listen {
		server, ok := v.serverFor(ip, v.name)
		if !ok {
			v.skip("answer", fmt.Sprintf("%s %s", ip, v.name), "the Corefile (%s) has no server block that answers %s on %s", v.confPath, v.name, ip)
			for _, name := range append([]string{v.external}, v.stubs...) {
				v.answeredIfServed(ctx, ip, name)
			}
			continue
		}
		var reverse string
		for _, network := range []string{"udp", "tcp"} {
			r, err := v.lookup(ctx, network, server, v.name, dns.TypeA)
			target := fmt.Sprintf("%s %s A/%s", ip, v.name, network)
			switch {
			case err != nil:
				v.addViaUpstream(ip, target, false, "%v", err)
			case r.Rcode != dns.RcodeSuccess || len(answers(r, dns.TypeA)) == 0:
				v.addViaUpstream(ip, target, false, "%s with %d answers, want an address", dns.RcodeToString[r.Rcode], len(r.Answer))
			default:
				a := answers(r, dns.TypeA)
				v.addViaUpstream(ip, target, true, "%s", strings.Join(a, ", "))
				if rev, err := dns.ReverseAddr(a[0]); err == nil {
					reverse = rev
				}
			}
		}
		if reverse == "" {
			v.addViaUpstream(ip, ip.String()+" reverse", false, "not asked: no address of %s to look up in reverse", v.name)
		} else if rs, ok := v.serverFor(ip, reverse); ok {
			v.answered(ctx, rs, "reverse", reverse, dns.TypePTR, true)
		} else {
			v.skip("answer", fmt.Sprintf("%s %s PTR", ip, reverse), "the Corefile (%s) has no server block that answers %s on %s", v.confPath, reverse, ip)
		}
		for _, name := range append([]string{v.external}, v.stubs...) {
			v.answeredIfServed(ctx, ip, name)
		}
	}
}

// answeredIfServed asks ip for name (the external name or a stub domain) where the Corefile serves it.
func (v *verifier) answeredIfServed(ctx context.Context, ip netip.Addr, name string) {
	what := "stub domain"
	if name == v.external {
		what = "external"
	}
	server, ok := v.serverFor(ip, name)
	if !ok {
		v.skip("answer", fmt.Sprintf("%s %s A", ip, dns.Fqdn(name)), "%s: the Corefile (%s) has no server block that answers it on %s", what, v.confPath, ip)
		return
	}
	v.answered(ctx, server, what, name, dns.TypeA, false)
}

// addViaUpstream adds an answer row for a name the cache asked of server gets from the cluster DNS upstream.
func (v *verifier) addViaUpstream(server netip.Addr, target string, ok bool, format string, args ...any) {
	v.add("answer", target, ok, format, args...)
	r := &v.results[len(v.results)-1]
	r.viaUpstream, r.server = true, server
}

// answered checks that name gets an answer from upstream: NOERROR or NXDOMAIN, not SERVFAIL or REFUSED.
// viaUpstream says that the upstream is the cluster DNS.
func (v *verifier) answered(ctx context.Context, server netip.AddrPort, what, name string, qtype uint16, viaUpstream bool) {
	target := fmt.Sprintf("%s %s %s", server.Addr(), dns.Fqdn(name), dns.TypeToString[qtype])
	add := v.add
	if viaUpstream {
		add = func(_, target string, ok bool, format string, args ...any) {
			v.addViaUpstream(server.Addr(), target, ok, format, args...)
		}
	}
	r, err := v.lookup(ctx, "udp", server, name, qtype)
	switch {
	case err != nil:
		add("answer", target, false, "%s: %v", what, err)
	case r.Rcode != dns.RcodeSuccess && r.Rcode != dns.RcodeNameError:
		add("answer", target, false, "%s: %s", what, dns.RcodeToString[r.Rcode])
	default:
		detail := strings.Join(answers(r, qtype), ", ")
		if detail == "" {
			detail = dns.RcodeToString[r.Rcode] + ", no records"
		}
		add("answer", target, true, "%s: %s", what, detail)
	}
}

// lookup sends one query to server, recording the flows of UDP queries for the conntrack check.
func (v *verifier) lookup(ctx context.Context, network string, server netip.AddrPort, name string, qtype uint16) (*dns.Msg, error) {
	ctx, cancel := context.WithTimeout(ctx, v.timeout)
	defer cancel()
	var (
		conn      net.Conn
		flow      udpFlow
		checkable bool
		err       error
	)
	if network == "udp" {
		conn, flow, checkable, err = v.dialUDP(ctx, server)
	} else {
		var d net.Dialer
		conn, err = d.DialContext(ctx, network, server.String())
	}
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	m.SetEdns0(1232, false)
	c := &dns.Client{Net: network, Timeout: v.timeout}
	r, _, err := c.ExchangeWithConnContext(ctx, m, &dns.Conn{Conn: conn})
	if err == nil {
		v.answeredOn[server.Addr()] = true
		if network == "udp" {
			// An answered lookup went through the whole path, both ways: it is the one conntrack must not know.
			v.recordUDPLookup(flow, checkable)
		}
	}
	return r, err
}

func answers(r *dns.Msg, qtype uint16) []string {
	var out []string
	for _, rr := range r.Answer {
		if rr.Header().Rrtype != qtype {
			continue
		}
		switch rr := rr.(type) {
		case *dns.A:
			out = append(out, rr.A.String())
		case *dns.AAAA:
			out = append(out, rr.AAAA.String())
		case *dns.PTR:
			out = append(out, rr.Ptr)
		default:
			out = append(out, strings.TrimPrefix(rr.String(), rr.Header().String()))
		}
	}
	return out
}

// checkHTTP checks that the plugin called what (health, ready) answers path with 200 OK where the Corefile
// has it listen; skipped when the Corefile has no such plugin. flagPort on the first local address is used
// when it is given explicitly (flagSet) or the Corefile could not be read.
func (v *verifier) checkHTTP(ctx context.Context, what, path string, defaultPort, flagPort uint16, flagSet bool) {
	var addr string
	switch {
	case flagSet || v.served == nil:
		addr = netip.AddrPortFrom(v.listen[0], flagPort).String()
	default:
		a, ok := v.served.ListenAddress(what, ":"+strconv.Itoa(int(defaultPort)), v.listen[0])
		if !ok {
			v.skip(what, path, "the Corefile (%s) has no %s plugin, so nothing serves %s", v.confPath, what, path)
			return
		}
		addr = a
	}
	url := "http://" + addr + path
	ctx, cancel := context.WithTimeout(ctx, v.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		v.add(what, url, false, "%v", err)
		return
	}
	// No proxy from the environment: the address is on this node.
	client := &http.Client{Transport: &http.Transport{Proxy: nil}}
	resp, err := client.Do(req)
	if err != nil {
		v.add(what, url, false, "%v", err)
		return
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	v.add(what, url, resp.StatusCode == http.StatusOK, "%s %s", resp.Status, strings.TrimSpace(string(body)))
}
