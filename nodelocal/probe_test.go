//go:build linux

package nodelocal

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestProbeExemptionFailedAddThatCommitted: an iptables-restore can change the rules and still fail, as one
// killed when its context ends does when the kill comes after its commit. The last Release must remove a
// rule whose add failed, or it stays behind for good (a cache stopped while it probed left one in raw OUTPUT).
func TestProbeExemptionFailedAddThatCommitted(t *testing.T) {
	inNamespaceNFT(t, func(t *testing.T, _ *env) {
		real, err := exec.LookPath("iptables-nft-restore")
		if err != nil {
			t.Fatal(err)
		}
		// The next restore commits, then fails.
		dir := t.TempDir()
		failNext := filepath.Join(dir, "fail-next")
		wrapper := "#!/bin/sh\nif [ -e " + failNext + " ]; then\n  rm " + failNext + "\n  " + real + " \"$@\" || exit\n  echo 'killed after the commit' >&2\n  exit 137\nfi\nexec " + real + " \"$@\"\n"
		if err := os.WriteFile(filepath.Join(dir, "iptables-nft-restore"), []byte(wrapper), 0o755); err != nil {
			t.Fatal(err)
		}
		t.Setenv("PATH", dir+":"+os.Getenv("PATH"))
		if err := os.WriteFile(failNext, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		probeRule := func() bool {
			out, err := exec.Command("iptables-nft", "-t", "raw", "-S", "OUTPUT").CombinedOutput()
			if err != nil {
				t.Fatalf("iptables-nft -t raw -S OUTPUT: %v: %s", err, out)
			}
			return strings.Contains(string(out), "--mark 0x53")
		}

		p := NewProbeExemption(0)
		if err := p.Acquire(context.Background(), "nft", []netip.Addr{addrA}); err == nil {
			t.Fatal("Acquire succeeded with a restore that failed")
		}
		if !probeRule() {
			t.Fatal("the restore that failed after its commit did not put the rule in place")
		}
		if !p.Active() {
			t.Error("Active: false with the rule possibly in place")
		}
		if err := p.Release(time.Minute); err != nil {
			t.Fatal(err)
		}
		if probeRule() {
			t.Error("the rule stayed after the last Release")
		}
		if p.Active() {
			t.Error("Active: true after the rule was removed")
		}
	})
}
