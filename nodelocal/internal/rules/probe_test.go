//go:build linux

package rules

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const testProbeMark = 0x53

// TestProbeExemptionGoesFirst: a foreign rule that ends raw OUTPUT's walk for every packet (an ACCEPT) sits
// first. A probe exemption appended after it never sees a probe, so kube-proxy's DNAT sends the probe of
// the kube-dns ClusterIP elsewhere; the one AddProbeExemption inserts reaches this host's server.
func TestProbeExemptionGoesFirst(t *testing.T) {
	inNamespace(t, func(t *testing.T, m *Manager) {
		ctx := context.Background()
		if out, err := exec.Command("ip", "addr", "add", "10.96.0.10/32", "dev", "lo").CombinedOutput(); err != nil {
			t.Fatalf("ip addr add: %v: %s", err, out)
		}
		udpEcho(t, "10.96.0.10:5353", "us")
		udpEcho(t, "127.0.0.1:5354", "kube-dns")
		ipt(t, m, IPv4, "-t", "nat", "-A", "OUTPUT", "-d", "10.96.0.10/32", "-p", "udp", "-m", "udp", "--dport", "5353",
			"-j", "DNAT", "--to-destination", "127.0.0.1:5354")
		ipt(t, m, IPv4, "-t", "raw", "-A", "OUTPUT", "-j", "ACCEPT")

		if got := markedExchange(t, "10.96.0.10:5353"); got != "kube-dns" {
			t.Fatalf("without the exemption the probe reached %q, want kube-dns (the DNAT stand-in is broken)", got)
		}
		// The rule appended, as the exemption used to be: the ACCEPT ahead of it wins.
		ipt(t, m, IPv4, append([]string{"-t", "raw", "-A", "OUTPUT"}, ProbeExemption(testProbeMark)...)...)
		if got := markedExchange(t, "10.96.0.10:5353"); got != "kube-dns" {
			t.Fatalf("appended exemption: the probe reached %q; this test cannot tell first from last", got)
		}

		if err := m.AddProbeExemption(ctx, IPv4, testProbeMark); err != nil {
			t.Fatal(err)
		}
		if got := markedExchange(t, "10.96.0.10:5353"); got != "us" {
			t.Errorf("with the exemption the probe reached %q, want this host's server", got)
		}
		rules := rawOutput(t, m)
		if len(rules) != 2 || !strings.Contains(rules[0], ProbeComment) || rules[1] != "-A OUTPUT -j ACCEPT" {
			t.Errorf("raw OUTPUT:\n%s\nwant the exemption first and the appended copy gone", strings.Join(rules, "\n"))
		}

		// Our jump keeps position 1; the exemption goes right after it, and a second add changes nothing.
		cache := testRuleset(IPv4)
		if _, err := m.Sync(ctx, cache); err != nil {
			t.Fatal(err)
		}
		if err := m.AddProbeExemption(ctx, IPv4, testProbeMark); err != nil {
			t.Fatal(err)
		}
		if err := m.AddProbeExemption(ctx, IPv4, testProbeMark); err != nil {
			t.Fatal(err)
		}
		rules = rawOutput(t, m)
		if len(rules) != 3 || !strings.HasSuffix(rules[0], "-j "+DefaultChain) || !strings.Contains(rules[1], ProbeComment) {
			t.Errorf("raw OUTPUT:\n%s\nwant our jump, then the exemption, then the ACCEPT", strings.Join(rules, "\n"))
		}
		if res, err := m.Sync(ctx, cache); err != nil || res.Changed {
			t.Errorf("the exemption disturbed our jump: %+v, %v", res, err)
		}

		if err := m.RemoveProbeExemption(ctx, IPv4, testProbeMark); err != nil {
			t.Fatal(err)
		}
		if err := m.RemoveProbeExemption(ctx, IPv4, testProbeMark); err != nil {
			t.Errorf("removing it again: %v", err)
		}
		for _, r := range rawOutput(t, m) {
			if strings.Contains(r, ProbeComment) {
				t.Errorf("left behind: %s", r)
			}
		}
	})
}

func rawOutput(t *testing.T, m *Manager) []string {
	t.Helper()
	var rules []string
	for l := range strings.SplitSeq(ipt(t, m, IPv4, "-t", "raw", "-S", "OUTPUT"), "\n") {
		if strings.HasPrefix(l, "-A ") {
			rules = append(rules, l)
		}
	}
	return rules
}

// udpEcho answers every datagram on addr with name, until the test ends.
func udpEcho(t *testing.T, addr, name string) {
	t.Helper()
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 512)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo([]byte(name), from)
		}
	}()
}

// markedExchange sends one datagram with the probe mark from a fresh socket and returns the answer.
func markedExchange(t *testing.T, addr string) string {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, testProbeMark) }); err != nil {
			return err
		}
		return serr
	}}
	conn, err := d.Dial("udp", netip.MustParseAddrPort(addr).String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("probe")); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 64)
	n, err := conn.Read(buf)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "no answer"
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(buf[:n])
}
