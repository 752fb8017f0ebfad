//go:build linux

package preflight

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/nodelocaldns/nodelocaldns/nodelocal"
	"github.com/nodelocaldns/nodelocaldns/nodelocal/internal/link"
	"github.com/nodelocaldns/nodelocaldns/nodelocal/internal/rules"
)

// preflightFiles writes a healthy node's files into a temporary directory and returns a config that
// reads them.
func preflightFiles(t *testing.T) Config {
	t.Helper()
	dir := t.TempDir()
	cfg := Config{
		Addresses:     []netip.Addr{addrA, clusterIP},
		ResolvConf:    filepath.Join(dir, "resolv.conf"),
		XtablesLock:   filepath.Join(dir, "xtables.lock"),
		ProcStatus:    filepath.Join(dir, "status"),
		KubeletConfig: filepath.Join(dir, "kubelet.yaml"),
	}
	write(t, cfg.ResolvConf, "search example.org\nnameserver 192.0.2.53\n")
	write(t, cfg.XtablesLock, "")
	write(t, cfg.ProcStatus, "Name:\tnode-cache\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\n")
	return cfg
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// only returns the findings of check, and fails the test unless there is exactly one with severity sev
// whose message contains want.
func expectFinding(t *testing.T, fs []Finding, check string, sev Severity, want string) {
	t.Helper()
	var of []Finding
	for _, f := range fs {
		if f.Check == check {
			of = append(of, f)
		}
	}
	if len(of) != 1 || of[0].Severity != sev || !strings.Contains(of[0].Message, want) {
		t.Errorf("%s: got %v, want one %s finding saying %q", check, of, sev, want)
	}
	if len(of) == 1 && sev != SeverityOK && of[0].Fix == "" {
		t.Errorf("%s: %s without a fix", check, sev)
	}
}

func TestPreflightOnAHealthyNode(t *testing.T) {
	inNamespaceNFT(t, func(t *testing.T, e *env) {
		cfg := preflightFiles(t)
		e.restore(rules.IPv4, "*nat\n:KUBE-SERVICES - [0:0]\n-A PREROUTING -j KUBE-SERVICES\nCOMMIT\n")
		fs := Run(context.Background(), cfg)
		for _, f := range fs {
			t.Log(f)
		}
		if HasErrors(fs) {
			t.Error("errors on a healthy node")
		}
		expectFinding(t, fs, "kube-proxy mode", SeverityOK, "KUBE-SERVICES in iptables-nft")
		expectFinding(t, fs, "local addresses", SeverityOK, "on no other link")
		expectFinding(t, fs, "rules backend", SeverityOK, "kube-proxy's rules are in iptables-nft")
		expectFinding(t, fs, "other node cache", SeverityOK, "no upstream")
		expectFinding(t, fs, "resolv.conf", SeverityOK, "192.0.2.53")
		expectFinding(t, fs, "capabilities", SeverityOK, "NET_ADMIN")
		expectFinding(t, fs, "xtables lock", SeverityOK, "exists")

		// Configured for the other backend than kube-proxy's.
		cfg.Backend = "legacy"
		expectFinding(t, Run(context.Background(), cfg), "rules backend", SeverityError, "configured for legacy")
	})
}

func TestPreflightKubeProxyModes(t *testing.T) {
	inNamespaceNFT(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		cfg := preflightFiles(t)
		expectFinding(t, Run(ctx, cfg), "kube-proxy mode", SeverityWarning, "no kube-proxy rules")

		expectFinding(t, Run(ctx, cfg), "rules backend", SeverityWarning, "no kube-proxy rules in iptables or nftables yet")

		run(t, "nft", "add", "table", "ip", "kube-proxy")
		fs := Run(ctx, cfg)
		expectFinding(t, fs, "kube-proxy mode", SeverityOK, "nftables (table ip kube-proxy)")
		expectFinding(t, fs, "rules backend", SeverityOK, "kube-proxy runs in nftables mode (table ip kube-proxy); the cache uses nftables")
		legacy := cfg
		legacy.Backend = "legacy"
		expectFinding(t, Run(ctx, legacy), "rules backend", SeverityWarning, "configured for iptables-legacy")
		e.restore(rules.IPv4, "*nat\n:KUBE-SERVICES - [0:0]\nCOMMIT\n")
		expectFinding(t, Run(ctx, cfg), "rules backend", SeverityError, "both in nftables (table ip kube-proxy) and in iptables-nft")
		e.restore(rules.IPv4, "*nat\n-X KUBE-SERVICES\nCOMMIT\n")
		run(t, "nft", "delete", "table", "ip", "kube-proxy")

		// IPVS: kube-ipvs0 holds the ClusterIP.
		run(t, "ip", "link", "add", IPVSInterface, "type", "bridge")
		run(t, "ip", "addr", "add", "10.96.0.10/32", "dev", IPVSInterface)
		fs = Run(ctx, cfg)
		expectFinding(t, fs, "kube-proxy mode", SeverityError, "IPVS: kube-ipvs0 holds [10.96.0.10]")
		expectFinding(t, fs, "local addresses", SeverityOK, "on no other link")

		// IPVS with the link-local address only: kubelet's clusterDNS decides, and before the rollout it
		// rightly names the kube-dns ClusterIP: guidance in the safe order, not an error.
		cfg.Addresses = []netip.Addr{addrA}
		expectFinding(t, Run(ctx, cfg), "kube-proxy mode", SeverityWarning, "could not read kubelet's configuration")
		write(t, cfg.KubeletConfig, "kind: KubeletConfiguration\nclusterDNS:\n- 10.96.0.10\nclusterDomain: cluster.local\n")
		fs = Run(ctx, cfg)
		expectFinding(t, fs, "kube-proxy mode", SeverityWarning, "clusterDNS is [10.96.0.10], the kube-dns ClusterIP on kube-ipvs0")
		if HasErrors(fs) {
			t.Errorf("errors on an IPVS node before the rollout: %v", fs)
		}
		for _, f := range fs {
			cache, kubelet := strings.Index(f.Fix, "roll out the cache first"), strings.Index(f.Fix, "set kubelet's clusterDNS to 169.254.20.10")
			if f.Check == "kube-proxy mode" && (cache < 0 || kubelet < cache) {
				t.Errorf("fix %q does not say cache first, then kubelet", f.Fix)
			}
		}
		write(t, cfg.KubeletConfig, "kind: KubeletConfiguration\nclusterDNS:\n- 192.0.2.10\n")
		expectFinding(t, Run(ctx, cfg), "kube-proxy mode", SeverityWarning, "neither one of the cache's addresses nor a ClusterIP")
		write(t, cfg.KubeletConfig, "kind: KubeletConfiguration\nclusterDNS: [\"169.254.20.10\"]\n")
		expectFinding(t, Run(ctx, cfg), "kube-proxy mode", SeverityOK, "IPVS; kubelet's clusterDNS is [169.254.20.10]")
		write(t, cfg.KubeletConfig, "clusterDNS: [169.254.20.10\n")
		expectFinding(t, Run(ctx, cfg), "kube-proxy mode", SeverityWarning, "could not parse kubelet's configuration")
	})
}

