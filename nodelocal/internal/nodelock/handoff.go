//go:build linux

package nodelock

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A node changes hands without a moment in which nobody serves it: a successor (the new Pod of a rolling
// update that surges) queues at the owner's lock file, starts serving the same addresses beside the owner,
// says it is ready once it answers, and takes the lock when the owner lets go. The owner, seeing a ready
// successor, lets go and leaves the link, the addresses and the rules in place for it.
//
// The queue lives in the same file as the lock, so that the one hostPath volume that shares the lock
// between Pods shares it too: the successor holds an open file description lock (F_OFD_SETLK) on byte
// queueByte while it waits, and one on readyByte once it answers. OFD locks and flock are independent on
// Linux, so an owner of an older version, which knows only the flock, sees a plain second instance; and
// the kernel drops both kinds when their holder exits, however it exits: a successor that dies leaves no
// queue behind, and one that dies after it took the lock leaves a lock nobody holds.
//
// Both are write locks, which need a descriptor open for writing: a process that may only read the file
// can place read locks there and no more, and is never taken for a successor (see ForgedLockError).
const (
	queueByte = 1
	readyByte = 2
)

// QueuedError says that another successor is already waiting to take the node over.
type QueuedError struct {
	Path string
}

func (e *QueuedError) Error() string {
	return fmt.Sprintf("another instance is already waiting to take this node over (queued at %s)", e.Path)
}

// ForgedLockError says that a read lock sits on the queue byte or the ready byte, where a successor holds a
// write lock: a process that could only read the lock file poses as a successor in line or a ready one. It
// is not counted as one; while it holds on, no successor can queue (or say it is ready) there.
type ForgedLockError struct {
	Path string
	// Ready tells that the read lock is on the ready byte, not on the queue byte.
	Ready bool
}

func (e *ForgedLockError) Error() string {
	what, at := "a successor in line", queueByte
	if e.Ready {
		what, at = "a ready successor", readyByte
	}
	return fmt.Sprintf("node lock: a read lock on byte %d of %s poses as %s, but a successor holds a write lock, "+
		"which needs the file open for writing: this one was placed through a descriptor open only for reading", at, e.Path, what)
}

// Successor is a process waiting to take a node over from its owner.
type Successor struct {
	path string
	f    *os.File
	// Owner is what the owner wrote into the lock file when the successor queued.
	Owner string
}

// Queue puts the caller in line to succeed the owner of the lock at path, without waiting. It fails with a
// *QueuedError when another successor is in line, with a *ForgedLockError when a read lock poses as one,
// and with ErrNotHeld when nobody owns the node (the caller should Acquire instead).
func Queue(path string) (*Successor, error) {
	if path == "" {
		path = DefaultPath
	}
	f, err := openFile(path)
	if err != nil {
		return nil, err
	}
	if err := setRangeLock(f, queueByte, unix.F_WRLCK); err != nil {
		defer f.Close()
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EACCES) {
			if typ, _ := rangeLock(f, queueByte); typ == unix.F_RDLCK {
				return nil, &ForgedLockError{Path: path}
			}
			return nil, &QueuedError{Path: path}
		}
		return nil, fmt.Errorf("node lock: queue at %s: %w", path, err)
	}
	// Nobody owns the node: there is nothing to succeed.
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err == nil {
		f.Close()
		return nil, ErrNotHeld
	} else if !errors.Is(err, syscall.EWOULDBLOCK) {
		f.Close()
		return nil, fmt.Errorf("node lock: flock %s: %w", path, err)
	}
	owner, _ := readHolder(f)
	_ = ring(f) // the owner looks now and then too
	return &Successor{path: path, f: f, Owner: owner}, nil
}

// ErrNotHeld says that nobody holds the node lock.
var ErrNotHeld = errors.New("nobody owns this node")

// Ready tells the owner that the successor answers: an owner that watches (Lock.SuccessorReady) lets go.
func (s *Successor) Ready() error {
	if s.f == nil {
		return errors.New("node lock: successor closed")
	}
	if err := setRangeLock(s.f, readyByte, unix.F_WRLCK); err != nil {
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EACCES) {
			if typ, _ := rangeLock(s.f, readyByte); typ == unix.F_RDLCK {
				return &ForgedLockError{Path: s.path, Ready: true}
			}
		}
		return fmt.Errorf("node lock: mark the successor ready at %s: %w", s.path, err)
	}
	_ = ring(s.f)
	return nil
}

