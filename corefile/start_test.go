package corefile

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	_ "github.com/nodelocaldns/nodelocaldns/plugin/clamp"
	_ "github.com/nodelocaldns/nodelocaldns/plugin/notrack"
	_ "github.com/nodelocaldns/nodelocaldns/plugin/upstreamsvc"
	_ "github.com/nodelocaldns/nodelocaldns/plugin/wirecache"
)

// startCases are the rendered Corefiles that must start in a real CoreDNS server: every golden, and
// upstream's template expanded by node-cache's flags.
func startCases(t *testing.T) map[string][]byte {
	cases := map[string][]byte{}
	for name := range goldenConfigs {
		cases[name] = readTestdata(t, name+".golden")
	}
	cases["upstream-template"] = readTestdata(t, "upstream-template.golden")
	cases["upstream-template-kubedns"] = readTestdata(t, "upstream-template-kubedns.golden")
	// The same without notrack, as with node-cache's -setupinterface=false -setupiptables=false.
	e := upstreamFlags()
	e.Notrack = nil
	applied := upstreamManifestSed(readTestdata(t, "upstream-template.Corefile"), "169.254.20.10", "cluster.local", "10.96.0.10")
	out, err := Expand(applied, e, KubeDNS{StubDomains: map[string][]string{"acme.local": {"10.0.0.53"}}})
	if err != nil {
		t.Fatal(err)
	}
	cases["upstream-template-without-notrack"] = out
	return cases
}

// TestCorefilesStart moves every rendered Corefile to loopback (addresses, ports, upstreams; nothing else
// changes), starts CoreDNS on it, and sends each block a query that must reach the upstream.
func TestCorefilesStart(t *testing.T) {
	for name, corefile := range startCases(t) {
		t.Run(name, func(t *testing.T) {
			f, err := Parse(corefile)
			if err != nil {
				t.Fatal(err)
			}
			if missing := missingPlugins(f); len(missing) > 0 {
				t.Fatalf("plugins not compiled into this test: %s", strings.Join(missing, ", "))
			}
			startAndProbe(t, f)
		})
	}
}

func startAndProbe(t *testing.T, f *File) {
	t.Helper()
	up := newRecordingUpstream(t)
	lb := toLoopback(t, f, up.addr)
	startCoreDNS(t, lb.file.Format())
	for _, b := range lb.file.Blocks {
		zone, _, _ := splitKey(b.Keys[0])
		name, qtype := probeName(zone)
		r := exchange(t, lb.dns, name, qtype)
		if !up.saw(name) {
			t.Errorf("block %s: %s did not reach the upstream (rcode %s)", b.Keys[0], name, dns.RcodeToString[r.Rcode])
		}
	}
	for _, path := range lb.http {
		waitHTTP200(t, path)
	}
}

func missingPlugins(f *File) []string {
	var missing []string
	for _, b := range f.Blocks {
		for _, d := range b.Directives {
			if !registeredPlugin(d.Name) && !slices.Contains(missing, d.Name) {
				missing = append(missing, d.Name)
			}
		}
	}
	slices.Sort(missing)
	return missing
}

func probeName(zone string) (string, uint16) {
	switch zone {
	case "in-addr.arpa":
		return "10.0.96.10.in-addr.arpa.", dns.TypePTR
	case "ip6.arpa":
		return "a.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.6.9.0.0.0.1.0.0.0.0.d.f.ip6.arpa.", dns.TypePTR
	case ".":
		return "www.example.com.", dns.TypeA
	}
	return "kubernetes.default.svc." + zone + ".", dns.TypeA
}

type loopback struct {
	file *File
	dns  string   // where the DNS blocks listen
	http []string // health and ready URLs
}

// toLoopback rewrites the addresses of a node-cache Corefile to loopback ones: binds to 127.0.0.1 (::1 for
// IPv6), every block to one free port, health, ready and prometheus to free ports, every upstream to up.
func toLoopback(t *testing.T, f *File, up string) loopback {
	t.Helper()
	port := freePort(t)
	lockDir := t.TempDir()
	lb := loopback{file: f}
	httpPorts := map[string]string{}
	loFor := func(addr string) string {
		if ip, err := netip.ParseAddr(strings.Trim(addr, "[]")); err == nil && ip.Is6() {
			return "::1"
		}
		return "127.0.0.1"
	}
	for _, b := range f.Blocks {
		for i, k := range b.Keys {
			zone, _, _ := splitKey(k)
			b.Keys[i] = zone + ":" + port
		}
		for _, d := range b.Directives {
			switch d.Name {
			case "bind":
				var args []string
				for _, a := range d.Args {
					if lo := loFor(a); !slices.Contains(args, lo) {
						args = append(args, lo)
					}
				}
				d.Args = args
				if lb.dns == "" {
					lb.dns = net.JoinHostPort(args[0], port)
				}
			case "notrack":
				// Unprivileged: the plugin parses and sets up, but leaves links and rules alone; the node lock is
				// this test's own, so that tests running beside it do not take each other for a second cache.
				d.Block = append(d.Block, &Directive{Name: "no_interface"}, &Directive{Name: "no_rules"},
					&Directive{Name: "lock", Args: []string{filepath.Join(lockDir, "nodelocaldns.lock")}})
			case "health", "ready", "prometheus":
				host, _, err := net.SplitHostPort(d.Args[0])
				if err != nil {
					t.Fatalf("line %d: %v", d.Line, err)
				}
				addr, ok := httpPorts[d.Name]
				if !ok {
					addr = net.JoinHostPort(loFor(host), freePort(t))
					httpPorts[d.Name] = addr
					if d.Name != "prometheus" {
						lb.http = append(lb.http, "http://"+addr+"/"+d.Name)
					}
				}
				d.Args = []string{addr}
			case "forward":
				d.Args = []string{".", up}
			case "upstreamsvc":
				d.Block = slices.DeleteFunc(d.Block, func(o *Directive) bool { return o.Name == "fallback" })
				d.Block = append(d.Block, &Directive{Name: "fallback", Args: []string{up}})
			}
		}
	}
	return lb
}

type recordingUpstream struct {
	addr string
	mu   sync.Mutex
	seen map[string]bool
}

func newRecordingUpstream(t *testing.T) *recordingUpstream {
	u := &recordingUpstream{seen: map[string]bool{}}
	u.addr = fakeUpstream(t, func(w dns.ResponseWriter, r *dns.Msg) {
		u.mu.Lock()
		u.seen[strings.ToLower(r.Question[0].Name)] = true
		u.mu.Unlock()
		answerEverything(w, r)
	})
	return u
}

func (u *recordingUpstream) saw(name string) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.seen[strings.ToLower(name)]
}

// waitHTTP200 polls url until it answers 200, for up to 30 s: a failure bound for a busy machine.
func waitHTTP200(t *testing.T, url string) {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second}
	var last string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		resp, err := client.Get(url)
		if err != nil {
			last = err.Error()
			continue
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			return
		}
		last = fmt.Sprintf("status %d", resp.StatusCode)
	}
	t.Errorf("%s: not 200 within 30s (%s)", url, last)
}
