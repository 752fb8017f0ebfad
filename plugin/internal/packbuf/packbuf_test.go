package packbuf

import (
	"bytes"
	"strings"
	"testing"

	"github.com/miekg/dns"
)

// txtAnswer returns an answer whose packed size grows with n: a TXT record of n strings of 200 bytes.
func txtAnswer(n int) *dns.Msg {
	m := new(dns.Msg)
	m.SetQuestion("big.example.", dns.TypeTXT)
	m.Response = true
	txt := make([]string, n)
	for i := range txt {
		txt[i] = strings.Repeat("x", 200)
	}
	m.Answer = []dns.RR{&dns.TXT{Hdr: dns.RR_Header{Name: "big.example.", Rrtype: dns.TypeTXT, Class: dns.ClassINET, Ttl: 30}, Txt: txt}}
	return m
}

// TestPackAsMsgPack: a buffer packs what dns.Msg.Pack packs, small and large messages alike, in any order.
func TestPackAsMsgPack(t *testing.T) {
	var b Buffer
	for _, n := range []int{0, 1, 3, 30, 1, 0, 25, 2} { // 30 strings of 200 bytes do not fit a kept buffer
		m := txtAnswer(n)
		want, err := m.Pack()
		if err != nil {
			t.Fatal(err)
		}
		got, err := b.Pack(m)
		if err != nil {
			t.Fatalf("%d strings: %v", n, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%d strings: packed %d bytes unlike dns.Msg.Pack's %d", n, len(got), len(want))
		}
	}
}

// TestBufferGrowsToMaxKept: a message larger than the buffer grows it up to maxKeptSize, and a larger one
// is packed into a buffer of its own, which the buffer does not keep.
func TestBufferGrowsToMaxKept(t *testing.T) {
	var b Buffer
	if _, err := b.Pack(txtAnswer(10)); err != nil { // about 2 KiB
		t.Fatal(err)
	}
	if c := cap(b.b); c <= initialSize || c > maxKeptSize {
		t.Fatalf("after a 2 KiB message the buffer holds %d bytes; want more than %d, at most %d", c, initialSize, maxKeptSize)
	}
	grown := cap(b.b)
	if _, err := b.Pack(txtAnswer(30)); err != nil { // about 6 KiB
		t.Fatal(err)
	}
	if c := cap(b.b); c != grown {
		t.Fatalf("after a 6 KiB message the buffer holds %d bytes; want the %d it had", c, grown)
	}
}

// TestPackAllocatesNothingOnceWarm: packing a message that fits the buffer allocates nothing, which is what
// the buffers are for.
func TestPackAllocatesNothingOnceWarm(t *testing.T) {
	var p Pool
	m := new(dns.Msg)
	m.SetQuestion("kubernetes.default.svc.cluster.local.", dns.TypeA)
	m.SetEdns0(1232, false)
	b := p.Get()
	if _, err := b.Pack(m); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() {
		if _, err := b.Pack(m); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("a pack into a warm buffer made %v allocations; want 0", n)
	}
	p.Put(b)
}
