// Package nodelock makes one process the owner of a node's link and rules.
//
// Two caches that both rewrite the same chains and addresses would undo each other's work forever. The
// owner holds an exclusive flock on a file under /run and writes who it is into it; a second process fails
// at once with an error that names the first, or queues in the same file to succeed it (see Queue). The kernel drops the lock when the owner exits, however it
// exits, so a crash leaves nothing to clean up. In a container, the file must be on a hostPath volume
// shared by every instance on the node, or each would lock its own copy.
package nodelock

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// DefaultPath is the lock file unless configured otherwise.
const DefaultPath = "/run/nodelocaldns.lock"

// HeldError says that another process holds the lock.
type HeldError struct {
	Path string
	// Holder is what the holder wrote into the file, e.g. "pid 1234 (coredns) on node-a since ...".
	Holder string
}

func (e *HeldError) Error() string {
	holder := e.Holder
	if holder == "" {
		holder = "a process that has not yet written its name"
	}
	return fmt.Sprintf("another instance owns this node: %s is held by %s", e.Path, holder)
}

// Lock is a held node lock.
type Lock struct {
	f *os.File
}

// Acquire takes the lock at path without waiting. When another process holds it, the error is a
// *HeldError naming that process.
func Acquire(path string) (*Lock, error) {
	if path == "" {
		path = DefaultPath
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("node lock: %w", err)
	}
	// O_CLOEXEC (which os.OpenFile sets) keeps the lock out of the iptables processes we start.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("node lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		defer f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			holder, _ := readHolder(f)
			return nil, &HeldError{Path: path, Holder: holder}
		}
		return nil, fmt.Errorf("node lock: flock %s: %w", path, err)
	}
	if err := writeHolder(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("node lock: record holder in %s: %w", path, err)
	}
	return &Lock{f: f}, nil
}

// Release gives the lock up. Releasing twice is not an error.
func (l *Lock) Release() error {
	if l == nil || l.f == nil {
		return nil
	}
	f := l.f
	l.f = nil
	// Empty the file first so that nobody reads a stale holder; closing drops the flock.
	_ = f.Truncate(0)
	return f.Close()
}

func writeHolder(f *os.File) error {
	if err := f.Truncate(0); err != nil {
		return err
	}
	host, _ := os.Hostname()
	_, err := f.WriteAt([]byte(fmt.Sprintf("pid %d (%s) on %s since %s\n", os.Getpid(), command(), host, time.Now().UTC().Format(time.RFC3339))), 0)
	return err
}

func readHolder(f *os.File) (string, error) {
	buf := make([]byte, 512)
	n, err := f.ReadAt(buf, 0)
	if n == 0 {
		return "", err
	}
	return strings.TrimSpace(string(buf[:n])), nil
}

func command() string {
	if b, err := os.ReadFile("/proc/self/comm"); err == nil {
		return strings.TrimSpace(string(b))
	}
	return filepath.Base(os.Args[0])
}
