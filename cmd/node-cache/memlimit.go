//go:build linux

package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"runtime/debug"
	"strconv"
	"strings"
)

// memoryLimitShare is the part of the container's memory limit the Go runtime is told to stay under. The
// rest is left for what the runtime does not count: the binary's own pages (reclaimable, but charged to
// the container) and the kernel's socket buffers.
const memoryLimitShare = 0.9

// applyMemoryLimit tells the Go runtime about the container's memory limit, so that it collects garbage
// harder as the heap nears the limit instead of growing into an OOM kill. GOMEMLIMIT, when set, wins: the
// runtime has already applied it. Without a limit (the cache container's default in the manifests) nothing
// changes. Errors only mean the limit is unknown; they are logged, never fatal.
func applyMemoryLimit() {
	if _, set := os.LookupEnv("GOMEMLIMIT"); set {
		return
	}
	limit, found, err := cgroupMemoryLimit(os.DirFS("/"))
	switch {
	case err != nil:
		log.Warningf("reading the cgroup memory limit: %v; the Go runtime runs without a memory limit", err)
	case found:
		soft := int64(float64(limit) * memoryLimitShare)
		debug.SetMemoryLimit(soft)
		log.Infof("container memory limit %d MiB; Go memory limit (GOMEMLIMIT) set to %d MiB", limit>>20, soft>>20)
	}
}

// defaultGCPercent is the collector's GOGC unless the environment sets one. Between collections the heap
// grows to 1.5 times the live heap instead of Go's default 2 times: on bench/memory.sh's load that is about
// 3 MiB less at the peak, for about twice as many collections (README, Memory, has both figures).
const defaultGCPercent = 50

// applyGCPercent sets the collector's GOGC to defaultGCPercent unless GOGC is set, which the runtime has
// already applied (GOGC=100 restores Go's default).
func applyGCPercent() {
	if percent, set := gcPercent(os.LookupEnv); set {
		debug.SetGCPercent(percent)
	}
}

// gcPercent returns the GOGC node-cache sets, and false when the environment (read through lookup) has one.
func gcPercent(lookup func(string) (string, bool)) (int, bool) {
	return unlessSet(lookup, "GOGC", defaultGCPercent)
}

// unlessSet returns value, a default of node-cache's for the runtime setting the environment variable name
// holds, and true; or false when the environment (read through lookup) sets name, which the runtime has
// applied already.
func unlessSet(lookup func(string) (string, bool), name string, value int) (int, bool) {
	if _, set := lookup(name); set {
		return 0, false
	}
	return value, true
}

// noLimitAbove is where cgroup v1 reports "no limit": the largest page-aligned int64.
const noLimitAbove = int64(1) << 62

// cgroupMemoryLimit returns the memory limit of this process's cgroup in bytes, and whether there is one.
// root is the file system holding /proc and /sys (os.DirFS("/"), or a test's tree). It reads cgroup v2's
// memory.max, or v1's memory.limit_in_bytes, of the cgroup /proc/self/cgroup names, falling back to the
// top of the mounted hierarchy, which is the container's own cgroup when the container has a cgroup
// namespace (the default on cgroup v2).
func cgroupMemoryLimit(root fs.FS) (int64, bool, error) {
	membership, err := fs.ReadFile(root, "proc/self/cgroup")
	if err != nil {
		return 0, false, fmt.Errorf("reading /proc/self/cgroup: %w", err)
	}
	v2Path, v1Path, v1 := "", "", false
	sc := bufio.NewScanner(bytes.NewReader(membership))
	for sc.Scan() {
		// hierarchy-ID:controller-list:cgroup-path
		id, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		controllers, cgroupPath, ok := strings.Cut(rest, ":")
		if !ok {
			continue
		}
		if id == "0" && controllers == "" {
			v2Path = cgroupPath
		}
		for c := range strings.SplitSeq(controllers, ",") {
			if c == "memory" {
				v1Path, v1 = cgroupPath, true
			}
		}
	}
	var candidates []string
	if v1 {
		candidates = []string{path.Join("sys/fs/cgroup/memory", v1Path, "memory.limit_in_bytes"), "sys/fs/cgroup/memory/memory.limit_in_bytes"}
	} else {
		candidates = []string{path.Join("sys/fs/cgroup", v2Path, "memory.max"), "sys/fs/cgroup/memory.max"}
	}
	for _, name := range candidates {
		raw, err := fs.ReadFile(root, name)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return 0, false, fmt.Errorf("reading /%s: %w", name, err)
		}
		value := strings.TrimSpace(string(raw))
		if value == "max" {
			return 0, false, nil
		}
		n, err := strconv.ParseInt(value, 10, 64)
		if err != nil || n <= 0 {
			return 0, false, fmt.Errorf("/%s holds %q, not a byte count", name, value)
		}
		if n >= noLimitAbove {
			return 0, false, nil
		}
		return n, true, nil
	}
	// No memory controller mounted (or not delegated): no limit this process can see.
	return 0, false, nil
}
