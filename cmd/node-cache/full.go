//go:build linux

package main

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
)

// The image ships two builds of node-cache. The lean one, /node-cache, is what the manifests start: it leaves
// out the plugins in fullOnlyDirectives (trace, whose tracing libraries cost about 6 MiB of resident memory
// on every node, used or not; README, Memory). The full one, /node-cache-full, has every plugin upstream's
// node-cache image has. When the Corefile uses a plugin only the full build has, the lean one execs the full
// one at start, with the same arguments, environment and process ID; when a ConfigMap change brings such a
// plugin in later, the lean one stops as on SIGTERM (handing over without losing lookups) so that its
// container restarts, and the restart runs the full one. A ConfigMap written for upstream's image therefore
// works unchanged, and a node whose Corefile does not trace pays only for the lean build.

// leanLeavesOut are the directives of the full build that the lean build (-tags nodecache_lean) leaves out:
// build_full.go's imports. TestLeanBuildPairIsComplete keeps the two builds and this list in step.
var leanLeavesOut = []string{"trace"}

// fullBuildSuffix names the full build beside the lean one: /node-cache execs /node-cache-full.
const fullBuildSuffix = "-full"

// buildPair is what a build knows of the other build in its image.
type buildPair struct {
	// fullOnly are the directives only the full build has; empty in the full build itself.
	fullOnly []string
	// execFull replaces this process by the full build; it returns only on failure.
	execFull func(missing []string) error
	// stop ends this process as SIGTERM does, so that its container restarts.
	stop func()
}

// thisBuild is the pair as the running binary sees it.
func thisBuild() buildPair {
	return buildPair{
		fullOnly: fullOnlyDirectives,
		execFull: execFullBuild,
		stop:     func() { _ = syscall.Kill(os.Getpid(), syscall.SIGTERM) },
	}
}

// needsFull returns the directives of corefile that only the full build has, in the order they appear, each
// once. A Corefile that does not parse needs nothing: CoreDNS reports what is wrong with it.
func (b buildPair) needsFull(corefile []byte) []string {
	if len(b.fullOnly) == 0 {
		return nil
	}
	var missing []string
	for _, name := range corefileDirectives(corefile) {
		if slices.Contains(b.fullOnly, name) && !slices.Contains(missing, name) {
			missing = append(missing, name)
		}
	}
	return missing
}

// runFullIfNeeded execs the full build when corefile uses a directive only it has.
func (b buildPair) runFullIfNeeded(corefile []byte) error {
	missing := b.needsFull(corefile)
	if len(missing) == 0 {
		return nil
	}
	return b.execFull(missing)
}

// restartForFull is the drop-in's answer to a Corefile after the first: when it uses a directive only the full
// build has, this process cannot reload onto it, so it stops (as SIGTERM does: handing over or draining, per
// the flags) and reports true; the container's restart execs the full build, which loads the new Corefile.
func (b buildPair) restartForFull(corefile []byte) bool {
	missing := b.needsFull(corefile)
	if len(missing) == 0 {
		return false
	}
	log.Warningf("the Corefile now uses %s, which this lean build leaves out: stopping, so that the container "+
		"restarts on the full build (node-cache%s)", strings.Join(missing, ", "), fullBuildSuffix)
	b.stop()
	return true
}

// execFullBuild replaces this process by the full build beside the executable, with the same arguments
// and environment. It returns only when that fails: a Corefile this build cannot load is never served by it.
func execFullBuild(missing []string) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("the Corefile uses %s, which this lean build leaves out, and the full build cannot be found: %w",
			strings.Join(missing, ", "), err)
	}
	full := self + fullBuildSuffix
	log.Infof("the Corefile uses %s, which this lean build leaves out: running %s in its place", strings.Join(missing, ", "), full)
	// #nosec G702 -- the full build beside this executable, with this process's own arguments and environment.
	err = syscall.Exec(full, append([]string{full}, os.Args[1:]...), os.Environ())
	return fmt.Errorf("the Corefile uses %s, which this lean build leaves out: running the full build %s: %w",
		strings.Join(missing, ", "), full, err)
}

// plainCorefile returns the Corefile plain CoreDNS (no -localip) is about to load: -conf's file, or
// ./Corefile, as CoreDNS's loader looks for it. It returns nil when there is none to read (stdin, a missing
// file): CoreDNS then reports the problem itself, and a lean build cannot take stdin over to the full one.
func plainCorefile(fs *flag.FlagSet) []byte {
	path := "Corefile"
	if f := fs.Lookup("conf"); f != nil && f.Value.String() != "" {
		path = f.Value.String()
	}
	if path == "stdin" {
		return nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	return data
}
