//go:build linux

package faults

import (
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/test/simnode"
)

// zoneWithoutWeb is simnode.ClusterZone as a cluster DNS that restarted unsynced answers it: web.default.svc
// has lost its A record (an A query is answered empty) and kube-dns.kube-system.svc is gone (NXDOMAIN).
var zoneWithoutWeb = strings.NewReplacer(
	"web.default.svc            3600 IN A   10.244.2.7\n", "",
	"kube-dns.kube-system.svc   3600 IN A   10.96.0.10\n", "",
).Replace(simnode.ClusterZone)

// TestLastKnownGood (kubernetes/dns#747): the cluster DNS restarts and answers NXDOMAIN, or nothing, for
// names that exist. The node cache runs the cluster block as the shipped Corefile has it (wirecache, clamp
// and cache with serve_stale, TTLs capped at 5 s so that its answers expire within the test), and Pods ask
// the kube-dns ClusterIP. With prefer_positive (the cache's serve_stale_policy and wirecache's
// serve_stale option, as -servestalepolicy prefer_positive writes them), once the cache has asked the
// restarted cluster DNS for each name, Pods keep getting the last address, with a TTL of at most 5 s;
// without, they get the denial.
func TestLastKnownGood(t *testing.T) {
	for _, prefer := range []bool{true, false} {
		t.Run(map[bool]string{true: "prefer_positive", false: "default"}[prefer], func(t *testing.T) {
			testLastKnownGood(t, prefer)
		})
	}
}

func testLastKnownGood(t *testing.T, prefer bool) {
	r := newRig(t, "nft")
	wirePolicy, cachePolicy := "", ""
	if prefer {
		wirePolicy, cachePolicy = " prefer_positive", "\n        serve_stale_policy prefer_positive"
	}
	r.writeCorefile(fmt.Sprintf(`cluster.local:53 {
    bind %[1]s
    notrack {
        sync 1s
        backend nft
        lock %[2]s
    }
    prometheus %[3]s
    errors
    wirecache {
        serve_stale 1h 5s%[4]s
    }
    clamp {
        success 5 5
        denial 5 5
    }
    cache {
        success 9984 5
        denial 9984 5
        serve_stale 1h verify 1s 5s%[5]s
    }
    forward . %[6]s:53 {
        force_tcp
    }
}
`, strings.Join(r.listen, " "), filepath.Join(r.dir, "nodelocaldns.lock"), cacheMetrics, wirePolicy, cachePolicy, simnode.UpstreamClusterIP))
	r.startCache()

	names := map[string]int{"web.default.svc.cluster.local.": dns.RcodeSuccess, "kube-dns.kube-system.svc.cluster.local.": dns.RcodeNameError}
	want := map[string]string{"web.default.svc.cluster.local.": "10.244.2.7", "kube-dns.kube-system.svc.cluster.local.": "10.96.0.10"}
	for name := range names {
		for range 2 { // the second ask is a hit: both caches hold the name
			if m, err := r.podLookup(name); err != nil || len(m.Answer) != 1 {
				t.Fatalf("%s before the restart: %v, %v", name, m, err)
			}
		}
	}

	// The cluster DNS restarts without the records.
	kill(t, r.clusterDNS, syscall.SIGTERM)
	_ = r.clusterDNS.Wait(10 * time.Second)
	restarted := r.n.StartClusterDNSZone(r.bin, zoneWithoutWeb)
	r.clusterDNS = restarted

	for name, rcode := range names {
		var m *dns.Msg
		var err error
		// Ask until the restarted cluster DNS has been asked for the name: the cache's entry expired and it
		// refreshed it there. The answer to that ask, and the next, are what Pods get.
		asked := func() bool { return strings.Contains(restarted.Output(), " \"A IN "+name) }
		for deadline := time.Now().Add(eventually); !asked(); time.Sleep(200 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: the restarted cluster DNS was never asked:\n%s", name, restarted.Output())
			}
			m, err = r.podLookup(name)
		}
		for i := range 3 {
			if i > 0 {
				time.Sleep(100 * time.Millisecond)
				m, err = r.podLookup(name)
			}
			switch {
			case err != nil:
				t.Errorf("%s (answer %d): %v", name, i, err)
			case prefer && (m.Rcode != dns.RcodeSuccess || len(m.Answer) != 1 || !strings.HasSuffix(m.Answer[0].String(), want[name])):
				t.Errorf("%s (answer %d) after the cluster DNS turned it %s: %v, want the last address %s", name, i, dns.RcodeToString[rcode], m, want[name])
			case prefer && (m.Answer[0].Header().Ttl == 0 || m.Answer[0].Header().Ttl > 5):
				t.Errorf("%s (answer %d): TTL %d, want 1 to 5 s", name, i, m.Answer[0].Header().Ttl)
			case !prefer && (m.Rcode != rcode || len(m.Answer) != 0):
				t.Errorf("%s (answer %d) after the cluster DNS turned it %s: %v, want that denial", name, i, dns.RcodeToString[rcode], m)
			}
		}
	}
}

// podLookup asks the kube-dns ClusterIP for name's A records from the Pod namespace over UDP.
func (r *rig) podLookup(name string) (*dns.Msg, error) {
	var m *dns.Msg
	err := r.n.Do(r.n.PodNS, func() error {
		c := &dns.Client{Net: "udp", Timeout: clientTimeout}
		q := new(dns.Msg)
		q.SetQuestion(name, dns.TypeA)
		var err error
		m, _, err = c.Exchange(q, kubeDNS)
		return err
	})
	return m, err
}
