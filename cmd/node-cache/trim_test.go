//go:build linux

package main

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
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

// TestTrimDropsUnmappedPages: after the trim, the executable's read-only mappings take random-read advice (a
// fault maps its own page, not the 64 KiB around it) and the pages of the executable no process maps have left
// the page cache. The test binary is written back first: the kernel drops clean pages only.
func TestTrimDropsUnmappedPages(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(exe)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	var fsType unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &fsType); err != nil {
		t.Fatal(err)
	}
	if fsType.Type == unix.TMPFS_MAGIC || fsType.Type == unix.RAMFS_MAGIC {
		t.Skipf("%s is on a file system held in memory, whose pages are never dropped", exe)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	cached := func() int {
		t.Helper()
		m, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = unix.Munmap(m) }()
		vec := make([]byte, (len(m)+os.Getpagesize()-1)/os.Getpagesize())
		if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
			t.Fatalf("mincore: %v", errno)
		}
		n := 0
		for _, v := range vec {
			n += int(v & 1)
		}
		return n
	}
	// Read the whole file, so that every page is cached before the trim.
	if _, err := io.Copy(io.Discard, io.NewSectionReader(f, 0, st.Size())); err != nil {
		t.Fatal(err)
	}
	before := cached()
	if _, err := unmapReadOnlyExecutablePages(); err != nil {
		t.Fatal(err)
	}
	after := cached()
	if after >= before/2 {
		t.Errorf("%d of the executable's pages cached after the trim, %d before: want fewer than half", after, before)
	}

	smaps, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	ranges, err := cleanReadOnlyMappingsOf(smaps, exe)
	if err != nil || len(ranges) == 0 {
		t.Fatalf("read-only mappings of %s: %v, %v", exe, ranges, err)
	}
	for _, r := range ranges {
		if flags := vmFlagsOf(t, smaps, r); !slices.Contains(flags, "rr") {
			t.Errorf("mapping %#x-%#x has VmFlags %v, want random-read advice (rr)", r.start, r.end, flags)
		}
	}
}

// vmFlagsOf returns the VmFlags that smaps (the text of /proc/PID/smaps) lists for the mapping r.
func vmFlagsOf(t *testing.T, smaps []byte, r addrRange) []string {
	t.Helper()
	head := fmt.Sprintf("%08x-%08x ", r.start, r.end)
	in := false
	for line := range strings.SplitSeq(string(smaps), "\n") {
		switch {
		case strings.HasPrefix(line, head):
			in = true
		case in && strings.HasPrefix(line, "VmFlags:"):
			return strings.Fields(strings.TrimPrefix(line, "VmFlags:"))
		}
	}
	t.Fatalf("no VmFlags for mapping %s", head)
	return nil
}
