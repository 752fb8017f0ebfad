//go:build linux

package rules

import (
	"os/exec"
	"testing"

	"github.com/nodelocaldns/nodelocaldns/internal/netnstest"
	"github.com/nodelocaldns/nodelocaldns/internal/privtest"
)

// The generation stays while the ruleset is only read, and moves with a transaction that changes it.
func TestNFTGeneration(t *testing.T) {
	privtest.RequirePrivileged(t, "ip", "nft")
	if !netnstest.Run(t) {
		return
	}
	before, err := NFTGeneration()
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("nft", "list", "ruleset").CombinedOutput(); err != nil {
		t.Fatalf("nft list ruleset: %v: %s", err, out)
	}
	if same, err := NFTGeneration(); err != nil || same != before {
		t.Fatalf("after reading the ruleset: generation %d %v, want %d", same, err, before)
	}
	if out, err := exec.Command("nft", "add", "table", "inet", "gentest").CombinedOutput(); err != nil {
		t.Fatalf("nft add table: %v: %s", err, out)
	}
	if after, err := NFTGeneration(); err != nil || after == before {
		t.Fatalf("after adding a table: generation %d %v, want another than %d", after, err, before)
	}
}
