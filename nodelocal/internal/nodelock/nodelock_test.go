//go:build linux

package nodelock

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodelocaldns/nodelocaldns/internal/privtest"
)

func TestSecondHolderFailsNamingTheFirst(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "node.lock")
	first, err := Acquire(path)
	if err != nil {
		t.Fatal(err)
	}
	_, err = Acquire(path)
	if _, ok := errors.AsType[*HeldError](err); !ok {
		t.Fatalf("second Acquire: %v", err)
	}
	if want := fmt.Sprintf("pid %d (", os.Getpid()); !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), path) {
		t.Errorf("error %q does not name the holder (%s) and the file", err, want)
	}
	if err := first.Release(); err != nil {
		t.Fatal(err)
	}
	if err := first.Release(); err != nil {
		t.Errorf("second Release: %v", err)
	}
	again, err := Acquire(path)
	if err != nil {
		t.Fatalf("Acquire after Release: %v", err)
	}
	again.Release()
}

// TestHeldAcrossProcesses takes the lock in a child process (flock(1)) and checks that we fail fast.
func TestHeldAcrossProcesses(t *testing.T) {
	privtest.RequirePrivileged(t, "flock")
	path := filepath.Join(t.TempDir(), "node.lock")
	if err := os.WriteFile(path, []byte("pid 99999 (coredns) on node-a since 2025-01-01T00:00:00Z\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("flock", "-x", path, "sh", "-c", "echo locked; read _")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		stdin.Close()
		cmd.Wait()
	}()
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "locked\n" {
		t.Fatalf("flock child: %q %v", line, err)
	}
	_, err = Acquire(path)
	if err == nil || !strings.Contains(err.Error(), "pid 99999 (coredns) on node-a") {
		t.Errorf("Acquire while another process holds the lock: %v", err)
	}
}
