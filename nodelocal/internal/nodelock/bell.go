//go:build linux

package nodelock

import (
	"context"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/nodelocaldns/nodelocaldns/internal/inotify"
)

// The bell tells an owner, without polling, that its successor changed: a successor rings it when it
// queues, when it says it is ready and when it leaves the line, by setting the lock file's times (any
// process that can lock the file may), and the owner watches the file's inode for that (inotify
// IN_ATTRIB), which works across the containers that share the file through a hostPath. A successor that
// dies rings nothing, but its process closes the file, which Closed tells of too.

// ring sets the times of the lock file open as f.
func ring(f *os.File) error {
	if err := unix.Futimes(int(f.Fd()), nil); err != nil {
		return fmt.Errorf("node lock: ring the owner's bell on %s: %w", f.Name(), err)
	}
	return nil
}

// Bell returns a channel that gets a value (at most one waits) whenever a successor rings at the lock at
// path; it is closed when ctx ends, or when the watch fails or ends (the file was removed).
func Bell(ctx context.Context, path string) (<-chan struct{}, error) {
	return watch(ctx, path, unix.IN_ATTRIB)
}

func watch(ctx context.Context, path string, mask uint32) (<-chan struct{}, error) {
	if path == "" {
		path = DefaultPath
	}
	ch, err := inotify.Watch(ctx, path, mask)
	if err != nil {
		return nil, fmt.Errorf("node lock: %w", err)
	}
	return ch, nil
}

// Closed returns a channel that gets a value (at most one waits) whenever a process that had the lock file
// at path open for writing closes it, and whenever a successor rings. Every process that locks the file
// opens it for writing, and the kernel closes its files however it exits: the value comes the moment an
// owner dies, killed or crashed, as well as when one lets go, and when any process that looked at the
// line closes the file again, so it says "look now", not what happened. The channel is closed when ctx
// ends, or when the watch fails or ends (the file was removed).
func Closed(ctx context.Context, path string) (<-chan struct{}, error) {
	return watch(ctx, path, unix.IN_CLOSE_WRITE|unix.IN_ATTRIB)
}
