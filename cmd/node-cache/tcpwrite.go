//go:build linux

// TCP_USER_TIMEOUT, which bounds the writes below, is a TCP option that Linux's MPTCP sockets refuse, and
// Go listens with MPTCP by default since 1.24 where the kernel has it. Nothing reaches a node-local cache
// over several paths, so its listeners are plain TCP.
//
//go:debug multipathtcp=0

package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/coredns/caddy"
	"golang.org/x/sys/unix"
)

// CoreDNS gives its TCP servers a write timeout (5 s, or the timeouts plugin's `write`) and hands it to
// miekg/dns, whose TCP server never sets a write deadline: a client that sends queries and stops reading the
// answers blocks the goroutine writing to it, and keeps that goroutine, the connection's file descriptor and
// the answers it did not read for as long as it keeps the connection open (the read and idle timeouts apply
// only while the server waits for a query). node-cache bounds that write in the kernel instead: every TCP
// socket of the process that listens gets TCP_USER_TIMEOUT, which the connections it accepts inherit, so a
// connection whose sent data stays unacknowledged that long (the client's receive window closed, or the
// client gone) is aborted and the blocked write returns. A client that reads keeps its connection: its
// kernel acknowledges what arrives as long as there is room to put it.

// tcpWriteTimeoutEnv names the environment variable that sets the bound: a Go duration, 0 to leave the
// listeners alone.
const tcpWriteTimeoutEnv = "NODECACHE_TCP_WRITE_TIMEOUT" //nolint:gosec // a variable's name, not a credential

// defaultTCPWriteTimeout is CoreDNS's default write timeout, the one its TCP servers mean to apply.
const defaultTCPWriteTimeout = 5 * time.Second

// registerTCPWriteTimeout bounds the writes of every TCP listener after every start and reload of an
// instance, by NODECACHE_TCP_WRITE_TIMEOUT or defaultTCPWriteTimeout.
func registerTCPWriteTimeout() error {
	d, err := parseTCPWriteTimeout(os.Getenv(tcpWriteTimeoutEnv))
	if err != nil {
		return err
	}
	if d == 0 {
		return nil
	}
	caddy.RegisterEventHook("nodecache-tcp-write-timeout", func(event caddy.EventName, _ any) error {
		if event != caddy.InstanceStartupEvent {
			return nil
		}
		n, err := setListenersUserTimeout(d)
		if err != nil {
			log.Warningf("bounding the TCP listeners' writes to %v (%s): %v", d, tcpWriteTimeoutEnv, err)
		}
		log.Debugf("%d TCP listeners abort a connection whose answers stay unread for %v", n, d)
		return nil
	})
	return nil
}

// parseTCPWriteTimeout reads the value of NODECACHE_TCP_WRITE_TIMEOUT; empty means the default.
func parseTCPWriteTimeout(v string) (time.Duration, error) {
	if v == "" {
		return defaultTCPWriteTimeout, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("%s=%q: %w", tcpWriteTimeoutEnv, v, err)
	}
	if d < 0 || (d > 0 && d < time.Millisecond) || d.Milliseconds() > int64(^uint32(0)>>1) {
		return 0, fmt.Errorf("%s=%q: want 0 or a duration from 1ms to %v", tcpWriteTimeoutEnv, v, time.Duration(^uint32(0)>>1)*time.Millisecond)
	}
	return d, nil
}

// setListenersUserTimeout sets TCP_USER_TIMEOUT to d on every TCP socket of this process that listens, and
// returns how many it set. Setting it again on a listener that has it already changes nothing.
func setListenersUserTimeout(d time.Duration) (int, error) {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return 0, fmt.Errorf("listing this process's files: %w", err)
	}
	n := 0
	var errs []error
	for _, e := range entries {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		// A file closed since the listing fails one of these and is passed over.
		if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err != nil || !strings.HasPrefix(target, "socket:") {
			continue
		}
		if v, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN); err != nil || v != 1 {
			continue
		}
		// An MPTCP listener (multipathtcp above keeps them out) refuses the option and is reported.
		if v, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PROTOCOL); err != nil || (v != unix.IPPROTO_TCP && v != unix.IPPROTO_MPTCP) {
			continue
		}
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(d.Milliseconds())); err != nil {
			errs = append(errs, fmt.Errorf("setting TCP_USER_TIMEOUT on listener %d: %w", fd, err))
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}
