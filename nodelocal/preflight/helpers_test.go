//go:build linux

package preflight

import (
	"net/netip"
	"os/exec"
	"strings"
	"testing"

	"github.com/nodelocaldns/nodelocaldns/internal/netnstest"
	"github.com/nodelocaldns/nodelocaldns/internal/privtest"
	"github.com/nodelocaldns/nodelocaldns/nodelocal/internal/rules"
)

var (
	addrA     = netip.MustParseAddr("169.254.20.10")
	clusterIP = netip.MustParseAddr("10.96.0.10")
)

// env is a fresh network namespace with one iptables flavour.
type env struct {
	t     *testing.T
	mode  rules.Mode
	tools map[rules.Family]*rules.Tools
}

// inNamespace runs fn in a fresh network namespace once per iptables flavour.
func inNamespace(t *testing.T, fn func(t *testing.T, e *env)) {
	for _, mode := range []rules.Mode{rules.NFT, rules.Legacy} {
		t.Run(string(mode), func(t *testing.T) { runIn(t, mode, fn) })
	}
}

// inNamespaceNFT runs fn in a fresh network namespace with iptables-nft.
func inNamespaceNFT(t *testing.T, fn func(t *testing.T, e *env)) { runIn(t, rules.NFT, fn) }

func runIn(t *testing.T, mode rules.Mode, fn func(t *testing.T, e *env)) {
	privtest.RequirePrivileged(t, append([]string{"ip"}, privtest.IptablesCommands(string(mode))...)...)
	if !netnstest.Run(t) {
		return
	}
	b, err := rules.NewBackend(mode, "test")
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, mode: mode, tools: map[rules.Family]*rules.Tools{}}
	for _, fam := range rules.Families {
		tools, err := b.Tools(fam)
		if err != nil {
			t.Fatal(err)
		}
		e.tools[fam] = tools
	}
	fn(t, e)
}

// restore applies payload with iptables-restore --noflush for fam.
func (e *env) restore(fam rules.Family, payload string) {
	e.t.Helper()
	cmd := exec.Command(e.tools[fam].Restore, "-w", "5", "--noflush")
	cmd.Stdin = strings.NewReader(payload)
	if out, err := cmd.CombinedOutput(); err != nil {
		e.t.Fatalf("restore: %v: %s", err, out)
	}
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
}
