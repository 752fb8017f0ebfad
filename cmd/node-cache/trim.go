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
)

// Starting touches code and read-only data all over the binary (every package's init, every plugin's
// setup, client-go's scheme), and the kernel maps each touched page with its neighbours (fault-around, 64
// KiB by default), so after a start most of the binary's read-only pages are mapped and counted in RSS,
// although serving DNS runs a small part of them. Once an instance has started, node-cache unmaps its
// read-only mappings of its own executable (madvise MADV_DONTNEED): the pages stay in the page cache, where
// the kernel can reclaim them, and the ones serving needs are mapped again on first use, as a minor fault.
// Writable mappings (.data, .bss) are left alone, and so is a read-only one holding pages this process wrote
// before it became read-only (relocations of a dynamically linked build): MADV_DONTNEED would discard them.

// registerStartupTrim unmaps the executable's read-only pages after every start and reload of an instance.
func registerStartupTrim() {
	caddy.RegisterEventHook("nodecache-trim", func(event caddy.EventName, _ any) error {
		if event != caddy.InstanceStartupEvent {
			return nil
		}
		// What starting allocated and dropped (the Corefile's parse, client-go's setup, the previous
		// instance on a reload) goes back to the kernel now rather than when the scavenger gets to it.
		debug.FreeOSMemory()
		if n, err := unmapReadOnlyExecutablePages(); err != nil {
			log.Warningf("unmapping the pages touched while starting: %v", err)
		} else {
			log.Debugf("unmapped %d KiB of the executable's read-only pages touched while starting", n>>10)
		}
		return nil
	})
}

// unmapReadOnlyExecutablePages applies MADV_DONTNEED to every read-only mapping of this process's executable
// and returns how many bytes of mappings that covered.
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
		if _, _, errno := syscall.Syscall(syscall.SYS_MADVISE, r.start, r.end-r.start, syscall.MADV_DONTNEED); errno != 0 {
			return total, fmt.Errorf("madvise %#x-%#x: %w", r.start, r.end, errno)
		}
		total += int64(r.end - r.start)
	}
	return total, nil
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
