//go:build linux

package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"

	"github.com/coredns/caddy"
	"golang.org/x/sys/unix"
)

// Starting touches code and read-only data all over the binary (every package's init, every plugin's
// setup, client-go's scheme), and the kernel maps each touched page with its neighbours (fault-around, 64
// KiB by default), so after a start most of the binary's read-only pages are mapped and counted in RSS,
// although serving DNS runs a small part of them. Once an instance has started, node-cache unmaps its
// read-only mappings of its own executable (madvise MADV_DONTNEED): the pages stay in the page cache, where
// the kernel can reclaim them, and the ones serving needs are mapped again on first use, as a minor fault.
// Writable mappings (.data, .bss) are left alone, and so is a read-only one holding pages this process wrote
// before it became read-only (relocations of a dynamically linked build): MADV_DONTNEED would discard them.
//
// Unmapping alone would leave most of them mapped again soon: a fault on a file page maps every neighbour
// already in the page cache within 64 KiB (the kernel's fault-around), so a few touches in each window map it
// whole (on bench/memory.sh, 10 of the lean build's 16 MiB of read-only data and function tables a second
// after a start). So the read-only mappings are also marked MADV_RANDOM (a fault then reads only its own
// page, with no readahead), and the executable's pages no process maps any more are dropped from the page
// cache (POSIX_FADV_DONTNEED, which leaves mapped, dirty and locked pages alone): what serving touches
// afterwards comes back page by page, and RSS counts the pages it reads rather than the windows around
// them (3.4 of those 16 MiB a second after a start, 5 after 10,000 lookups). Code is not helped: the
// kernel reads executable pages in 64 KiB folios whatever the advice. The cost is a read from the image's
// file system for each page on its first use after a start instead of a minor fault, and, for another
// process running the same binary (the guard container), a read for each page it touches that was dropped
// while it did not map it; pages it maps stay cached, and fault-around maps them into this process again.
// On a file system held in memory (tmpfs) nothing is dropped and RSS is as with the unmapping alone.

// registerStartupTrim trims after every start and reload of an instance.
func registerStartupTrim() {
	caddy.RegisterEventHook("nodecache-trim", func(event caddy.EventName, _ any) error {
		if event == caddy.InstanceStartupEvent {
			trimAfterStart()
		}
		return nil
	})
}

// trimAfterStart returns what starting allocated and dropped (the Corefile's parse, client-go's setup, the
// previous instance on a reload) to the kernel now rather than when the scavenger gets to it, and unmaps the
// executable's read-only pages. The cache runs it after each start of an instance, the guard once it runs:
// the guard's pages of the binary, which its container shares with the cache's, would otherwise stay
// mapped and cached, and the cache's faults would map them again.
func trimAfterStart() {
	debug.FreeOSMemory()
	if n, err := unmapReadOnlyExecutablePages(); err != nil {
		log.Warningf("unmapping the pages touched while starting: %v", err)
	} else {
		log.Debugf("unmapped %d KiB of the executable's read-only pages touched while starting", n>>10)
	}
}

// unmapReadOnlyExecutablePages applies MADV_RANDOM and MADV_DONTNEED to every read-only mapping of this
// process's executable, then drops the executable's pages no process maps from the page cache, and returns
// how many bytes of mappings it unmapped.
func unmapReadOnlyExecutablePages() (int64, error) {
	exe, err := os.Executable()
	if err != nil {
		return 0, fmt.Errorf("finding the executable: %w", err)
	}
	smaps, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		return 0, fmt.Errorf("reading /proc/self/smaps: %w", err)
	}
	ranges, err := cleanReadOnlyMappingsOf(smaps, exe)
	if err != nil {
		return 0, err
	}
	var total int64
	for _, r := range ranges {
		for _, advice := range []uintptr{syscall.MADV_RANDOM, syscall.MADV_DONTNEED} {
			if err := madvise(r, advice); err != nil {
				return total, err
			}
		}
		total += int64(r.end - r.start)
	}
	if len(ranges) > 0 {
		if err := dropUnmappedPages(exe); err != nil {
			return total, err
		}
	}
	return total, nil
}

func madvise(r addrRange, advice uintptr) error {
	if _, _, errno := syscall.Syscall(syscall.SYS_MADVISE, r.start, r.end-r.start, advice); errno != 0 {
		return fmt.Errorf("madvise(%d) %#x-%#x: %w", advice, r.start, r.end, errno)
	}
	return nil
}

// dropUnmappedPages drops the clean pages of the file at path that no process maps from the page cache.
func dropUnmappedPages(path string) error {
	f, err := os.Open(path) // #nosec G304 -- this process's own executable
	if err != nil {
		return fmt.Errorf("opening the executable to drop its unmapped pages: %w", err)
	}
	defer func() { _ = f.Close() }()
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		return fmt.Errorf("dropping the executable's unmapped pages (fadvise): %w", err)
	}
	return nil
}

type addrRange struct{ start, end uintptr }

// cleanReadOnlyMappingsOf returns the mappings in smaps (the text of /proc/PID/smaps) of the file path that
// can be neither written nor shared and hold no anonymous (written) pages: the binary's code, read-only data
// and function tables, which MADV_DONTNEED only unmaps.
func cleanReadOnlyMappingsOf(smaps []byte, path string) ([]addrRange, error) {
	var ranges []addrRange
	candidate := false // whether the mapping whose fields are being read is the last of ranges
	sc := bufio.NewScanner(bytes.NewReader(smaps))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		if lo, hi, isMapping := strings.Cut(f[0], "-"); isMapping && len(f) >= 5 {
			// A mapping's first line: address perms offset dev inode [pathname].
			candidate = false
			if len(f) < 6 || strings.Join(f[5:], " ") != path {
				continue
			}
			if perms := f[1]; len(perms) != 4 || perms[0] != 'r' || perms[1] != '-' || perms[3] != 'p' {
				continue
			}
			start, err1 := strconv.ParseUint(lo, 16, 64)
			end, err2 := strconv.ParseUint(hi, 16, 64)
			if err1 != nil || err2 != nil || end <= start {
				return nil, fmt.Errorf("unreadable mapping %q", sc.Text())
			}
			ranges = append(ranges, addrRange{uintptr(start), uintptr(end)})
			candidate = true
			continue
		}
		if candidate && f[0] == "Anonymous:" && (len(f) < 2 || f[1] != "0") {
			ranges = ranges[:len(ranges)-1] // written pages: leave this mapping alone
			candidate = false
		}
	}
	return ranges, sc.Err()
}
