//go:build linux

package nodelock

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestHandOff(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.lock")
	if _, err := Queue(path); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("Queue with no owner: %v, want ErrNotHeld", err)
	}
	owner, err := Acquire(path)
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Release()
	if ready, err := owner.SuccessorReady(); err != nil || ready {
		t.Fatalf("SuccessorReady with nobody in line: %v %v", ready, err)
	}

	next, err := Queue(path)
	if err != nil {
		t.Fatalf("Queue: %v", err)
	}
	defer next.Close()
	if next.Owner == "" {
		t.Error("the successor does not know who owns the node")
	}
	var queued *QueuedError
	if _, err := Queue(path); !errors.As(err, &queued) {
		t.Fatalf("a second successor: %v, want a QueuedError", err)
	}
	if ready, err := owner.SuccessorReady(); err != nil || ready {
		t.Fatalf("SuccessorReady before Ready: %v %v", ready, err)
	}
	// The owner holds on: Take waits.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	_, err = next.Take(ctx, 5*time.Millisecond)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Take while the owner holds the lock: %v", err)
	}
	if err := next.Ready(); err != nil {
		t.Fatal(err)
	}
	if ready, err := owner.SuccessorReady(); err != nil || !ready {
		t.Fatalf("SuccessorReady after Ready: %v %v", ready, err)
	}
	if orphaned, err := Orphaned(path); err != nil || orphaned {
		t.Fatalf("Orphaned with an owner and a successor: %v %v", orphaned, err)
	}

	if err := owner.Release(); err != nil {
		t.Fatal(err)
	}
	if orphaned, err := Orphaned(path); err != nil || orphaned {
		t.Fatalf("Orphaned while the successor is in line: %v %v", orphaned, err)
	}
	lock, err := next.Take(context.Background(), 5*time.Millisecond)
	if err != nil {
		t.Fatalf("Take after the owner let go: %v", err)
	}
	defer lock.Release()
	if _, err := Acquire(path); err == nil {
		t.Fatal("Acquire succeeded while the successor holds the lock")
	}
	if ready, err := lock.SuccessorReady(); err != nil || ready {
		t.Fatalf("the new owner sees a ready successor: %v %v", ready, err)
	}
	// The queue is free again for the next hand-off.
	again, err := Queue(path)
	if err != nil {
		t.Fatalf("Queue after a hand-off: %v", err)
	}
	again.Close()
}

func TestSuccessorThatLeavesOrphansNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.lock")
	owner, err := Acquire(path)
	if err != nil {
		t.Fatal(err)
	}
	next, err := Queue(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := next.Ready(); err != nil {
		t.Fatal(err)
	}
	owner.Release()
	// The successor dies (its file closes) before it takes the lock: the old owner finds the node orphaned.
	next.Close()
	orphaned, err := Orphaned(path)
	if err != nil || !orphaned {
		t.Fatalf("Orphaned after the successor left: %v %v", orphaned, err)
	}
	back, err := Acquire(path)
	if err != nil {
		t.Fatalf("the old owner takes its node back: %v", err)
	}
	back.Release()
}

// TestReadLocksAreNoSuccessor checks that read locks on the queue and ready bytes, all that a process
// which may only read the lock file can place, do not make a successor.
func TestReadLocksAreNoSuccessor(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.lock")
	owner, err := Acquire(path)
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Release()
	reader, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	if err := setRangeLock(reader, queueByte, unix.F_WRLCK); !errors.Is(err, unix.EBADF) {
		t.Fatalf("a write lock through a read-only descriptor: %v, want EBADF", err)
	}
	for _, b := range []int64{queueByte, readyByte} {
		if err := setRangeLock(reader, b, unix.F_RDLCK); err != nil {
			t.Fatalf("read lock on byte %d: %v", b, err)
		}
	}

	queued, err := owner.SuccessorQueued()
	if queued {
		t.Error("SuccessorQueued: a read lock counts as a successor in line")
	}
	if forged, ok := errors.AsType[*ForgedLockError](err); !ok || forged.Ready {
		t.Errorf("SuccessorQueued with a read lock on the queue byte: %v, want a ForgedLockError for the queue", err)
	}
	ready, err := owner.SuccessorReady()
	if ready {
		t.Error("SuccessorReady: a read lock counts as a ready successor")
	}
	if forged, ok := errors.AsType[*ForgedLockError](err); !ok || !forged.Ready {
		t.Errorf("SuccessorReady with a read lock on the ready byte: %v, want a ForgedLockError for readiness", err)
	}
	// A real successor is kept out of the queue, and told why.
	if s, err := Queue(path); err == nil {
		s.Close()
		t.Error("Queue succeeded beside a read lock on the queue byte")
	} else if _, ok := errors.AsType[*ForgedLockError](err); !ok {
		t.Errorf("Queue beside a read lock on the queue byte: %v, want a ForgedLockError", err)
	}
	// An owner that let go takes its node back: a read lock is not a successor it waits for.
	if err := owner.Release(); err != nil {
		t.Fatal(err)
	}
	if orphaned, err := Orphaned(path); err != nil || !orphaned {
		t.Errorf("Orphaned with only read locks on the file: %v %v, want true", orphaned, err)
	}
}

// TestTryTakeFindsAnOwnerThatStoppedFirst: a successor that is not ready yet takes a lock its owner let go
// of at the first try after, without waiting, and leaves the queue; while the owner holds it, it gets none.
func TestTryTakeFindsAnOwnerThatStoppedFirst(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.lock")
	owner, err := Acquire(path)
	if err != nil {
		t.Fatal(err)
	}
	next, err := Queue(path)
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	if l, err := next.TryTake(); err != nil || l != nil {
		t.Fatalf("TryTake while the owner holds the lock: %v, %v", l, err)
	}
	if queued, err := owner.SuccessorQueued(); err != nil || !queued {
		t.Fatalf("a TryTake that found the owner left the queue: %v %v", queued, err)
	}
	if err := owner.Release(); err != nil {
		t.Fatal(err)
	}
	l, err := next.TryTake()
	if err != nil || l == nil {
		t.Fatalf("TryTake after the owner let go: %v, %v", l, err)
	}
	defer l.Release()
	if _, err := Acquire(path); err == nil {
		t.Error("the lock TryTake took is free")
	}
	third, err := Queue(path)
	if err != nil {
		t.Fatalf("the queue is still taken after TryTake: %v", err)
	}
	third.Close()
}
