//go:build linux

// Package drain hands a DNS server's listeners over to a successor process without losing a query.
//
// CoreDNS opens its UDP sockets and TCP listeners with SO_REUSEPORT, so a successor binds the same address
// and port beside the running server, and the kernel spreads new packets and connections over both by a
// hash. Closing a socket in such a group drops what is queued on it (UDP) or resets what waits in its
// accept queue (TCP). So the successor, once it owns the node, attaches a classic BPF program to each
// group (SO_ATTACH_REUSEPORT_CBPF) that sends everything new to its own socket: the sockets of a group are
// indexed in the order they joined, the successor's joined last, and a program that returns an index sends
// the packet there. The old server's sockets then only empty, and it closes them once they are idle
// (Idle). When the old sockets are gone the program is replaced by one that returns an index out of range,
// which makes the kernel fall back to its hash: the next successor starts from the usual spreading.
//
// TCP listeners take the same program, through a plain TCP listener of the group: an MPTCP listener
// refuses it (EOPNOTSUPP), and is not matched to its descriptor here either, since the kernel lists its TCP
// subflow listener under another inode. The succession does not steer TCP groups: a TCP listener that closes
// hands the connections waiting in its accept queue to another listener of its group instead of resetting
// them when net.ipv4.tcp_migrate_req is 1 (Linux 5.14 and later); MigrateListeners turns that on.
//
// Everything here reads /proc of the calling process and its network namespace (and lists TCP listeners
// through sock_diag, tcpListeners), and works on the socket file descriptors the process already has; it
// needs no capability.
package drain

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/nodelocaldns/nodelocaldns/internal/procfd"
	"golang.org/x/sys/unix"
)

// Network is "udp" or "tcp".
type Network string

// The networks of a DNS server's sockets.
const (
	UDP Network = "udp"
	TCP Network = "tcp"
)

// Socket is a UDP socket or a TCP listener bound to a local address and port.
type Socket struct {
	Network Network
	Local   netip.AddrPort
	Inode   uint64
	// Queued is what waits to be read: bytes of datagrams (UDP) or connections not yet accepted (TCP).
	Queued uint64
	// FD is the calling process's file descriptor of the socket, or -1 when it is another process's.
	FD int
}

// tcpListen is the kernel's state of a listening TCP socket (TCP_LISTEN, which tcpListeners asks sock_diag
// for); udpClose that of an unconnected UDP socket in /proc/net/udp.
const (
	tcpListen = 0x0A
	udpClose  = 0x07
)

// Group returns the sockets of the network namespace bound to local: its reuseport group (unconnected UDP
// sockets, or TCP listeners), in no particular order. Sockets of the calling process have their FD set.
func Group(network Network, local netip.AddrPort) ([]Socket, error) {
	all, err := sockets(network)
	if err != nil {
		return nil, err
	}
	own, err := ownInodes()
	if err != nil {
		return nil, err
	}
	local = netip.AddrPortFrom(local.Addr().Unmap(), local.Port())
	var out []Socket
	for _, s := range all {
		if s.Local != local {
			continue
		}
		s.FD = -1
		if fd, ok := own[s.Inode]; ok {
			s.FD = fd
		}
		out = append(out, s)
	}
	return out, nil
}

// Own returns the calling process's sockets in the group of local.
func Own(network Network, local netip.AddrPort) ([]Socket, error) {
	group, err := Group(network, local)
	if err != nil {
		return nil, err
	}
	var own []Socket
	for _, s := range group {
		if s.FD >= 0 {
			own = append(own, s)
		}
	}
	return own, nil
}

// SteerTo makes the kernel send every new UDP packet or TCP connection for local to the socket at index in
// its reuseport group, through one of the calling process's sockets in it. Indexes follow the order the
// sockets joined, except that a socket leaving the group hands its index to the last one; so the caller
// should check where packets land (a probe) rather than trust an index it computed.
func SteerTo(network Network, local netip.AddrPort, index uint32) error {
	if err := attachOwn(network, local, index); err != nil {
		return fmt.Errorf("steer %s %s to socket %d of its group: %w", network, local, index, err)
	}
	return nil
}

