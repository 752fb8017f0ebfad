//go:build linux

// Package inotify tells a goroutine, without polling, that a file or a directory changed.
package inotify

import (
	"context"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Watch returns a channel that gets a value (at most one waits) for every batch of the inotify events in
// mask (unix.IN_*) on path, so it says "look now", not what happened. It is closed when ctx ends, when the
// watch fails, or when it ends: path was removed, or its file system unmounted (IN_IGNORED). A symbolic link
// at path is watched itself, not followed.
func Watch(ctx context.Context, path string, mask uint32) (<-chan struct{}, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("watch %s: inotify: %w", path, err)
	}
	if _, err := unix.InotifyAddWatch(fd, path, mask|unix.IN_DONT_FOLLOW); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("watch %s: %w", path, err)
	}
	// A non-blocking descriptor goes to the runtime's poller: a read waits without a thread.
	f := os.NewFile(uintptr(fd), "inotify "+path)
	changed := make(chan struct{}, 1)
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
		defer close(changed)
		buf := make([]byte, 4096)
		for {
			n, err := f.Read(buf)
			if err != nil {
				return // closed at ctx's end; any other error ends the watch, which the caller is told
			}
			select {
			case changed <- struct{}{}:
			default:
			}
			if ended(buf[:n]) {
				return
			}
		}
	}()
	return changed, nil
}

// ended reports whether the inotify events in buf include IN_IGNORED: the watch is gone, and no event will
// come again.
func ended(buf []byte) bool {
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
