//go:build linux

package nodelock

import (
	"context"
	"fmt"
	"os"
	"unsafe"

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
// path; it is closed when ctx ends, or when the watch fails or ends (the file was removed).
func Bell(ctx context.Context, path string) (<-chan struct{}, error) {
	return watch(ctx, path, unix.IN_ATTRIB)
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

// watch returns a channel that gets a value (at most one waits) for every batch of the inotify events in
// mask on the file at path, as Bell and Closed say.
func watch(ctx context.Context, path string, mask uint32) (<-chan struct{}, error) {
	if path == "" {
		path = DefaultPath
	}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("node lock: watch %s: inotify: %w", path, err)
	}
	if _, err := unix.InotifyAddWatch(fd, path, mask|unix.IN_DONT_FOLLOW); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("node lock: watch %s: %w", path, err)
	}
	// A non-blocking descriptor goes to the runtime's poller: a read waits without a thread.
	f := os.NewFile(uintptr(fd), "inotify "+path)
	rang := make(chan struct{}, 1)
	stop := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
		case <-stop:
		}
		f.Close()
	}()
	go func() {
		defer close(stop)
		buf := make([]byte, 4096)
		for {
			n, err := f.Read(buf)
			if err != nil {
				// Closed at ctx's end; any other error is not expected, and the owner's occasional look
				// carries on without the watch.
				close(rang)
				return
			}
			select {
			case rang <- struct{}{}:
			default:
			}
			if watchEnded(buf[:n]) {
				close(rang)
				return
			}
		}
	}()
	return rang, nil
}

// watchEnded reports whether the inotify events in buf include IN_IGNORED: the file was removed (or its
// file system unmounted), and no event will come again.
func watchEnded(buf []byte) bool {
	for len(buf) >= unix.SizeofInotifyEvent {
		ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[0]))
		if ev.Mask&unix.IN_IGNORED != 0 {
			return true
		}
		next := unix.SizeofInotifyEvent + int(ev.Len)
		if next > len(buf) {
			return false
		}
		buf = buf[next:]
	}
	return false
}
