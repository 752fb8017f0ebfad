//go:build linux

package main

import (
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestCleanReadOnlyMappingsOf(t *testing.T) {
	smaps := `00400000-01530000 r-xp 00000000 fe:01 123 /node-cache
Size:              17600 kB
Rss:               13440 kB
Anonymous:             0 kB
VmFlags: rd ex mr mw me sd
01530000-02834000 r--p 01130000 fe:01 123 /node-cache
Size:              19468 kB
Anonymous:             0 kB
02834000-028ec000 rw-p 02434000 fe:01 123 /node-cache
Anonymous:           188 kB
02900000-02a00000 r--p 02500000 fe:01 123 /node-cache
Anonymous:            12 kB
7f0000000000-7f0000100000 r--p 00000000 fe:01 456 /usr/lib/other.so
Anonymous:             0 kB
7f0000100000-7f0000200000 rw-p 00000000 00:00 0
Anonymous:          1024 kB
03000000-03001000 r--p 00000000 fe:01 789 /node-cache (deleted)
Anonymous:             0 kB
`
	got, err := cleanReadOnlyMappingsOf([]byte(smaps), "/node-cache")
	if err != nil {
		t.Fatal(err)
	}
	// Code and read-only data only: not the writable .data, not the read-only mapping with written
	// (relocated) pages, not another file's.
	want := []addrRange{{0x400000, 0x1530000}, {0x1530000, 0x2834000}}
	if !slices.Equal(got, want) {
		t.Errorf("got %x, want %x", got, want)
	}
	if _, err := cleanReadOnlyMappingsOf([]byte("zz-01 r--p 0 fe:01 1 /node-cache\n"), "/node-cache"); err == nil {
		t.Error("an unreadable address range was accepted")
	}
}

// rssFileKiB returns RssFile from /proc/self/status.
func rssFileKiB(t *testing.T) int {
	t.Helper()
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "RssFile:"); ok {
			n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no RssFile in /proc/self/status")
	return 0
}

// TestUnmapReadOnlyExecutablePages unmaps this test binary's own read-only pages: the process goes on running
// (its code is mapped back as it runs) and holds fewer of its executable's pages than before.
func TestUnmapReadOnlyExecutablePages(t *testing.T) {
	before := rssFileKiB(t)
	n, err := unmapReadOnlyExecutablePages()
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Fatal("no mapping of the executable was unmapped")
	}
	after := rssFileKiB(t)
	if after >= before {
		t.Errorf("RssFile %d KiB before, %d KiB after unmapping %d KiB of mappings", before, after, n>>10)
	}
	// Still running the unmapped code and reading the unmapped data.
	if got, err := cleanReadOnlyMappingsOf([]byte("00400000-00401000 r-xp 0 fe:01 1 /x\n"), "/x"); err != nil || len(got) != 1 {
		t.Errorf("after unmapping: %v, %v", got, err)
	}
}
