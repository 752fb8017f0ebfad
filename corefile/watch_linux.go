//go:build linux

package corefile

import (
	"context"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/nodelocaldns/nodelocaldns/internal/inotify"
)

// inputEvents are what may change an input in its directory: a ConfigMap volume's update (Kubernetes writes
// the new files into a new directory, then renames a symbolic link over ..data), a file rewritten in place
// and closed, a file created, removed or renamed, and the directory's own removal, which ends the watch.
const inputEvents = unix.IN_CREATE | unix.IN_DELETE | unix.IN_MOVED_FROM | unix.IN_MOVED_TO | unix.IN_CLOSE_WRITE |
	unix.IN_ATTRIB | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF

// watchDirs returns a channel that gets a value (at most one waits) whenever something changed in one of
// dirs; it is closed when ctx ends or when any of the watches ends (a directory went).
func watchDirs(ctx context.Context, dirs []string) (<-chan struct{}, error) {
	ctx, cancel := context.WithCancel(ctx)
	out := make(chan struct{}, 1)
	var wg sync.WaitGroup
	for _, dir := range dirs {
		ch, err := inotify.Watch(ctx, dir, inputEvents)
		if err != nil {
			cancel()
			return nil, err
		}
		wg.Go(func() {
			for range ch {
				select {
				case out <- struct{}{}:
				default:
				}
			}
			cancel() // one ended: end them all, so that the caller looks for itself
		})
	}
	go func() {
		wg.Wait()
		cancel()
		close(out)
	}()
	return out, nil
}