// Take waits until the owner lets go of the lock, polling every poll, takes it and leaves the queue. It
// returns the lock, or ctx's error: the successor then stays in line until Close.
func (s *Successor) Take(ctx context.Context, poll time.Duration) (*Lock, error) {
	t := time.NewTicker(poll)
	defer t.Stop()
	for {
		l, err := s.TryTake()
		if err != nil || l != nil {
			return l, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

// TryTake takes the lock and leaves the queue if the owner has let go, without waiting: a successor that
// has not said it is ready yet calls it to find an owner that stopped first. It returns nil while the owner
// holds the lock.
func (s *Successor) TryTake() (*Lock, error) {
	if s.f == nil {
		return nil, errors.New("node lock: successor closed")
	}
	if err := syscall.Flock(int(s.f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, nil
		}
		return nil, fmt.Errorf("node lock: flock %s: %w", s.path, err)
	}
	f := s.f
	s.f = nil
	if err := writeHolder(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("node lock: record holder in %s: %w", s.path, err)
	}
	// Leave the queue only now: an owner that finds neither a queue nor a lock takes its node back.
	_ = setRangeLock(f, readyByte, unix.F_UNLCK)
	_ = setRangeLock(f, queueByte, unix.F_UNLCK)
	return &Lock{path: s.path, f: f}, nil
}

// Close leaves the queue without taking the node. Closing twice, or after Take, is not an error.
func (s *Successor) Close() error {
	if s == nil || s.f == nil {
		return nil
	}
	f := s.f
	s.f = nil
	// Unlocked first, so that the owner the bell wakes finds the line empty.
	_ = setRangeLock(f, readyByte, unix.F_UNLCK)
	_ = setRangeLock(f, queueByte, unix.F_UNLCK)
	_ = ring(f)
	return f.Close()
}

// SuccessorReady reports whether a successor waits in line and has said that it answers. A read lock in
// its place is not one: it reports false and a *ForgedLockError.
func (l *Lock) SuccessorReady() (bool, error) {
	if l == nil || l.f == nil {
		return false, errors.New("node lock: not held")
	}
	return l.successor(readyByte)
}

// SuccessorQueued reports whether a successor waits in line, ready or not. A read lock in its place is not
// one: it reports false and a *ForgedLockError.
func (l *Lock) SuccessorQueued() (bool, error) {
	if l == nil || l.f == nil {
		return false, errors.New("node lock: not held")
	}
	return l.successor(queueByte)
}

// successor reports whether a successor holds the byte at offset (queueByte or readyByte).
func (l *Lock) successor(offset int64) (bool, error) {
	switch typ, err := rangeLock(l.f, offset); {
	case err != nil:
		return false, err
	case typ == unix.F_WRLCK:
		return true, nil
	case typ == unix.F_RDLCK:
		return false, &ForgedLockError{Path: l.path, Ready: offset == readyByte}
	default:
		return false, nil
	}
}

// Orphaned reports whether the node at path has neither an owner nor a successor in line: an owner that
// let go finds so when its successor died before it took the node. It takes the lock for a moment to
// find out, so a caller that gets true should Acquire at once. A read lock on the queue byte is not a
// successor (see ForgedLockError), and does not keep the node from being orphaned.
func Orphaned(path string) (bool, error) {
	if path == "" {
		path = DefaultPath
	}
	f, err := openFile(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	typ, err := rangeLock(f, queueByte)
	if err != nil || typ == unix.F_WRLCK {
		return false, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return false, nil
		}
		return false, fmt.Errorf("node lock: flock %s: %w", path, err)
	}
	return true, nil // closing f drops the flock
}

func setRangeLock(f *os.File, offset int64, typ int16) error {
	lk := unix.Flock_t{Type: typ, Whence: 0, Start: offset, Len: 1}
	return unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, &lk)
}

// rangeLock returns the type of a lock that another open file description holds on the byte at offset:
// F_UNLCK when there is none. It tests for a write lock, with which any lock conflicts, so that a read lock
// is found as one (F_RDLCK) and can be told from a write lock.
func rangeLock(f *os.File, offset int64) (int16, error) {
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: offset, Len: 1}
	if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_GETLK, &lk); err != nil {
		return unix.F_UNLCK, fmt.Errorf("node lock: test the lock on byte %d: %w", offset, err)
	}
	return lk.Type, nil
}
