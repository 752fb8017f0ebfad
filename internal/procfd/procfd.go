// Package procfd lists this process's open sockets, as /proc/self/fd shows them.
package procfd

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Sockets returns the descriptors of this process's open sockets. A socket closed since the listing fails
// whatever its caller asks of it next, or, if its number was taken again meanwhile, answers as that file:
// callers check what they act on (its protocol, its addresses).
func Sockets() ([]int, error) {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return nil, fmt.Errorf("listing this process's files: %w", err)
	}
	var fds []int
	for _, e := range entries {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err != nil || !strings.HasPrefix(target, "socket:") {
			continue
		}
		fds = append(fds, fd)
	}
	return fds, nil
}
