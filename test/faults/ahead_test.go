//go:build linux

package faults

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/test/simnode"
)

// foreignAccept is another component's raw-table ACCEPT for TCP, as in kubernetes-sigs/node-local-dns#13,
// and how the cache names it.
var (
	foreignAccept     = []string{"-p", "tcp", "-m", "comment", "--comment", "other component", "-j", "ACCEPT"}
	foreignAcceptText = `IPv4 raw/PREROUTING rule 1 (-A PREROUTING -p tcp -m comment --comment "other component" -j ACCEPT)`
)

// TestForeignRuleAheadOfNotrack: another component inserts a raw-table ACCEPT above the cache's jump in
// PREROUTING, with each iptables flavour. Within one repair period (sync 1s) the cache logs the rule by
// family, table, chain, position and text, counts it in coredns_nodecache_rules_ahead_total, and has its
// jump first again, with the foreign rule right below it; TCP lookups to the kube-dns ClusterIP are
// answered. Inserted again, it is noticed again.
func TestForeignRuleAheadOfNotrack(t *testing.T) {
	for _, backend := range []string{"nft", "legacy"} {
		t.Run(backend, func(t *testing.T) {
			r := newRig(t, backend)
			r.startCache()
			series := `{chain="PREROUTING",family="IPv4",table="raw"}`
			if v, err := r.scrape(cacheMetrics, "coredns_nodecache_rules_ahead_total", series); err == nil && v != 0 {
				t.Fatalf("rules_ahead_total is %v before any foreign rule", v)
			}
			for round := 1; round <= 2; round++ {
				r.mustIpt(append([]string{"-t", "raw", "-I", "PREROUTING", "1"}, foreignAccept...)...)
				took := r.waitFor("the foreign rule noticed and the jump first again", eventually, func() bool {
					v, err := r.scrape(cacheMetrics, "coredns_nodecache_rules_ahead_total", series)
					return err == nil && v == float64(round) && r.jumps()
				})
				t.Logf("round %d: noticed and repaired in %v", round, took.Round(time.Millisecond))
				r.waitLog(r.cache, foreignAcceptText+" was ahead of the jump", round, eventually)
				if out := r.mustIpt("-t", "raw", "-S", "PREROUTING", "2"); !strings.Contains(out, "other component") {
					t.Errorf("round %d: the foreign rule is not right below the cache's jump: %s", round, out)
				}
				if err := r.podTCPQuery(kubeDNS); err != nil {
					t.Errorf("round %d: TCP lookup of the kube-dns ClusterIP after the repair: %v", round, err)
				}
			}
		})
	}
}

// TestForeignRuleAheadNamedByVerifyAndPreflight: with the cache's repair loop slowed to an hour, a
// foreign ACCEPT above the jump stays there: -verify's raw rules row fails and names it, -preflight reports
// it as an error, by family, table, chain, position and text.
func TestForeignRuleAheadNamedByVerifyAndPreflight(t *testing.T) {
	r := newRig(t, "nft")
	r.writeCorefile(strings.Replace(r.corefile(53), "sync 1s", "sync 1h", 1))
	r.startCache()
	verify := func() string {
		out, _ := r.n.In(context.Background(), r.n.NodeNS, r.bin, "-verify", "-localip", simnode.LinkLocalIP+","+simnode.KubeDNSClusterIP,
			"-conf", r.conf, "-guard.backend", "nft", "-verify.timeout", "1s")
		return out
	}
	rawRow := func(out string) string {
		for l := range strings.SplitSeq(out, "\n") {
			if strings.HasPrefix(l, "rules ") && strings.Contains(l, "IPv4 raw/NODELOCALDNS") {
				return l
			}
		}
		return ""
	}
	out := verify()
	if row := rawRow(out); !strings.Contains(row, " ok ") {
		t.Fatalf("raw rules row on the healthy node: %q\n%s", row, out)
	}

	r.mustIpt(append([]string{"-t", "raw", "-I", "PREROUTING", "1"}, foreignAccept...)...)
	out = verify()
	t.Logf("-verify with the foreign rule ahead:\n%s", out)
	if row := rawRow(out); !strings.Contains(row, " FAIL ") || !strings.Contains(row, foreignAcceptText+" is ahead of the jump from PREROUTING") {
		t.Errorf("raw rules row: %q, want FAIL naming %s", row, foreignAcceptText)
	}

	pre, err := r.n.In(context.Background(), r.n.NodeNS, r.bin, "-preflight", "-localip", simnode.LinkLocalIP+","+simnode.KubeDNSClusterIP, "-guard.backend", "nft")
	t.Logf("-preflight with the foreign rule ahead:\n%s", pre)
	if err == nil || !strings.Contains(pre, "[error] rules ahead: iptables-nft "+foreignAcceptText+" is ahead of the cache's jump to NODELOCALDNS") {
		t.Errorf("-preflight: %v, want an error naming %s", err, foreignAcceptText)
	}
}