// attachOwn sets the program of the group of local through the first of this process's sockets in it
// that takes one.
func attachOwn(network Network, local netip.AddrPort, index uint32) error {
	own, err := Own(network, local)
	if err != nil {
		return err
	}
	if len(own) == 0 {
		return fmt.Errorf("no %s socket of this process is bound to %s", network, local)
	}
	for _, s := range own {
		if err = attach(s.FD, index); err == nil {
			return nil
		}
	}
	return err
}

// MigrateReq is the sysctl that makes a closing TCP listener hand its accept queue to another listener of
// its reuseport group.
const MigrateReq = "/proc/sys/net/ipv4/tcp_migrate_req"

// MigrateListeners turns net.ipv4.tcp_migrate_req on in the calling process's network namespace, and
// returns a function that puts back the value it had before any cache turned it on, for once the
// listeners it was for have closed. The value before is kept in the file state (beside the node lock, so
// that every cache on the node finds it): a chain of successors, each turning it on while its
// predecessor's listeners close, restores the node's own value at the end, whichever of them gets there.
// It returns a nil function when the setting was on before any cache touched it. It fails where /proc/sys
// is read-only (a container that is not privileged) or the kernel predates the setting (5.14).
func MigrateListeners(state string) (restore func() error, err error) {
	b, err := os.ReadFile(MigrateReq)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", MigrateReq, err)
	}
	now := strings.TrimSpace(string(b))
	saved, err := os.ReadFile(state)
	switch {
	case err == nil:
		// An earlier cache turned it on and has not put it back yet.
	case !errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("read %s: %w", state, err)
	case now == "1":
		return nil, nil // the node's own setting
	default:
		saved = []byte(now)
		if err := os.WriteFile(state, saved, 0o600); err != nil { //nolint:gosec // the path is the cache's own setting, beside its node lock
			return nil, fmt.Errorf("record the value of %s in %s: %w", MigrateReq, state, err)
		}
	}
	if now != "1" {
		if err := writeSysctl("1"); err != nil {
			return nil, err
		}
	}
	was := strings.TrimSpace(string(saved))
	return func() error {
		if err := writeSysctl(was); err != nil {
			return err
		}
		if err := os.Remove(state); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove %s: %w", state, err)
		}
		return nil
	}, nil
}

func writeSysctl(value string) error {
	if err := os.WriteFile(MigrateReq, []byte(value+"\n"), 0o644); err != nil { //nolint:gosec // a sysctl: the file exists, the mode is unused
		return fmt.Errorf("set %s to %s: %w", MigrateReq, value, err)
	}
	return nil
}

// Unsteer gives the group of local back to the kernel's hash. It is a no-op for a group without a program.
func Unsteer(network Network, local netip.AddrPort) error {
	// An index no group can have: the kernel then picks by hash, as without a program.
	if err := attachOwn(network, local, ^uint32(0)); err != nil {
		return fmt.Errorf("give %s %s back to the kernel's hash: %w", network, local, err)
	}
	return nil
}

// attach sets the group's program to one that returns index for every packet or connection.
func attach(fd int, index uint32) error {
	ret := unix.SockFilter{Code: unix.BPF_RET | unix.BPF_K, K: index}
	prog := unix.SockFprog{Len: 1, Filter: &ret}
	return unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_REUSEPORT_CBPF, &prog)
}

// Idle reports whether none of the calling process's sockets bound to the endpoints has anything queued.
// A UDP socket's queue is read from the socket itself (SIOCINQ), a listener's accept queue from /proc.
func Idle(network Network, endpoints []netip.AddrPort) (bool, error) {
	for _, e := range endpoints {
		own, err := Own(network, e)
		if err != nil {
			return false, err
		}
		for _, s := range own {
			if s.Queued > 0 {
				return false, nil
			}
			if network == UDP {
				n, err := unix.IoctlGetInt(s.FD, unix.SIOCINQ)
				if err != nil && !errors.Is(err, unix.EBADF) {
					return false, fmt.Errorf("read the queue of %s %s: %w", network, e, err)
				}
				if n > 0 {
					return false, nil
				}
			}
		}
	}
	return true, nil
}