func TestPreflightAddressesInUse(t *testing.T) {
	inNamespaceNFT(t, func(t *testing.T, _ *env) {
		ctx := context.Background()
		cfg := preflightFiles(t)
		run(t, "ip", "link", "add", "other0", "type", "bridge")
		run(t, "ip", "link", "set", "other0", "up")
		run(t, "ip", "route", "add", "169.254.0.0/16", "dev", "other0")
		expectFinding(t, Run(ctx, cfg), "local addresses", SeverityWarning, "169.254.20.10 is inside route 169.254.0.0/16 dev other0")
		run(t, "ip", "route", "del", "169.254.0.0/16", "dev", "other0")
		run(t, "ip", "addr", "add", "10.96.0.10/32", "dev", "other0")
		expectFinding(t, Run(ctx, cfg), "local addresses", SeverityError, "10.96.0.10 is already on link other0")
	})
}

func TestPreflightForeignCache(t *testing.T) {
	inNamespace(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		cfg := preflightFiles(t)
		// Our own link from an earlier run is fine.
		m, err := link.New(link.Options{Name: nodelocal.DefaultInterface})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m.Ensure(ctx, []netip.Addr{addrA}); err != nil {
			t.Fatal(err)
		}
		expectFinding(t, Run(ctx, cfg), "other node cache", SeverityOK, "no upstream")
		if err := m.Teardown(ctx); err != nil {
			t.Fatal(err)
		}
		// Upstream's node-cache creates the link without our alias.
		run(t, "ip", "link", "add", nodelocal.DefaultInterface, "type", "bridge")
		expectFinding(t, Run(ctx, cfg), "other node cache", SeverityError, "was not created by nodelocaldns")
		run(t, "ip", "link", "del", nodelocal.DefaultInterface)
		// And comments its rules so.
		e.restore(rules.IPv4, "*raw\n-A PREROUTING -d 169.254.20.10/32 -p udp -m udp --dport 53 -m comment --comment \"NodeLocal DNS Cache: skip conntrack\" -j NOTRACK\nCOMMIT\n")
		expectFinding(t, Run(ctx, cfg), "other node cache", SeverityError, "iptables-"+string(e.mode)+" holds rules commented")
	})
}

