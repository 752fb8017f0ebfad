//go:build !linux

package corefile

import (
	"context"
	"errors"
)

// watchDirs has no inotify to watch with here: DropIn.Watch looks every period.
func watchDirs(context.Context, []string) (<-chan struct{}, error) {
	return nil, errors.New("directories cannot be watched on this platform")
}
