// Package rawread reads a socket with raw system calls, waiting for it in Go's network poller, and waits as
// soon as a read shows that the socket holds nothing more, without the read that would find it empty.
//
// The poller is edge-triggered, so a reader usually reads until a read fails with EAGAIN before it waits:
// at a few thousand queries a second, where each query or answer wakes the reader, that read is one system
// call of the four or five a wake-up costs. A read can often tell that it emptied the socket (recvmmsg
// returns a batch shorter than asked for; TCP_INQ says that the socket holds nothing more), and waiting
// then is safe only within the same syscall.RawConn.Read: Read resets the socket's readiness as it starts,
// and not between the waits of its loop. So whatever comes after a read, even what the runtime's poller
// found ready while the reader was busy handing on what it read, ends the next wait; a new Read would take
// that readiness away, and leave what came unread until something more came.
package rawread

import "syscall"

// Result is what a read tells Serve.
type Result int

const (
	// More says that the socket may hold more: read again.
	More Result = iota
	// Empty says that the socket holds nothing more: wait until it does, then read again.
	Empty
	// Done ends Serve.
	Done
)

// Serve calls read with the socket's descriptor within one rc.Read: again at once after More (or the errno
// EINTR), again once the socket is ready after Empty (or EAGAIN), and not again after Done or any other
// errno, whatever the Result with it. It returns nil after Done, that errno, or why waiting failed (a read
// deadline passed, the socket closed). read's system calls must not block; what it does with what it read
// may wait, but not for the socket to close (closing waits for the Read under way).
func Serve(rc syscall.RawConn, read func(fd uintptr) (Result, syscall.Errno)) error {
	var failed error
	err := rc.Read(func(fd uintptr) bool {
		for {
			res, e := read(fd)
			switch {
			case e == syscall.EAGAIN:
				return false
			case e == syscall.EINTR:
				continue
			case e != 0:
				failed = e
				return true
			case res == Empty:
				return false
			case res == Done:
				return true
			}
		}
	})
	if err != nil {
		return err
	}
	return failed
}
