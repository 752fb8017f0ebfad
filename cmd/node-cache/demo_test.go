//go:build linux

package main

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns"
)

func TestMain(m *testing.M) {
	directives, err := nodelocaldns.CompiledDirectives()
	if err == nil {
		err = dnsserver.SetDirectives(directives)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// freePort returns a loopback port that nothing listened on a moment ago, on UDP and TCP.
func freePort(t *testing.T) string {
	t.Helper()
	for range 20 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if pc, err := net.ListenPacket("udp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port))); err == nil {
			pc.Close()
			return strconv.Itoa(port)
		}
	}
	t.Fatal("no free loopback port")
	return ""
}

// startDemo starts examples/demo/Corefile in this process, on free ports, and returns the node cache's address.
func startDemo(t *testing.T) string {
	t.Helper()
	corefile, err := os.ReadFile("../../examples/demo/Corefile")
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(string(corefile), "examples/demo/", "../../examples/demo/")
	cachePort := freePort(t)
	for _, port := range []string{"5300", "5301", "9253", "5380", "5381"} {
		replacement := freePort(t)
		if port == "5300" {
			replacement = cachePort
		}
		text = strings.ReplaceAll(text, ":"+port, ":"+replacement)
	}
	instance, err := caddy.Start(caddy.CaddyfileInput{Contents: []byte(text), ServerTypeName: "dns"})
	if err != nil {
		t.Fatalf("starting the demo Corefile: %v", err)
	}
	t.Cleanup(func() { instance.Stop() })
	return net.JoinHostPort("127.0.0.1", cachePort)
}

func query(t *testing.T, server, name string, do bool) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), dns.TypeA)
	m.SetEdns0(1232, do)
	r, err := dns.Exchange(m, server)
	if err != nil {
		t.Fatalf("query %s: %v", name, err)
	}
	return r
}

// TestDemoShowsClampedTTLs is the README's demo, asserted: the stand-in's TTL 3600 is served as at most
// 30 s and counts down from the cache, TTL 1 is served as at least 5 s, NXDOMAIN has TTL 5, and a DO query
// gets its OPT record back intact.
func TestDemoShowsClampedTTLs(t *testing.T) {
	server := startDemo(t)

	first := query(t, server, "kubernetes.default.svc.cluster.local", false)
	if len(first.Answer) != 1 || first.Answer[0].Header().Ttl != 30 {
		t.Fatalf("first answer = %v, want one A record with TTL 30", first.Answer)
	}
	time.Sleep(1100 * time.Millisecond)
	cached := query(t, server, "kubernetes.default.svc.cluster.local", false)
	if ttl := cached.Answer[0].Header().Ttl; ttl >= 30 || ttl < 5 {
		t.Errorf("cached answer TTL = %d, want it counting down inside [5, 30)", ttl)
	}

	short := query(t, server, "flappy.default.svc.cluster.local", false)
	if len(short.Answer) != 1 || short.Answer[0].Header().Ttl != 5 {
		t.Errorf("TTL-1 record served as %v, want TTL 5", short.Answer)
	}

	missing := query(t, server, "nope.default.svc.cluster.local", false)
	if missing.Rcode != dns.RcodeNameError || len(missing.Ns) != 1 {
		t.Fatalf("NXDOMAIN answer = %v", missing)
	}
	soa := missing.Ns[0].(*dns.SOA)
	if soa.Hdr.Ttl != 5 || soa.Minttl != 5 {
		t.Errorf("NXDOMAIN SOA TTL %d MINIMUM %d, want 5 and 5", soa.Hdr.Ttl, soa.Minttl)
	}

	signed := query(t, server, "kubernetes.default.svc.cluster.local", true)
	opt := signed.IsEdns0()
	if opt == nil || !opt.Do() || opt.Version() != 0 || opt.ExtendedRcode() != 0 || opt.UDPSize() != 1232 {
		t.Errorf("DO query's OPT = %v, want version 0, DO set, extended RCODE 0, size 1232", opt)
	}
}
