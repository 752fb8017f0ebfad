//go:build linux

package rules

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"strings"
	"sync"

	"github.com/coreos/go-iptables/iptables"
)

// Mode is the backend the rules are written with: iptables on the legacy kernel tables, iptables-nft on
// nf_tables, or nftables tables of our own written over netlink. The cache's rules belong where kube-proxy's
// are: an iptables ACCEPT orders with kube-proxy's iptables rules only in the same flavour, and a node
// image for an nftables-mode cluster may have no iptables commands at all.
type Mode string

// The modes. Auto finds the one the node uses.
const (
	Auto     Mode = "auto"
	Legacy   Mode = "legacy"
	NFT      Mode = "nft"
	NFTables Mode = "nftables"
)

// ParseMode parses "auto" (or ""), "legacy", "nft" or "nftables".
func ParseMode(s string) (Mode, error) {
	switch m := Mode(strings.ToLower(strings.TrimSpace(s))); m {
	case "", Auto:
		return Auto, nil
	case Legacy, NFT, NFTables:
		return m, nil
	}
	return "", fmt.Errorf("unknown rules backend %q (want auto, legacy, nft or nftables)", s)
}

// Tools are the commands of one backend for one family.
type Tools struct {
	IPTables, Save, Restore string
	// Version is the iptables version, e.g. "1.8.9".
	Version string
}

// Backend is a chosen mode and the commands that drive it.
type Backend struct {
	// Mode is legacy or nft.
	Mode Mode
	// Reason says why this mode was chosen.
	Reason string

	run   runner
	mu    sync.Mutex
	tools map[Family]*Tools
}

// NewBackend returns the backend of a fixed mode (legacy, nft or nftables). The commands of an iptables
// mode are looked up on first use; nftables needs none.
func NewBackend(mode Mode, reason string) (*Backend, error) {
	if mode != Legacy && mode != NFT && mode != NFTables {
		return nil, fmt.Errorf("rules backend must be legacy, nft or nftables, not %q", mode)
	}
	return &Backend{Mode: mode, Reason: reason, run: execRunner{}, tools: map[Family]*Tools{}}, nil
}

// Select returns the backend of mode want; with Auto it finds the mode kube-proxy's rules live in. When
// the node has no kube-proxy rules yet (kube-proxy still starting, or a cluster without it) it returns a
// *NoKubeProxyRulesError that holds the backend it would fall back to: the caller decides whether to wait.
func Select(ctx context.Context, want Mode) (*Backend, error) {
	switch want {
	case Legacy, NFT, NFTables:
		return NewBackend(want, "configured")
	case Auto, "":
		mode, reason, err := detect(ctx, execRunner{}, NewNFTablesManager())
		if none, ok := errors.AsType[*NoKubeProxyRulesError](err); ok {
			b, berr := NewBackend(none.Fallback, none.Reason)
			if berr != nil {
				return nil, berr
			}
			none.Backend = b
			return nil, none
		}
		if err != nil {
			return nil, err
		}
		return NewBackend(mode, reason)
	}
	return nil, fmt.Errorf("unknown rules backend %q", want)
}

// NoKubeProxyRulesError says that the node holds no rules of kube-proxy in any backend, so that nothing
// tells where the cache's rules belong yet.
type NoKubeProxyRulesError struct {
	// Fallback is the mode the node's other rules suggest, and Reason why; Backend is that backend.
	Fallback Mode
	Reason   string
	Backend  *Backend
}

func (e *NoKubeProxyRulesError) Error() string {
	return fmt.Sprintf("no kube-proxy rules on the node yet (no table ip kube-proxy, no KUBE-SERVICES chain); %s would be the fallback (%s)", e.Fallback, e.Reason)
}

