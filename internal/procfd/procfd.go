// Package procfd lists this process's open sockets, as /proc/self/fd shows them.
package procfd

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// Socket is one of this process's open sockets: its descriptor, and its inode, which /proc/net's tables and
// sock_diag name it by.
type Socket struct {
	FD    int
	Inode uint64
}

// Sockets returns this process's open sockets. It lists the descriptors in /proc/self/fd and asks each for
// its inode with fstat, which costs a fraction of reading the link that names it (a path walk through procfs):
// on a node with thousands of open connections this runs for each of them. A socket closed since the listing
// fails whatever its caller asks of it next, or, if its number was taken again meanwhile, answers as that
// file: callers check what they act on (its protocol, its addresses).
func Sockets() ([]Socket, error) {
	dir, err := os.Open("/proc/self/fd")
	if err != nil {
		return nil, fmt.Errorf("listing this process's file descriptors: %w", err)
	}
	names, err := dir.Readdirnames(-1)
	dir.Close()
	if err != nil {
		return nil, fmt.Errorf("listing this process's file descriptors: %w", err)
	}
	var out []Socket
	var st unix.Stat_t
	for _, name := range names {
		fd, err := strconv.Atoi(name)
		if err != nil {
			continue
		}
		if unix.Fstat(fd, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFSOCK {
			continue // closed meanwhile (the directory's own descriptor among them), or not a socket
		}
		out = append(out, Socket{FD: fd, Inode: st.Ino})
	}
	return out, nil
}
