package wirecache

import (
	"errors"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// rawExchange sends b to addr over UDP and returns the reply, or nil when none came within wait.
func rawExchange(t *testing.T, addr string, b []byte, wait time.Duration) []byte {
	t.Helper()
	conn, err := net.Dial("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := conn.SetReadDeadline(time.Now().Add(wait)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, dns.MaxMsgSize)
	n, err := conn.Read(buf)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return buf[:n]
}

// TestDifferentialOddQueries sends queries a client seldom sends, byte for byte the same, to a block with
// wirecache (its UDP queries read by the fast path) and to the same block without, three times each, and
// requires the same replies.
func TestDifferentialOddQueries(t *testing.T) {
	withAddr, withoutAddr := startDifferentialPair(t, differentialZone)

	pack := func(edit func(m *dns.Msg)) []byte {
		m := newQuery("www.example.org.", dns.TypeA, 1232, false)
		edit(m)
		b, err := m.Pack()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	withOption := func(o dns.EDNS0) []byte { return pack(func(m *dns.Msg) { m.IsEdns0().Option = []dns.EDNS0{o} }) }
	plain := pack(func(*dns.Msg) {})
	// A query with the QR bit set gets no reply from either; waiting for none would make a slow test.
	queries := map[string][]byte{
		"cookie":         withOption(&dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "0123456789abcdef"}),
		"padding":        withOption(&dns.EDNS0_PADDING{Padding: make([]byte, 64)}),
		"client subnet":  withOption(&dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: 1, SourceNetmask: 24, Address: net.IPv4(192, 0, 2, 0).To4()}),
		"nsid":           withOption(&dns.EDNS0_NSID{Code: dns.EDNS0NSID}),
		"edns version 1": pack(func(m *dns.Msg) { m.IsEdns0().SetVersion(1) }),
		"edns version 255, DO, CD, AD, Z and no RD": pack(func(m *dns.Msg) {
			m.IsEdns0().SetVersion(255)
			m.IsEdns0().SetDo()
			m.CheckingDisabled, m.AuthenticatedData, m.Zero, m.RecursionDesired = true, true, true, false
		}),
		"edns version 1 with a cookie, upper case": pack(func(m *dns.Msg) {
			m.Question[0].Name = "WwW.Example.ORG."
			m.IsEdns0().SetVersion(1)
			m.IsEdns0().Option = []dns.EDNS0{&dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "0123456789abcdef"}}
		}),
		"edns version 1 of the root, type 65535, size 0": pack(func(m *dns.Msg) {
			m.Question[0].Name, m.Question[0].Qtype = ".", 65535
			m.IsEdns0().SetVersion(1)
			m.IsEdns0().SetUDPSize(0)
		}),
		"edns version 1, class chaos": pack(func(m *dns.Msg) {
			m.Question[0].Qclass = dns.ClassCHAOS
			m.IsEdns0().SetVersion(1)
		}),
		"edns version 1, client subnet": pack(func(m *dns.Msg) {
			m.IsEdns0().SetVersion(1)
			m.IsEdns0().Option = []dns.EDNS0{&dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: 1, SourceNetmask: 24, Address: net.IPv4(192, 0, 2, 0).To4()}}
		}),
		"class chaos":   pack(func(m *dns.Msg) { m.Question[0].Qclass = dns.ClassCHAOS }),
		"two questions": pack(func(m *dns.Msg) { m.Question = append(m.Question, m.Question[0]) }),
		"DS":            pack(func(m *dns.Msg) { m.Question[0].Qtype = dns.TypeDS }),
		"escaped name":  pack(func(m *dns.Msg) { m.Question[0].Name = "we\\.ird.example.org." }),
		"upper case":    pack(func(m *dns.Msg) { m.Question[0].Name = "WWW.EXAMPLE.ORG." }),
		"no EDNS":       pack(func(m *dns.Msg) { m.Extra = nil }),
		"EDNS size 100": pack(func(m *dns.Msg) { m.IsEdns0().SetUDPSize(100) }),
		"DO":            pack(func(m *dns.Msg) { m.IsEdns0().SetDo() }),
		"large padding": withOption(&dns.EDNS0_PADDING{Padding: make([]byte, 600)}),
		"trailing byte": append(append([]byte{}, plain...), 0),
		"cut short":     plain[:len(plain)-3],
		"header only":   plain[:headerLen],
		"opcode status": pack(func(m *dns.Msg) { m.Opcode = dns.OpcodeStatus }),
	}
	// Every one of these gets a reply (FORMERR for the malformed ones); the wait only bounds a failure.
	const wait = 10 * time.Second

	// Each query twice before the comparisons, so that whatever wirecache stores from it is stored.
	for name, b := range queries {
		for range 2 {
			rawExchange(t, withAddr, b, wait)
		}
		for round := 1; round <= 3; round++ {
			got := rawExchange(t, withAddr, b, wait)
			want := rawExchange(t, withoutAddr, b, wait)
			switch {
			case got == nil || want == nil:
				t.Errorf("%s, round %d: reply with wirecache %x, without %x", name, round, got, want)
			default:
				if err := sameApartFromTTL(got, want); err != nil {
					t.Errorf("%s, round %d: %v", name, round, err)
				}
			}
		}
	}

	// The fast path (started by the queries above) answers those of EDNS versions above 0 itself, as the
	// server does, where it reads the query whole: not those the server refuses for their class first, nor
	// those with options it leaves to miekg/dns's unpacking.
	if runtime.GOOS != "linux" {
		return
	}
	server := "dns://" + withAddr
	waitSteered(t, server)
	badVersions := []string{"edns version 1", "edns version 255, DO, CD, AD, Z and no RD", "edns version 1 with a cookie, upper case", "edns version 1 of the root, type 65535, size 0"}
	read, passed := counterValue(t, fastPathQueries, server), counterValue(t, fastPathPassed, server)
	for _, name := range badVersions {
		rawExchange(t, withAddr, queries[name], wait)
	}
	if r, p := counterValue(t, fastPathQueries, server)-read, counterValue(t, fastPathPassed, server)-passed; r != float64(len(badVersions)) || p != 0 {
		t.Errorf("queries of EDNS versions above 0: the fast path read %v of %d and passed %v on", r, len(badVersions), p)
	}
}
