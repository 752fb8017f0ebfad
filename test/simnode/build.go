//go:build linux

package simnode

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"
)

// SharedBuild is the node-cache binary of a test binary: built (BuildNodeCache) on the first Binary call,
// kept for every test of the package, and removed by Remove, which the package's TestMain calls after
// m.Run.
type SharedBuild struct {
	// Prefix starts the name of the temporary directory the binaries go to.
	Prefix string
	// Check, when set, checks the binary once it is built (a plugin it must have, say).
	Check func(binary string) error

	once sync.Once
	dir  string
	path string
	err  error
}

// buildTimeout bounds building both binaries.
const buildTimeout = 5 * time.Minute

// Binary returns the lean node-cache binary, building it on first use; it fails tb when the build or the
// check failed.
func (b *SharedBuild) Binary(tb testing.TB) string {
	tb.Helper()
	b.once.Do(func() {
		b.dir, b.err = os.MkdirTemp("", b.Prefix) //nolint:usetesting // one build for every test of the package, removed by Remove
		if b.err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
		defer cancel()
		if b.path, b.err = BuildNodeCache(ctx, b.dir); b.err == nil && b.Check != nil {
			b.err = b.Check(b.path)
		}
	})
	if b.err != nil {
		tb.Fatal(b.err)
	}
	return b.path
}

// Remove deletes the binaries, if they were built.
func (b *SharedBuild) Remove() {
	if b.dir != "" {
		os.RemoveAll(b.dir)
	}
}
