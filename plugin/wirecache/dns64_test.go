package wirecache

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	_ "github.com/coredns/coredns/plugin/dns64"
	"github.com/miekg/dns"
)

// dns64Zone has an IPv4-only name: dns64 synthesizes its AAAA record for IPv6 clients.
const dns64Zone = `$ORIGIN example.org.
@          300 IN SOA ns hostmaster 1 7200 3600 1209600 300
@          300 IN NS  ns
ns         300 IN A   192.0.2.53
v4only     300 IN A   192.0.2.1
`

// TestStepsAsideForDNS64 runs a block with wirecache and dns64 on both loopback addresses. dns64 answers an
// IPv4 client's AAAA query with NODATA and an IPv6 client's with a synthesized record: were wirecache to
// answer the second from the first, the IPv6 client would lose the name.
func TestStepsAsideForDNS64(t *testing.T) {
	if l, err := net.ListenPacket("udp", "[::1]:0"); err != nil {
		t.Fatalf("this test needs ::1 on the loopback link: %v", err)
	} else {
		l.Close()
	}
	zoneFile := filepath.Join(t.TempDir(), "example.org.db")
	if err := os.WriteFile(zoneFile, []byte(dns64Zone), 0o600); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	startCoreDNS(t, fmt.Sprintf(".:%d {\n bind 127.0.0.1 ::1\n wirecache {\n ttl 30 60\n }\n dns64\n file %s example.org\n}\n", port, zoneFile))
	before := sumCounter(hitsTotal) + sumCounter(missesTotal)
	ask := func(server string) *dns.Msg {
		t.Helper()
		reply := new(dns.Msg)
		if err := reply.Unpack(exchange(t, newQuery("v4only.example.org.", dns.TypeAAAA, 0, false), net.JoinHostPort(server, strconv.Itoa(port)), false)); err != nil {
			t.Fatal(err)
		}
		return reply
	}
	for round := range 2 {
		if r := ask("127.0.0.1"); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 0 {
			t.Errorf("round %d, IPv4 client: %v, want NODATA", round, r)
		}
		r := ask("::1")
		if len(r.Answer) != 1 {
			t.Fatalf("round %d, IPv6 client: %v, want dns64's AAAA record", round, r)
		}
		if aaaa, ok := r.Answer[0].(*dns.AAAA); !ok || aaaa.AAAA.String() != "64:ff9b::c000:201" {
			t.Errorf("round %d, IPv6 client: %v, want 64:ff9b::c000:201", round, r.Answer[0])
		}
	}
	if after := sumCounter(hitsTotal) + sumCounter(missesTotal); after != before {
		t.Errorf("wirecache counted %v queries in a block with dns64", after-before)
	}
}