// Tools returns the commands for fam, looking them up the first time.
func (b *Backend) Tools(fam Family) (*Tools, error) {
	if b.Mode == NFTables {
		return nil, errors.New("the nftables backend runs no iptables commands")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if t, ok := b.tools[fam]; ok {
		return t, nil
	}
	t, err := findTools(b.run, b.Mode, fam)
	if err != nil {
		return nil, err
	}
	b.tools[fam] = t
	return t, nil
}

func commandPrefix(fam Family) string {
	if fam == IPv6 {
		return "ip6tables"
	}
	return "iptables"
}

// findTools prefers the commands named after the mode (iptables-nft, iptables-nft-save, ...) and falls back
// to the plain names when those run in the wanted mode, as on systems that ship one mode only.
func findTools(_ runner, mode Mode, fam Family) (*Tools, error) {
	prefix := commandPrefix(fam)
	named := [3]string{prefix + "-" + string(mode), prefix + "-" + string(mode) + "-save", prefix + "-" + string(mode) + "-restore"}
	plain := [3]string{prefix, prefix + "-save", prefix + "-restore"}
	var firstErr error
	for i, names := range [][3]string{named, plain} {
		paths, err := lookPaths(names)
		if err != nil {
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		version, gotMode, err := probeVersion(paths[0], fam)
		if err != nil {
			return nil, err
		}
		if i == 1 && gotMode != mode {
			return nil, fmt.Errorf("%s runs in %s mode, and %s is not installed", paths[0], gotMode, named[0])
		}
		return &Tools{IPTables: paths[0], Save: paths[1], Restore: paths[2], Version: version}, nil
	}
	return nil, fmt.Errorf("no %s tools for %s: %w", mode, fam, firstErr)
}

func lookPaths(names [3]string) ([3]string, error) {
	var paths [3]string
	for i, n := range names {
		p, err := exec.LookPath(n)
		if err != nil {
			return paths, err
		}
		paths[i] = p
	}
	return paths, nil
}

var versionMode = regexp.MustCompile(`v(\d+)\.(\d+)\.(\d+)(?:\s+\((\w+)\))?`)

// probeVersion checks through go-iptables that path is a usable iptables, new enough for
// `iptables-restore -w` (1.6.2), and returns its version and mode.
func probeVersion(path string, fam Family) (string, Mode, error) {
	proto := iptables.ProtocolIPv4
	if fam == IPv6 {
		proto = iptables.ProtocolIPv6
	}
	ipt, err := iptables.New(iptables.Path(path), iptables.IPFamily(proto))
	if err != nil {
		return "", "", fmt.Errorf("probe %s: %w", path, err)
	}
	v1, v2, v3 := ipt.GetIptablesVersion()
	version := fmt.Sprintf("%d.%d.%d", v1, v2, v3)
	if v1 < 1 || (v1 == 1 && (v2 < 6 || (v2 == 6 && v3 < 2))) {
		return "", "", fmt.Errorf("%s is version %s; need 1.6.2 or later for iptables-restore -w", path, version)
	}
	// go-iptables does not export the mode it read; 1.8 and later print it after the version.
	out, err := exec.Command(path, "--version").Output()
	if err != nil {
		return "", "", fmt.Errorf("%s --version: %w", path, err)
	}
	mode := Legacy
	if m := versionMode.FindStringSubmatch(string(out)); m != nil && m[4] == "nf_tables" {
		mode = NFT
	}
	return version, mode, nil
}

var (
	kubeletHint = regexp.MustCompile(`(?m)^:(KUBE-IPTABLES-HINT|KUBE-KUBELET-CANARY)\s`)
	kubeChain   = regexp.MustCompile(`(?m)^:KUBE-`)
	// kubeProxyChain matches chains only kube-proxy's iptables and IPVS modes create (kubelet creates
	// KUBE-IPTABLES-HINT, KUBE-KUBELET-CANARY and KUBE-FIREWALL whatever kube-proxy's mode).
	kubeProxyChain = regexp.MustCompile(`(?m)^:(KUBE-SERVICES|KUBE-PROXY-CANARY)\s`)
	ruleLine       = regexp.MustCompile(`(?m)^-A `)
)

// kubeProxyFinder finds kube-proxy's nftables-mode tables and, without iptables commands, the chains of
// its iptables mode in iptables-nft's tables.
type kubeProxyFinder interface {
	KubeProxyTables(ctx context.Context) ([]string, error)
	IPTablesNFTChainExists(ctx context.Context, table, chain string) (bool, error)
}

// detect decides where the cache's rules belong. kube-proxy's nftables mode keeps everything in tables
// named kube-proxy; its iptables and IPVS modes create KUBE-SERVICES in the nat table. Rules of both kinds
// at once (a mode change under way) are an error rather than a guess. Between iptables-legacy and -nft it
// decides as kube-proxy's iptables wrapper does: kubelet's hint chain in the mangle table of iptables-nft
// first, then in iptables-legacy, then wherever KUBE-* chains or simply more rules are. With no
// kube-proxy rules anywhere it returns a *NoKubeProxyRulesError naming the fallback.
func detect(ctx context.Context, r runner, kp kubeProxyFinder) (Mode, string, error) {
	nftTables, err := kp.KubeProxyTables(ctx)
	if err != nil {
		return "", "", fmt.Errorf("detect rules backend: %w", err)
	}
	_, legacyErr := findTools(r, Legacy, IPv4)
	_, nftErr := findTools(r, NFT, IPv4)
	if legacyErr != nil && nftErr != nil {
		if len(nftTables) > 0 {
			return NFTables, fmt.Sprintf("kube-proxy's nftables mode (table %s); no iptables commands installed", strings.Join(nftTables, ", ")), nil
		}
		// iptables-nft's tables are nftables tables too: kube-proxy's iptables mode shows without commands.
		if ok, err := kp.IPTablesNFTChainExists(ctx, string(NAT), "KUBE-SERVICES"); err != nil {
			return "", "", fmt.Errorf("detect rules backend: %w", err)
		} else if ok {
			return "", "", fmt.Errorf("detect rules backend: kube-proxy's rules are in iptables-nft (KUBE-SERVICES in table ip nat), "+
				"but no iptables commands are installed: %w", errors.Join(legacyErr, nftErr))
		}
		return "", "", &NoKubeProxyRulesError{Fallback: NFTables, Reason: "no iptables commands installed"}
	}

	tools := map[Mode][]*Tools{}
	for _, mode := range []Mode{Legacy, NFT} {
		for _, fam := range Families {
			if t, err := findTools(r, mode, fam); err == nil {
				tools[mode] = append(tools[mode], t)
			}
		}
	}
	save := func(mode Mode, args ...string) []byte {
		var all []byte
		for _, t := range tools[mode] {
			// Errors are deliberately ignored: a family or table the kernel lacks has no rules to find.
			out, _ := r.run(ctx, nil, t.Save, args...)
			all = append(all, out...)
		}
		return all
	}
	if ctx.Err() != nil {
		return "", "", ctx.Err()
	}
	nftMangle := save(NFT, "-t", "mangle")
	// Not "-t mangle" here: asking legacy iptables for a table creates it in the kernel.
	legacyAll := save(Legacy)
	nftAll := save(NFT)
	if err := ctx.Err(); err != nil {
		return "", "", fmt.Errorf("detect rules backend: %w", err)
	}
	var iptKubeProxy []string
	for mode, out := range map[Mode][]byte{Legacy: legacyAll, NFT: nftAll} {
		if kubeProxyChain.Match(out) {
			iptKubeProxy = append(iptKubeProxy, "iptables-"+string(mode))
		}
	}
	switch {
	case len(nftTables) > 0 && len(iptKubeProxy) > 0:
		return "", "", fmt.Errorf("detect rules backend: kube-proxy's rules are both in nftables (table %s) and in %s: "+
			"is kube-proxy changing mode? Not guessing; set the backend explicitly if this lasts", strings.Join(nftTables, ", "), strings.Join(iptKubeProxy, " and "))
	case len(nftTables) > 0:
		return NFTables, fmt.Sprintf("kube-proxy's nftables mode (table %s)", strings.Join(nftTables, ", ")), nil
	}
	mode, reason := iptablesFlavour(nftMangle, legacyAll, nftAll)
	if len(iptKubeProxy) == 0 {
		return "", "", &NoKubeProxyRulesError{Fallback: mode, Reason: reason}
	}
	return mode, reason, nil
}

// iptablesFlavour picks between iptables-legacy and -nft as kube-proxy's iptables wrapper does.
func iptablesFlavour(nftMangle, legacyAll, nftAll []byte) (Mode, string) {
	if kubeletHint.Match(nftMangle) {
		return NFT, "kubelet's hint chain is in iptables-nft"
	}
	if kubeletHint.Match(legacyAll) {
		return Legacy, "kubelet's hint chain is in iptables-legacy"
	}
	legacyKube, nftKube := kubeChain.Match(legacyAll), kubeChain.Match(nftAll)
	legacyRules, nftRules := len(ruleLine.FindAllIndex(legacyAll, -1)), len(ruleLine.FindAllIndex(nftAll, -1))
	counts := fmt.Sprintf("iptables-legacy has %d rules, iptables-nft %d", legacyRules, nftRules)
	switch {
	case legacyKube && !nftKube:
		return Legacy, "KUBE-* chains are in iptables-legacy only"
	case nftKube && !legacyKube:
		return NFT, "KUBE-* chains are in iptables-nft only"
	case legacyRules > nftRules:
		return Legacy, counts
	case legacyRules == 0 && nftRules == 0:
		return NFT, "neither backend holds rules; nft by default"
	}
	return NFT, counts
}
