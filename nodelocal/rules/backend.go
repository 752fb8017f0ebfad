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

// Mode is the iptables backend: the legacy kernel tables or nf_tables through iptables-nft. The rules of a
// node must all live in one of them, the one kube-proxy uses, or they do not order with each other.
type Mode string

// The modes. Auto finds the one the node uses.
const (
	Auto   Mode = "auto"
	Legacy Mode = "legacy"
	NFT    Mode = "nft"
)

// ParseMode parses "auto" (or ""), "legacy" or "nft".
func ParseMode(s string) (Mode, error) {
	switch m := Mode(strings.ToLower(strings.TrimSpace(s))); m {
	case "", Auto:
		return Auto, nil
	case Legacy, NFT:
		return m, nil
	}
	return "", fmt.Errorf("unknown iptables backend %q (want auto, legacy or nft)", s)
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

// NewBackend returns the backend of a fixed mode (legacy or nft). Its commands are looked up on first use.
func NewBackend(mode Mode, reason string) (*Backend, error) {
	if mode != Legacy && mode != NFT {
		return nil, fmt.Errorf("iptables backend must be legacy or nft, not %q", mode)
	}
	return &Backend{Mode: mode, Reason: reason, run: execRunner{}, tools: map[Family]*Tools{}}, nil
}

// Select returns the backend of mode want; with Auto it finds the mode the node's rules live in.
func Select(ctx context.Context, want Mode) (*Backend, error) {
	switch want {
	case Legacy, NFT:
		return NewBackend(want, "configured")
	case Auto, "":
		mode, reason, err := detect(ctx, execRunner{})
		if err != nil {
			return nil, err
		}
		return NewBackend(mode, reason)
	}
	return nil, fmt.Errorf("unknown iptables backend %q", want)
}

// Tools returns the commands for fam, looking them up the first time.
func (b *Backend) Tools(fam Family) (*Tools, error) {
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
	ruleLine    = regexp.MustCompile(`(?m)^-A `)
)

// detect decides between legacy and nft the way kube-proxy's iptables wrapper does: kubelet's hint chain
// in the mangle table of iptables-nft first, then in iptables-legacy, then wherever KUBE-* chains or simply
// more rules are, and nft when the node has none.
func detect(ctx context.Context, r runner) (Mode, string, error) {
	_, legacyErr := findTools(r, Legacy, IPv4)
	_, nftErr := findTools(r, NFT, IPv4)
	switch {
	case legacyErr != nil && nftErr != nil:
		return "", "", fmt.Errorf("detect iptables backend: %w", errors.Join(legacyErr, nftErr))
	case legacyErr != nil:
		return NFT, "only iptables-nft is installed", nil
	case nftErr != nil:
		return Legacy, "only iptables-legacy is installed", nil
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
	if kubeletHint.Match(save(NFT, "-t", "mangle")) {
		return NFT, "kubelet's hint chain is in iptables-nft", nil
	}
	// Not "-t mangle" here: asking legacy iptables for a table creates it in the kernel.
	legacyAll := save(Legacy)
	if kubeletHint.Match(legacyAll) {
		return Legacy, "kubelet's hint chain is in iptables-legacy", nil
	}
	nftAll := save(NFT)
	if err := ctx.Err(); err != nil {
		return "", "", fmt.Errorf("detect iptables backend: %w", err)
	}
	legacyKube, nftKube := kubeChain.Match(legacyAll), kubeChain.Match(nftAll)
	legacyRules, nftRules := len(ruleLine.FindAllIndex(legacyAll, -1)), len(ruleLine.FindAllIndex(nftAll, -1))
	counts := fmt.Sprintf("iptables-legacy has %d rules, iptables-nft %d", legacyRules, nftRules)
	switch {
	case legacyKube && !nftKube:
		return Legacy, "KUBE-* chains are in iptables-legacy only", nil
	case nftKube && !legacyKube:
		return NFT, "KUBE-* chains are in iptables-nft only", nil
	case legacyRules > nftRules:
		return Legacy, counts, nil
	case legacyRules == 0 && nftRules == 0:
		return NFT, "neither backend holds rules; nft by default", nil
	}
	return NFT, counts, nil
}
