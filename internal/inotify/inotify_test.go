//go:build linux

package inotify

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// bound only decides when the test gives up.
const bound = 10 * time.Second

// A watched directory tells of a file created in it, and the channel closes once the directory is removed.
func TestWatchDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "watched")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ch, err := Watch(t.Context(), dir, unix.IN_CREATE|unix.IN_DELETE_SELF)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "f"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	select {
	case _, ok := <-ch:
		if !ok {
			t.Fatal("closed instead of telling of the new file")
		}
	case <-time.After(bound):
		t.Fatalf("nothing within %v of a file created", bound)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(bound)
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-deadline:
			t.Fatalf("still open %v after the directory was removed", bound)
		}
	}
}

func TestWatchMissing(t *testing.T) {
	if _, err := Watch(t.Context(), filepath.Join(t.TempDir(), "absent"), unix.IN_CREATE); err == nil {
		t.Fatal("watching a path that does not exist succeeded")
	}
}