// ownInodes maps the inode of each socket the calling process has open to its file descriptor
// (procfd.Sockets, cheap enough for a look at a group on a node with thousands of open connections).
func ownInodes() (map[uint64]int, error) {
	socks, err := procfd.Sockets()
	if err != nil {
		return nil, err
	}
	out := make(map[uint64]int, len(socks))
	for _, s := range socks {
		out[s.Inode] = s.FD
	}
	return out, nil
}

// sockets reads the unconnected UDP sockets of both families from /proc/net, or the TCP listeners
// (tcpListeners).
func sockets(network Network) ([]Socket, error) {
	if network == TCP {
		return tcpListeners()
	}
	want := udpClose
	var out []Socket
	for _, file := range []string{string(network), string(network) + "6"} {
		f, err := os.Open(filepath.Join("/proc/net", file))
		if errors.Is(err, os.ErrNotExist) && strings.HasSuffix(file, "6") {
			continue // no IPv6
		}
		if err != nil {
			return nil, fmt.Errorf("list %s sockets: %w", network, err)
		}
		s := bufio.NewScanner(f)
		s.Buffer(make([]byte, 0, 1024), 1<<20)
		first := true
		for s.Scan() {
			if first {
				first = false // the header
				continue
			}
			sock, state, err := parseSocketLine(s.Text())
			if err != nil {
				f.Close()
				return nil, fmt.Errorf("parse /proc/net/%s: %w", file, err)
			}
			if state != want {
				continue
			}
			sock.Network = network
			out = append(out, sock)
		}
		err = s.Err()
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("read /proc/net/%s: %w", file, err)
		}
	}
	return out, nil
}

// parseSocketLine parses "sl local rem st tx:rx tr:when retrnsmt uid timeout inode ...".
func parseSocketLine(line string) (Socket, int, error) {
	f := strings.Fields(line)
	if len(f) < 10 {
		return Socket{}, 0, fmt.Errorf("short line %q", line)
	}
	local, err := parseHexAddrPort(f[1])
	if err != nil {
		return Socket{}, 0, err
	}
	state, err := strconv.ParseUint(f[3], 16, 8)
	if err != nil {
		return Socket{}, 0, fmt.Errorf("state %q: %w", f[3], err)
	}
	_, rx, ok := strings.Cut(f[4], ":")
	if !ok {
		return Socket{}, 0, fmt.Errorf("queues %q", f[4])
	}
	queued, err := strconv.ParseUint(rx, 16, 64)
	if err != nil {
		return Socket{}, 0, fmt.Errorf("receive queue %q: %w", rx, err)
	}
	inode, err := strconv.ParseUint(f[9], 10, 64)
	if err != nil {
		return Socket{}, 0, fmt.Errorf("inode %q: %w", f[9], err)
	}
	return Socket{Local: local, Inode: inode, Queued: queued}, int(state), nil
}

// parseHexAddrPort parses /proc/net's "0A14FEA9:0035": the address as 32-bit words in host byte order,
// the port in hex.
func parseHexAddrPort(s string) (netip.AddrPort, error) {
	h, p, ok := strings.Cut(s, ":")
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("address %q", s)
	}
	raw, err := hex.DecodeString(h)
	if err != nil || (len(raw) != 4 && len(raw) != 16) {
		return netip.AddrPort{}, fmt.Errorf("address %q", s)
	}
	b := make([]byte, len(raw))
	for i := 0; i < len(raw); i += 4 {
		binary.NativeEndian.PutUint32(b[i:], binary.BigEndian.Uint32(raw[i:]))
	}
	addr, _ := netip.AddrFromSlice(b)
	port, err := strconv.ParseUint(p, 16, 16)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("port %q: %w", p, err)
	}
	return netip.AddrPortFrom(addr.Unmap(), uint16(port)), nil
}
