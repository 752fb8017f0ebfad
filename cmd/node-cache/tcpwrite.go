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
	"time"

	"github.com/coredns/caddy"
	"github.com/nodelocaldns/nodelocaldns/internal/procfd"
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

// A client that connects and sends nothing costs CoreDNS's server a goroutine, a file descriptor, a read
// deadline and, when the read timeout closes it, a close; a hostile Pod that opens thousands at once and
// opens them again as they are closed makes the server accept and close them in bursts, and every other Pod's
// answers share the node's CPUs with those bursts (issue 27). A DNS client speaks first, so node-cache defers
// accepting: every TCP listener of the process gets TCP_DEFER_ACCEPT, and the kernel hands a connection to
// the server only once its first bytes have come. One that sends nothing stays a request in the listener's
// SYN queue, with no goroutine or file descriptor, until the deferral ends; then the kernel hands it over
// anyway, and the read timeout closes it as before. A connection that sends its query at once, as every
// resolver does, is accepted when the query comes, so nothing waits longer. The SYN queue holds as many as
// the listen backlog (net.core.somaxconn); beyond it the kernel answers with SYN cookies
// (net.ipv4.tcp_syncookies=1, its default), whose connections are accepted at once, as without the deferral:
// what a SYN flood can do to the queue, an idle client cannot do more of.

// tcpDeferAcceptEnv names the environment variable that sets the deferral: a Go duration in whole seconds,
// 0 to leave the listeners alone. The kernel counts it in retransmissions of its SYN-ACK, so it rounds it up to
// 1, 3, 7, 15, 31... seconds.
const tcpDeferAcceptEnv = "NODECACHE_TCP_DEFER_ACCEPT"

// defaultTCPDeferAccept is as long as CoreDNS's default read timeout: a connection that sends nothing is
// closed 6 s after it opened, and costs the server nothing for the first 3.
const defaultTCPDeferAccept = 3 * time.Second

// maxTCPDeferAccept is the longest deferral: past the SYN-ACK retransmissions the kernel makes (5 by default,
// 31 s), it drops a connection that sent nothing without telling the client.
const maxTCPDeferAccept = 30 * time.Second

// listenerOption is a TCP option node-cache sets on every TCP listener of the process.
type listenerOption struct {
	name  string // the option's name, for errors
	opt   int    // at level IPPROTO_TCP
	value int
}

// registerListenerOptions sets, after every start and reload of an instance, TCP_USER_TIMEOUT (by
// NODECACHE_TCP_WRITE_TIMEOUT or defaultTCPWriteTimeout) and TCP_DEFER_ACCEPT (by NODECACHE_TCP_DEFER_ACCEPT
// or defaultTCPDeferAccept) on every TCP listener.
func registerListenerOptions() error {
	opts, err := listenerOptions(os.Getenv)
	if err != nil {
		return err
	}
	if len(opts) == 0 {
		return nil
	}
	caddy.RegisterEventHook("nodecache-tcp-listener-options", func(event caddy.EventName, _ any) error {
		if event != caddy.InstanceStartupEvent {
			return nil
		}
		n, err := setListenerOptions(opts...)
		if err != nil {
			log.Warningf("setting the TCP listeners' options (%s, %s): %v", tcpWriteTimeoutEnv, tcpDeferAcceptEnv, err)
		}
		log.Debugf("%d TCP listeners have %v", n, opts)
		return nil
	})
	return nil
}

// listenerOptions returns the options the environment (read through getenv) asks for.
func listenerOptions(getenv func(string) string) ([]listenerOption, error) {
	write, err := parseTCPWriteTimeout(getenv(tcpWriteTimeoutEnv))
	if err != nil {
		return nil, err
	}
	deferral, err := parseTCPDeferAccept(getenv(tcpDeferAcceptEnv))
	if err != nil {
		return nil, err
	}
	var opts []listenerOption
	if write > 0 {
		opts = append(opts, listenerOption{"TCP_USER_TIMEOUT", unix.TCP_USER_TIMEOUT, int(write.Milliseconds())})
	}
	if deferral > 0 {
		opts = append(opts, listenerOption{"TCP_DEFER_ACCEPT", unix.TCP_DEFER_ACCEPT, int(deferral.Seconds())})
	}
	return opts, nil
}

func (o listenerOption) String() string { return fmt.Sprintf("%s %d", o.name, o.value) }

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

// parseTCPDeferAccept reads the value of NODECACHE_TCP_DEFER_ACCEPT; empty means the default.
func parseTCPDeferAccept(v string) (time.Duration, error) {
	if v == "" {
		return defaultTCPDeferAccept, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("%s=%q: %w", tcpDeferAcceptEnv, v, err)
	}
	if d < 0 || d > maxTCPDeferAccept || d%time.Second != 0 {
		return 0, fmt.Errorf("%s=%q: want 0 or whole seconds up to %v", tcpDeferAcceptEnv, v, maxTCPDeferAccept)
	}
	return d, nil
}

// setListenerOptions sets opts on every TCP socket of this process that listens, and returns on how many
// it set them. Setting them again on a listener that has them already changes nothing.
func setListenerOptions(opts ...listenerOption) (int, error) {
	socks, err := procfd.Sockets()
	if err != nil {
		return 0, err
	}
	n := 0
	var errs []error
	for _, s := range socks {
		fd := s.FD
		// A socket closed since the listing fails one of these and is passed over.
		if v, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN); err != nil || v != 1 {
			continue
		}
		// An MPTCP listener (multipathtcp above keeps them out) refuses TCP_USER_TIMEOUT and is reported.
		if v, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PROTOCOL); err != nil || (v != unix.IPPROTO_TCP && v != unix.IPPROTO_MPTCP) {
			continue
		}
		set := true
		for _, o := range opts {
			if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, o.opt, o.value); err != nil {
				errs = append(errs, fmt.Errorf("setting %s on listener %d: %w", o.name, fd, err))
				set = false
			}
		}
		if set {
			n++
		}
	}
	return n, errors.Join(errs...)
}
