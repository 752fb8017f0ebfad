//go:build linux

package nodelocal

import (
	"context"
	"errors"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/netnstest"
	"github.com/nodelocaldns/nodelocaldns/internal/privtest"
	"github.com/nodelocaldns/nodelocaldns/nodelocal/internal/rules"
)

// TestBackendWaitsForKubeProxy: on a node with no kube-proxy rules, backend auto writes no rules and says
// why; kube-proxy's nftables table showing up during the wait decides, and a node that stays without
// kube-proxy rules gets the fallback once the wait is over.
func TestBackendWaitsForKubeProxy(t *testing.T) {
	privtest.RequirePrivileged(t, append([]string{"ip", "nft"}, privtest.IptablesCommands(string(rules.NFT))...)...)
	for _, kubeProxyArrives := range []bool{true, false} {
		name := "kube-proxy_never_comes"
		if kubeProxyArrives {
			name = "kube-proxy_arrives"
		}
		t.Run(name, func(t *testing.T) {
			if !netnstest.Run(t) {
				return
			}
			log := &recLog{t: t}
			const wait = 2 * time.Second
			r, err := New(Config{Backend: "auto", BackendWait: wait, LockPath: filepath.Join(t.TempDir(), "lock"), Logger: log})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			ctx := context.Background()
			lease, err := r.Acquire(ctx, Claim{Addresses: []netip.Addr{addrA}, DeferRules: true})
			if err != nil {
				t.Fatal(err)
			}
			err = lease.EnableRules(ctx)
			var none *rules.NoKubeProxyRulesError
			if !errors.As(err, &none) || KindOf(err) != KindIPTables {
				t.Fatalf("EnableRules with no kube-proxy rules = %v, want a NoKubeProxyRulesError of kind iptables", err)
			}
			if st := r.Status(); st.RulesPresent || st.Backend != "" {
				t.Fatalf("status while waiting: %+v", st)
			}
			if kubeProxyArrives {
				run(t, "nft", "add", "table", "ip", "kube-proxy")
			} else {
				time.Sleep(wait) // the product waits this long; the test only lets it
			}
			if err := r.Ensure(ctx); err != nil {
				t.Fatal(err)
			}
			st := r.Status()
			want := "nft"
			if kubeProxyArrives {
				want = "nftables"
			}
			if !st.RulesPresent || st.Backend != want {
				t.Fatalf("after the wait: backend %q (%s), rules present %v; want %s", st.Backend, st.BackendReason, st.RulesPresent, want)
			}
			if !kubeProxyArrives && (!strings.Contains(st.BackendReason, "fallback") || log.count("falling back to nft") != 1) {
				t.Errorf("the fallback is not said: reason %q", st.BackendReason)
			}
			if log.count("waiting up to") != 1 {
				t.Errorf("the wait was not logged once")
			}
			if err := r.Teardown(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}
