//go:build linux

package nodelock

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// bellBound bounds the wait for a ring; it only decides when the test gives up.
const bellBound = 10 * time.Second

// The owner's bell rings when a successor queues, says it is ready and leaves the line, and the owner then
// finds the line as the successor left it.
func TestBellRingsForEverySuccessorStep(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nodelocaldns.lock")
	owner, err := Acquire(path)
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Release()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	bell, err := Bell(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	await := func(step string, queued, ready bool) {
		t.Helper()
		select {
		case _, ok := <-bell:
			if !ok {
				t.Fatalf("%s: the bell's channel closed", step)
			}
		case <-time.After(bellBound):
			t.Fatalf("%s: no ring within %v", step, bellBound)
		}
		if q, err := owner.SuccessorQueued(); err != nil || q != queued {
			t.Errorf("%s: queued %v %v, want %v", step, q, err, queued)
		}
		if r, err := owner.SuccessorReady(); err != nil || r != ready {
			t.Errorf("%s: ready %v %v, want %v", step, r, err, ready)
		}
	}
	s, err := Queue(path)
	if err != nil {
		t.Fatal(err)
	}
	await("queued", true, false)
	if err := s.Ready(); err != nil {
		t.Fatal(err)
	}
	await("ready", true, true)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	await("left", false, false)
	cancel()
	select {
	case _, ok := <-bell:
		if ok {
			// A ring that was waiting; the close follows.
			if _, ok := <-bell; ok {
				t.Error("the bell's channel stays open after its context ended")
			}
		}
	case <-time.After(bellBound):
		t.Error("the bell's channel stays open after its context ended")
	}
}

// Closed tells of the owner letting go (as its process's end does, however it ends), and its channel closes
// once the file is removed.
func TestClosedTellsOfTheOwnerGoing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nodelocaldns.lock")
	owner, err := Acquire(path)
	if err != nil {
		t.Fatal(err)
	}
	closed, err := Closed(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	if err := owner.Release(); err != nil {
		t.Fatal(err)
	}
	select {
	case _, ok := <-closed:
		if !ok {
			t.Fatal("the channel closed instead of telling of the owner")
		}
	case <-time.After(bellBound):
		t.Fatalf("nothing within %v of the owner letting go", bellBound)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(bellBound)
	for {
		select {
		case _, ok := <-closed:
			if !ok {
				return
			}
		case <-deadline:
			t.Fatalf("the channel stays open %v after the file was removed", bellBound)
		}
	}
}
