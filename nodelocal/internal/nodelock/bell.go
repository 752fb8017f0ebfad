//go:build linux

package nodelock

import (
	"context"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// The bell tells an owner, without polling, that its successor changed: a successor rings it when it
// queues, when it says it is ready and when it leaves the line, by setting the lock file's times (any
// process that can lock the file may), and the owner watches the file's inode for that (inotify
// IN_ATTRIB), which works across the containers that share the file through a hostPath. A successor that
// dies rings nothing: the kernel drops its locks silently, so an owner still looks now and then.

// ring sets the times of the lock file open as f.
func ring(f *os.File) error {
	if err := unix.Futimes(int(f.Fd()), nil); err != nil {
		return fmt.Errorf("node lock: ring the owner's bell on %s: %w", f.Name(), err)
	}
	return nil
}

// Bell returns a channel that gets a value (at most one waits) whenever a successor rings at the lock at
// path; it is closed when ctx ends, or when the watch fails.
func Bell(ctx context.Context, path string) (<-chan struct{}, error) {
	if path == "" {
		path = DefaultPath
	}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("node lock: watch %s: inotify: %w", path, err)
	}
	if _, err := unix.InotifyAddWatch(fd, path, unix.IN_ATTRIB|unix.IN_DONT_FOLLOW); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("node lock: watch %s: %w", path, err)
	}
	// A non-blocking descriptor goes to the runtime's poller: a read waits without a thread.
	f := os.NewFile(uintptr(fd), "inotify "+path)
	rang := make(chan struct{}, 1)
	go func() {
		<-ctx.Done()
		f.Close()
	}()
	go func() {
		buf := make([]byte, 4096)
		for {
			if _, err := f.Read(buf); err != nil {
				// Closed at ctx's end; any other error is not expected, and the owner's occasional look
				// carries on without the bell.
				close(rang)
				return
			}
			select {
			case rang <- struct{}{}:
			default:
			}
		}
	}()
	return rang, nil
}
