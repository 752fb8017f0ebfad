//go:build linux

package notrack

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/coredns/caddy"

	"github.com/nodelocaldns/nodelocaldns/nodelocal"
)

// TestUninstallRemovesEverything: with handover, a final shutdown hands the node to the cluster DNS and
// leaves the link-local address, the chains and the divert's marks for the next start; told that the node
// cache is being uninstalled (SetUninstalling), the same shutdown leaves nothing.
func TestUninstallRemovesEverything(t *testing.T) {
	for _, uninstall := range []bool{false, true} {
		t.Run(map[bool]string{false: "restart", true: "uninstall"}[uninstall], func(t *testing.T) {
			e := inNamespace(t, nodelocal.BackendNFT)
			if e == nil {
				return
			}
			inst, err := caddy.Start(e.corefile("169.254.20.10 10.96.0.10", "handover 10.96.0.11", "service 10.96.0.10"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { inst.ShutdownCallbacks(); inst.Stop() })
			e.waitCovered("10.96.0.10", "169.254.20.10")
			SetUninstalling(uninstall)
			t.Cleanup(func() { SetUninstalling(false) })
			shutdown(t, inst)
			if !uninstall {
				e.waitLog("handed the node to the cluster DNS")
				e.expectLink("169.254.20.10")
				if !strings.Contains(strings.Join(e.ours(), "\n"), nodelocal.GuardChain) {
					t.Errorf("the hand-over left no divert marks:\n%s", strings.Join(e.ours(), "\n"))
				}
				return
			}
			e.waitLog("uninstalling: removed the rules, the divert and nodelocaldns")
			e.expectNothingLeft()
			out, err := exec.Command(e.tool("iptables-save"), "-t", "nat").CombinedOutput()
			if err != nil {
				t.Fatalf("iptables-save -t nat: %v: %s", err, out)
			}
			if strings.Contains(string(out), nodelocal.GuardChain) {
				t.Errorf("the divert is left in nat:\n%s", out)
			}
		})
	}
}
