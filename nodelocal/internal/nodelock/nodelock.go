//go:build linux

// Package nodelock makes one process the owner of a node's link and rules.
//
// Two caches that both rewrite the same chains and addresses would undo each other's work forever. The
// owner holds an exclusive flock on a file under /run and writes who it is into it; a second process fails
// at once with an error that names the first, or queues in the same file to succeed it (see Queue). The
// kernel drops the lock when the owner exits, however it exits, so a crash leaves nothing to clean up. In a
// container, the file must be on a hostPath volume shared by every instance on the node, or each would lock
// its own copy.
//
// # Trust
//
// The lock file is trusted only as far as its owner is: it must be a regular file with one link, owned by
// the effective uid of the caller (root, for the caches), and no more than 0600. Every way in (Acquire,
// Queue, Orphaned) creates it so, refuses a symbolic link, a file of another uid (which could have been
// filled or locked by that user) or one that is not a regular file, and narrows one of its own that is
// open to others (older versions created it 0644, and so does a hostPath volume of type FileOrCreate).
// Then only the owner's uid, or a process that may override file permissions, can open it at all, and so
// only such a process can take the flock, queue, say it is ready, or write the holder line. The holder
// line is what the owner says of itself, for people: anyone who could forge it could take the lock too,
// and nothing is decided by it.
//
// A descriptor that another user opened while the file was still open to others outlives the narrowing.
// Through it that user can still take the flock (flock needs no write access), and HeldError then names
// whoever last wrote the file; and it can place read locks, but not the write locks that queue or say
// ready (fcntl needs a descriptor open for writing for those). So a read lock on those bytes is a forgery:
// it is reported as a *ForgedLockError and never counted as a successor.
package nodelock

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
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
	path string
	f    *os.File
}

// Acquire takes the lock at path without waiting. When another process holds it, the error is a
// *HeldError naming that process.
func Acquire(path string) (*Lock, error) {
	if path == "" {
		path = DefaultPath
	}
	f, err := openFile(path)
	if err != nil {
		return nil, err
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
	return &Lock{path: path, f: f}, nil
}

// openFile opens the lock file at path for reading and writing, creating it 0600 (and its directory), and
// checks that it may be trusted (see the package doc): a regular file with one link, owned by the
// effective uid. One of ours that others may open is narrowed to 0600.
func openFile(path string) (*os.File, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("node lock: create the directory of %s: %w", path, err)
	}
	// O_CLOEXEC (which os.OpenFile sets) keeps the lock out of the iptables processes we start. O_NOFOLLOW
	// fails on a symbolic link, dangling or not, instead of locking (and truncating) what it points to.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			return nil, fmt.Errorf("node lock: %s is a symbolic link, and the lock file must be a regular file: %w", path, err)
		}
		return nil, fmt.Errorf("node lock: open %s: %w", path, err)
	}
	if err := checkFile(f, path); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// checkFile checks the lock file open as f, as openFile says, and narrows its mode to 0600 if it must.
// It reads the file's state from the descriptor, so that what it checks is what the caller locks.
func checkFile(f *os.File, path string) error {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return fmt.Errorf("node lock: stat %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("node lock: %s is not a regular file (file type %#o)", path, st.Mode&unix.S_IFMT)
	}
	if euid := os.Geteuid(); int(st.Uid) != euid {
		return fmt.Errorf("node lock: %s belongs to uid %d, not to this process's uid %d, and a lock file of "+
			"another user cannot be trusted: remove it, or chown it to uid %d", path, st.Uid, euid, euid)
	}
	// A second name would let whoever made it point the lock at a file of ours that Acquire then truncates.
	if st.Nlink != 1 {
		return fmt.Errorf("node lock: %s has %d hard links, and the lock file must have one", path, st.Nlink)
	}
	if mode := st.Mode & 0o7777; mode&^0o600 != 0 {
		if err := f.Chmod(0o600); err != nil {
			return fmt.Errorf("node lock: narrow %s from mode %#o, which lets other users open it, to 0600: %w", path, mode, err)
		}
	}
	return nil
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