// podTCPQuery asks server for kubernetes.default.svc.cluster.local over TCP from the Pod namespace.
func (r *rig) podTCPQuery(server string) error {
	return r.n.Do(r.n.PodNS, func() error {
		c := &dns.Client{Net: "tcp", Timeout: clientTimeout}
		m := new(dns.Msg)
		m.SetQuestion("kubernetes.default.svc.cluster.local.", dns.TypeA)
		resp, _, err := c.Exchange(m, server)
		if err != nil {
			return err
		}
		if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 {
			return &net.DNSError{Err: "unexpected answer: " + resp.String(), Name: m.Question[0].Name}
		}
		return nil
	})
}

// TestNFTablesAcceptAtAnEarlierPriority: kube-proxy in nftables mode, the cache on the nftables backend, and
// another table's base chains at priority -400 (before the cache's raw-priority chains) that accept DNS
// traffic. In nftables an accept ends only its own base chain: the packet still meets the cache's notrack,
// so Pod lookups over UDP and TCP to both addresses are answered and none is tracked, and the cache counts
// no rule ahead. The iptables case above has no nftables counterpart.
func TestNFTablesAcceptAtAnEarlierPriority(t *testing.T) {
	r := newNFTablesRig(t)
	r.startCache()
	other := `table inet other {
	chain pre { type filter hook prerouting priority -400; policy accept; meta l4proto { tcp, udp } th dport 53 counter accept; }
	chain out { type filter hook output priority -400; policy accept; meta l4proto { tcp, udp } th sport 53 counter accept; }
}
`
	if out, err := r.n.InWithInput(context.Background(), r.n.NodeNS, other, "nft", "-f", "-"); err != nil {
		t.Fatalf("nft -f: %v: %s", err, out)
	}
	t.Cleanup(func() { _, _ = r.nft("delete", "table", "inet", "other") })
	if err := r.n.FlushConntrack(); err != nil {
		t.Fatal(err)
	}
	for _, server := range []string{kubeDNS, linkLocal} {
		for range 3 {
			if err := r.podQuery(server); err != nil {
				t.Errorf("UDP %s: %v", server, err)
			}
			if err := r.podTCPQuery(server); err != nil {
				t.Errorf("TCP %s: %v", server, err)
			}
		}
		host, _, _ := net.SplitHostPort(server)
		for _, proto := range []string{"udp", "tcp"} {
			entries, err := r.n.ConntrackEntries(proto, host)
			if err != nil {
				t.Fatal(err)
			}
			if len(entries) != 0 {
				t.Errorf("%s lookups to %s are tracked past the other table's accept:\n%s", proto, server, strings.Join(entries, "\n"))
			}
		}
	}
	// The lookups did meet the other table's accepts first.
	if out, err := r.nft("list", "chain", "inet", "other", "pre"); err != nil || strings.Contains(out, "counter packets 0 ") {
		t.Errorf("the other table's prerouting accept saw no lookup (%v):\n%s", err, out)
	}
	if v, err := r.scrape(cacheMetrics, "coredns_nodecache_rules_ahead_total", ""); err == nil && v != 0 {
		t.Errorf("rules_ahead_total %v: the nftables backend has no rules ahead to count", v)
	}
}
