//go:build linux

package nodelock

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nodelocaldns/nodelocaldns/internal/privtest"
)

// nobody is the uid and gid of the unprivileged user the tests pose as.
const nobody = 65534

// squatEnv, set in a child's environment to a lock file's path, makes the test binary a squatter (see
// squat) instead of running tests.
const squatEnv = "NODELOCK_TEST_SQUAT"

func TestMain(m *testing.M) {
	if path, ok := os.LookupEnv(squatEnv); ok {
		fmt.Println(squat(path))
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// squat opens the lock file at path read-only and takes its flock, as `flock -x` run by a user who may
// not write it would. It returns "locked", or the step that failed and its errno ("open EACCES").
func squat(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return "open " + errnoName(err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return "flock " + errnoName(err)
	}
	return "locked"
}

func errnoName(err error) string {
	if errno, ok := errors.AsType[syscall.Errno](err); ok {
		return unix.ErrnoName(errno)
	}
	return err.Error()
}

// squatAsNobody runs squat on path in a child process whose uid and gid are nobody's and returns what it
// said. The child is this test binary, run through /proc/self/exe, which it may execute although the
// directories the go command built it in are closed to nobody.
func squatAsNobody(t *testing.T, path string) string {
	t.Helper()
	cmd := exec.Command("/proc/self/exe", "-test.run=^$")
	cmd.Env = append(os.Environ(), squatEnv+"="+path)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	out, err := cmd.Output()
	if err != nil {
		if exit, ok := errors.AsType[*exec.ExitError](err); ok {
			t.Fatalf("squatter as uid %d: %v: %s", nobody, err, exit.Stderr)
		}
		t.Fatalf("squatter as uid %d: %v", nobody, err)
	}
	return strings.TrimSpace(string(out))
}

// openDir returns the test's temporary directory, opened (with the test's own one above it) for every user
// to search, so that only the lock file's own mode keeps another user out of it.
func openDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func perm(t *testing.T, path string) fs.FileMode {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

// writeLegacy writes a lock file as older versions (and a hostPath volume of type FileOrCreate) left it:
// 0644, whatever the umask.
func writeLegacy(t *testing.T, path, holder string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(holder), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestLockFileIsPrivate(t *testing.T) {
	t.Run("created 0600", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "node.lock")
		l, err := Acquire(path)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Release()
		if p := perm(t, path); p != 0o600 {
			t.Errorf("a new lock file is %#o, want 0600", p)
		}
	})
	// Each way into the file narrows one of ours that others may read.
	openers := map[string]func(t *testing.T, path string){
		"Acquire": func(t *testing.T, path string) {
			l, err := Acquire(path)
			if err != nil {
				t.Fatal(err)
			}
			l.Release()
		},
		"Queue": func(t *testing.T, path string) {
			if _, err := Queue(path); !errors.Is(err, ErrNotHeld) {
				t.Fatalf("Queue with no owner: %v, want ErrNotHeld", err)
			}
		},
		"Orphaned": func(t *testing.T, path string) {
			if orphaned, err := Orphaned(path); err != nil || !orphaned {
				t.Fatalf("Orphaned: %v %v", orphaned, err)
			}
		},
	}
	for name, open := range openers {
		t.Run(name+" narrows 0644", func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "node.lock")
			writeLegacy(t, path, "")
			open(t, path)
			if p := perm(t, path); p != 0o600 {
				t.Errorf("a 0644 lock file of ours is %#o after %s, want 0600", p, name)
			}
		})
	}
}

func TestLockFileMustBeARegularFile(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "target")
	writeLegacy(t, target, "keep me\n")
	link := filepath.Join(dir, "node.lock")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if l, err := Acquire(link); err == nil || !strings.Contains(err.Error(), "symbolic link") {
		l.Release()
		t.Errorf("Acquire through a symlink: %v, want an error that says it is one", err)
	}
	fifo := filepath.Join(dir, "fifo.lock")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	if l, err := Acquire(fifo); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		l.Release()
		t.Errorf("Acquire on a FIFO: %v, want an error that says it is not a regular file", err)
	}
	hard := filepath.Join(dir, "hard.lock")
	if err := os.Link(target, hard); err != nil {
		t.Fatal(err)
	}
	if l, err := Acquire(hard); err == nil || !strings.Contains(err.Error(), "hard links") {
		l.Release()
		t.Errorf("Acquire on a file with two links: %v, want an error that says so", err)
	}
	if b, err := os.ReadFile(target); err != nil || string(b) != "keep me\n" {
		t.Errorf("the file behind the link holds %q %v: the lock wrote into it", b, err)
	}
	if p := perm(t, target); p != 0o644 {
		t.Errorf("the file behind the link is %#o: the lock changed its mode", p)
	}
}

// TestLockFileOfAnotherUserIsRefused checks that a lock file another user owns (who could have left a
// forged holder line in it, or squat it) is refused, naming the owner and the file, and left as it is.
func TestLockFileOfAnotherUserIsRefused(t *testing.T) {
	privtest.RequirePrivileged(t)
	path := filepath.Join(openDir(t), "node.lock")
	const holder = "pid 1 (coredns) on node-a since 2025-01-01T00:00:00Z\n"
	writeLegacy(t, path, holder)
	if err := os.Chown(path, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	for name, open := range map[string]func() error{
		"Acquire": func() error {
			l, err := Acquire(path)
			l.Release()
			return err
		},
		"Queue": func() error {
			s, err := Queue(path)
			s.Close()
			return err
		},
		"Orphaned": func() error {
			_, err := Orphaned(path)
			return err
		},
	} {
		err := open()
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("uid %d", nobody)) || !strings.Contains(err.Error(), path) {
			t.Errorf("%s on a lock file of uid %d: %v, want an error naming the uid and the file", name, nobody, err)
		}
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != holder {
		t.Errorf("the refused file now holds %q %v", b, err)
	}
	if p := perm(t, path); p != 0o644 {
		t.Errorf("the refused file is %#o: its mode was changed", p)
	}
}

// TestAnotherUserCannotSquat checks that an unprivileged user, who could take the flock of a 0644 lock
// file (flock needs only a descriptor open for reading) and so keep every cache off the node, cannot once
// Acquire has narrowed the file.
func TestAnotherUserCannotSquat(t *testing.T) {
	privtest.RequirePrivileged(t)
	path := filepath.Join(openDir(t), "node.lock")
	writeLegacy(t, path, "")
	// Without this, the test would prove nothing: nobody reaches the file and may take its flock.
	if got := squatAsNobody(t, path); got != "locked" {
		t.Fatalf("uid %d on a 0644 lock file: %s, want locked (is its directory closed to it?)", nobody, got)
	}
	l, err := Acquire(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	if got := squatAsNobody(t, path); got != "open EACCES" {
		t.Errorf("uid %d on the lock file after Acquire: %s, want open EACCES", nobody, got)
	}
	again, err := Acquire(path)
	if err != nil {
		t.Fatalf("Acquire after the squatter tried: %v", err)
	}
	again.Release()
}