func TestPreflightFiles(t *testing.T) {
	inNamespaceNFT(t, func(t *testing.T, _ *env) {
		ctx := context.Background()
		cfg := preflightFiles(t)
		write(t, cfg.ResolvConf, "nameserver 192.0.2.53\nnameserver 169.254.20.10\n")
		expectFinding(t, Run(ctx, cfg), "resolv.conf", SeverityError, "forward to itself")
		write(t, cfg.ResolvConf, "search example.org\n")
		expectFinding(t, Run(ctx, cfg), "resolv.conf", SeverityWarning, "names no nameserver")

		write(t, cfg.ProcStatus, "CapEff:\t0000000000002000\n") // NET_RAW only
		expectFinding(t, Run(ctx, cfg), "capabilities", SeverityError, "missing NET_ADMIN")
		write(t, cfg.ProcStatus, "CapEff:\t0000000000000000\n")
		expectFinding(t, Run(ctx, cfg), "capabilities", SeverityError, "missing NET_ADMIN and NET_RAW")

		if err := os.Remove(cfg.XtablesLock); err != nil {
			t.Fatal(err)
		}
		expectFinding(t, Run(ctx, cfg), "xtables lock", SeverityWarning, "missing")
		cfg.Backend = "legacy"
		fs := Run(ctx, cfg)
		expectFinding(t, fs, "xtables lock", SeverityError, "the backend is legacy")
		if !HasErrors(fs) {
			t.Error("HasErrors is false")
		}
	})
}

// TestKubeletConfigurationClusterDNS reads clusterDNS in the forms kubelet's files take: block and flow
// lists, quoted, commented, indented, and JSON.
func TestKubeletConfigurationClusterDNS(t *testing.T) {
	for in, want := range map[string][]string{
		"clusterDNS:\n- 10.96.0.10\n- \"fd00::a\"\nclusterDomain: x\n":   {"10.96.0.10", "fd00::a"},
		"a: 1\nclusterDNS: [169.254.20.10, '10.96.0.10']\n":              {"169.254.20.10", "10.96.0.10"},
		"clusterDNS:\n  # a comment\n  - 169.254.20.10\n":                {"169.254.20.10"},
		"clusterDomain: cluster.local\n":                                 nil,
		`{"kind": "KubeletConfiguration", "clusterDNS": ["10.96.0.10"]}`: {"10.96.0.10"},
		"authentication:\n  x509:\n    clusterDNS: [192.0.2.1]\n":        nil, // not the top-level key
	} {
		var kc kubeletConfiguration
		if err := yaml.Unmarshal([]byte(in), &kc); err != nil {
			t.Errorf("%q: %v", in, err)
			continue
		}
		if !slices.Equal(kc.ClusterDNS, want) {
			t.Errorf("%q: %q, want %q", in, kc.ClusterDNS, want)
		}
	}
}

func TestCapEff(t *testing.T) {
	if v, err := capEff([]byte("CapPrm:\t0\nCapEff:\t0000000000003000\n")); err != nil || v != 0x3000 {
		t.Errorf("got %x, %v", v, err)
	}
	if _, err := capEff([]byte("Name: x\n")); err == nil {
		t.Error("no CapEff line passed")
	}
}

// TestPreflightRulesAhead: another component's raw-table ACCEPT (kubernetes-sigs/node-local-dns#13) is a
// warning, named by family, table, chain, position and text, while the cache's jump is not there yet, and an
// error once it sits ahead of the cache's jump.
func TestPreflightRulesAhead(t *testing.T) {
	inNamespace(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		cfg := preflightFiles(t)
		expectFinding(t, Run(ctx, cfg), "rules ahead", SeverityOK, "no rule of another's")

		e.restore(rules.IPv4, "*raw\n-A PREROUTING -p tcp -m comment --comment \"other component\" -j ACCEPT\nCOMMIT\n")
		expectFinding(t, Run(ctx, cfg), "rules ahead", SeverityWarning,
			`iptables-`+string(e.mode)+` IPv4 raw/PREROUTING rule 1 (-A PREROUTING -p tcp -m comment --comment "other component" -j ACCEPT) ends the table's walk`)

		b, err := rules.NewBackend(e.mode, "test")
		if err != nil {
			t.Fatal(err)
		}
		rs := rules.NodeCache(rules.IPv4, rules.NodeCacheSpec{Endpoints: rules.Endpoints(cfg.Addresses, 53, nil)})
		if _, err := rules.NewManager(b, rules.ManagerOptions{}).Sync(ctx, rs); err != nil {
			t.Fatal(err)
		}
		expectFinding(t, Run(ctx, cfg), "rules ahead", SeverityOK, "no rule of another's")
		e.restore(rules.IPv4, "*raw\n-I PREROUTING 1 -s 192.0.2.1/32 -j DROP\nCOMMIT\n")
		expectFinding(t, Run(ctx, cfg), "rules ahead", SeverityError,
			`iptables-`+string(e.mode)+` IPv4 raw/PREROUTING rule 1 (-A PREROUTING -s 192.0.2.1/32 -j DROP) is ahead of the cache's jump`)
	})
}
