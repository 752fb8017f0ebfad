package clamp

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin/pkg/dnstest"
	"github.com/coredns/coredns/plugin/test"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func rrs(t *testing.T, texts ...string) []dns.RR {
	t.Helper()
	out := make([]dns.RR, 0, len(texts))
	for _, s := range texts {
		rr, err := dns.NewRR(s)
		if err != nil {
			t.Fatalf("parsing %q: %v", s, err)
		}
		out = append(out, rr)
	}
	return out
}

func ttls(section []dns.RR) []uint32 {
	out := make([]uint32, len(section))
	for i, rr := range section {
		out[i] = rr.Header().Ttl
	}
	return out
}

// serverCtx returns a context naming a server of its own, so each test reads its own counters.
func serverCtx(name string) context.Context {
	return context.WithValue(context.Background(), dnsserver.Key{}, &dnsserver.Server{Addr: "dns://" + name})
}

func counterValue(t *testing.T, vec *prometheus.CounterVec, ctx context.Context, window string) float64 {
	t.Helper()
	server := ctx.Value(dnsserver.Key{}).(*dnsserver.Server).Addr
	m := &dto.Metric{}
	if err := vec.WithLabelValues(server, window).Write(m); err != nil {
		t.Fatalf("reading counter: %v", err)
	}
	return m.GetCounter().GetValue()
}

// writing returns a handler that answers every query with resp.
func writing(resp *dns.Msg) test.HandlerFunc {
	return func(_ context.Context, w dns.ResponseWriter, _ *dns.Msg) (int, error) {
		if err := w.WriteMsg(resp); err != nil {
			return dns.RcodeServerFailure, err
		}
		return resp.Rcode, nil
	}
}

// serve sends req through c, whose next plugin answers resp, and returns what the client got.
func serve(t *testing.T, ctx context.Context, c *Clamp, req, resp *dns.Msg) *dns.Msg {
	t.Helper()
	c.Next = writing(resp)
	rec := dnstest.NewRecorder(&test.ResponseWriter{})
	if _, err := c.ServeDNS(ctx, rec, req); err != nil {
		t.Fatalf("ServeDNS: %v", err)
	}
	if rec.Msg == nil {
		t.Fatal("no response written")
	}
	return rec.Msg
}

func TestClampResponses(t *testing.T) {
	tests := []struct {
		name    string
		qname   string
		qtype   uint16
		rcode   int
		answer  []string
		ns      []string
		extra   []string
		success Window
		denial  Window

		wantAnswer []uint32
		wantNs     []uint32
		wantExtra  []uint32
		wantSOAMin uint32 // MINIMUM of the SOA in the authority section, if there is one
		window     string
		raised     float64
		lowered    float64
	}{
		{
			name: "A records", qname: "example.org.", qtype: dns.TypeA,
			answer:     []string{"example.org. 3600 IN A 192.0.2.1", "example.org. 20 IN A 192.0.2.2", "example.org. 1 IN A 192.0.2.3"},
			wantAnswer: []uint32{30, 20, 5}, window: "success", raised: 1, lowered: 1,
		},
		{
			name: "AAAA records", qname: "example.org.", qtype: dns.TypeAAAA,
			answer:     []string{"example.org. 0 IN AAAA 2001:db8::1", "example.org. 86400 IN AAAA 2001:db8::2"},
			wantAnswer: []uint32{5, 30}, window: "success", raised: 1, lowered: 1,
		},
		{
			name: "CNAME chain with glue", qname: "www.example.org.", qtype: dns.TypeA,
			answer: []string{
				"www.example.org. 600 IN CNAME alias.example.org.",
				"alias.example.org. 2 IN CNAME host.example.net.",
				"host.example.net. 15 IN A 192.0.2.1",
			},
			ns:         []string{"example.net. 172800 IN NS ns.example.net."},
			extra:      []string{"ns.example.net. 172800 IN A 192.0.2.53"},
			wantAnswer: []uint32{30, 5, 15}, wantNs: []uint32{30}, wantExtra: []uint32{30},
			window: "success", raised: 1, lowered: 3,
		},
		{
			name: "relative TTLs inside the window are kept", qname: "example.org.", qtype: dns.TypeA,
			success:    Window{10, 100},
			answer:     []string{"example.org. 12 IN A 192.0.2.1", "example.org. 99 IN A 192.0.2.2", "example.org. 101 IN A 192.0.2.3"},
			wantAnswer: []uint32{12, 99, 100}, window: "success", lowered: 1,
		},
		{
			name: "NXDOMAIN with SOA", qname: "missing.example.org.", qtype: dns.TypeA, rcode: dns.RcodeNameError,
			ns:     []string{"example.org. 3600 IN SOA ns.example.org. admin.example.org. 1 7200 3600 1209600 900"},
			wantNs: []uint32{5}, wantSOAMin: 5, window: "denial", lowered: 2,
		},
		{
			name: "NXDOMAIN at the end of a CNAME chain", qname: "www.example.org.", qtype: dns.TypeA, rcode: dns.RcodeNameError,
			denial:     Window{10, 60},
			answer:     []string{"www.example.org. 3600 IN CNAME gone.example.org."},
			ns:         []string{"example.org. 30 IN SOA ns.example.org. admin.example.org. 1 7200 3600 1209600 1"},
			wantAnswer: []uint32{60}, wantNs: []uint32{30}, wantSOAMin: 10, window: "denial", raised: 1, lowered: 1,
		},
		{
			name: "NODATA", qname: "example.org.", qtype: dns.TypeMX,
			denial: Window{10, 60},
			ns:     []string{"example.org. 3600 IN SOA ns.example.org. admin.example.org. 1 7200 3600 1209600 1"},
			wantNs: []uint32{60}, wantSOAMin: 10, window: "denial", raised: 1, lowered: 1,
		},
		{
			name: "NODATA at the end of a CNAME chain", qname: "www.example.org.", qtype: dns.TypeAAAA,
			denial:     Window{10, 60},
			answer:     []string{"www.example.org. 300 IN CNAME host.example.org."},
			ns:         []string{"example.org. 3 IN SOA ns.example.org. admin.example.org. 1 7200 3600 1209600 3600"},
			wantAnswer: []uint32{60}, wantNs: []uint32{10}, wantSOAMin: 60, window: "denial", raised: 1, lowered: 2,
		},
		{
			name: "referral", qname: "www.example.org.", qtype: dns.TypeA,
			ns:     []string{"example.org. 172800 IN NS a.iana-servers.net.", "example.org. 2 IN NS b.iana-servers.net."},
			extra:  []string{"a.iana-servers.net. 172800 IN A 199.43.135.53", "a.iana-servers.net. 172800 IN AAAA 2001:500:8f::53"},
			wantNs: []uint32{30, 5}, wantExtra: []uint32{30, 30},
			window: "success", raised: 1, lowered: 3,
		},
		{
			name: "SOA answer keeps its MINIMUM", qname: "example.org.", qtype: dns.TypeSOA,
			answer:     []string{"example.org. 3600 IN SOA ns.example.org. admin.example.org. 1 7200 3600 1209600 900"},
			wantAnswer: []uint32{30}, window: "success", lowered: 1,
		},
	}

	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := serverCtx(fmt.Sprintf("responses-%d:53", i))
			c := New()
			if tc.success != (Window{}) {
				c.Success = tc.success
			}
			if tc.denial != (Window{}) {
				c.Denial = tc.denial
			}

			req := new(dns.Msg)
			req.SetQuestion(tc.qname, tc.qtype)
			resp := new(dns.Msg)
			resp.SetRcode(req, tc.rcode)
			resp.Answer = rrs(t, tc.answer...)
			resp.Ns = rrs(t, tc.ns...)
			resp.Extra = rrs(t, tc.extra...)
			original := resp.Copy().String()
			// The counters are process-wide: compare what this case adds (go test -count runs it again).
			raised0, lowered0 := counterValue(t, ttlRaised, ctx, tc.window), counterValue(t, ttlLowered, ctx, tc.window)

			got := serve(t, ctx, c, req, resp)

			if resp.String() != original {
				t.Errorf("the message of the next plugin was modified:\n%s\nwas:\n%s", resp, original)
			}
			if got.Rcode != tc.rcode {
				t.Errorf("rcode %d, want %d", got.Rcode, tc.rcode)
			}
			for _, s := range []struct {
				name      string
				got, want []uint32
			}{{"answer", ttls(got.Answer), tc.wantAnswer}, {"authority", ttls(got.Ns), tc.wantNs}, {"additional", ttls(got.Extra), tc.wantExtra}} {
				if len(s.got) != 0 || len(s.want) != 0 {
					if !slices.Equal(s.got, s.want) {
						t.Errorf("%s TTLs %v, want %v", s.name, s.got, s.want)
					}
				}
			}
			for _, rr := range got.Ns {
				if soa, ok := rr.(*dns.SOA); ok && soa.Minttl != tc.wantSOAMin {
					t.Errorf("SOA MINIMUM %d, want %d", soa.Minttl, tc.wantSOAMin)
				}
			}
			for _, rr := range got.Answer {
				if soa, ok := rr.(*dns.SOA); ok && soa.Minttl != 900 {
					t.Errorf("SOA in the answer has MINIMUM %d, want its data 900 kept", soa.Minttl)
				}
			}
			if v := counterValue(t, ttlRaised, ctx, tc.window) - raised0; v != tc.raised {
				t.Errorf("raised counter +%v, want +%v", v, tc.raised)
			}
			if v := counterValue(t, ttlLowered, ctx, tc.window) - lowered0; v != tc.lowered {
				t.Errorf("lowered counter +%v, want +%v", v, tc.lowered)
			}
		})
	}
}

// TestRecordsFitNoCopy checks that a response whose TTLs already fit reaches the client as the
// very message the next plugin wrote.
func TestRecordsFitNoCopy(t *testing.T) {
	ctx := serverCtx("fit:53")
	req := new(dns.Msg)
	req.SetQuestion("example.org.", dns.TypeA)
	resp := new(dns.Msg)
	resp.SetReply(req)
	resp.Answer = rrs(t, "example.org. 5 IN A 192.0.2.1", "example.org. 30 IN A 192.0.2.2")

	got := serve(t, ctx, New(), req, resp)
	if got != resp {
		t.Errorf("a response inside the window was copied")
	}
	for _, w := range []string{"success", "denial"} {
		if counterValue(t, ttlRaised, ctx, w)+counterValue(t, ttlLowered, ctx, w) != 0 {
			t.Errorf("counters moved for %s without a change", w)
		}
	}
}

// TestManyRecords covers a response with more changed records than fit next to the message copy.
func TestManyRecords(t *testing.T) {
	req := new(dns.Msg)
	req.SetQuestion("example.org.", dns.TypeTXT)
	resp := new(dns.Msg)
	resp.SetReply(req)
	var want []uint32
	for i := range 3 * inlineRRs {
		resp.Answer = append(resp.Answer, rrs(t, fmt.Sprintf("example.org. %d IN TXT \"%d\"", i*3, i))...)
		want = append(want, min(max(uint32(i*3), 5), 30))
	}
	resp.Ns = rrs(t, "example.org. 3600 IN NS ns.example.org.")
	resp.Extra = rrs(t, "ns.example.org. 3600 IN A 192.0.2.53")

	got := serve(t, serverCtx("many:53"), New(), req, resp)
	if !slices.Equal(ttls(got.Answer), want) {
		t.Errorf("answer TTLs %v, want %v", ttls(got.Answer), want)
	}
	if !slices.Equal(ttls(got.Ns), []uint32{30}) || !slices.Equal(ttls(got.Extra), []uint32{30}) {
		t.Errorf("authority %v and additional %v TTLs, want [30] each", ttls(got.Ns), ttls(got.Extra))
	}
	// Each section has its own capacity: growing one must not overwrite the next.
	got.Answer = append(got.Answer, rrs(t, "example.org. 1 IN TXT \"x\"")...)
	if got.Ns[0].Header().Rrtype != dns.TypeNS {
		t.Errorf("appending to the answer overwrote the authority section")
	}
}

// TestOPTUntouched checks that the OPT pseudo-record of a DNSSEC answer goes out byte for byte as
// the next plugin wrote it, though its TTL field (DO bit, extended RCODE) is far outside the window.
func TestOPTUntouched(t *testing.T) {
	req := new(dns.Msg)
	req.SetQuestion("example.org.", dns.TypeA)
	req.SetEdns0(1232, true)

	resp := new(dns.Msg)
	resp.SetRcode(req, dns.RcodeSuccess)
	resp.Answer = rrs(t,
		"example.org. 3600 IN A 192.0.2.1",
		"example.org. 3600 IN RRSIG A 13 2 3600 20300101000000 20200101000000 12345 example.org. dGVzdA==",
	)
	opt := &dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT}}
	opt.SetUDPSize(1232)
	opt.SetDo() // the TTL field is now 32768
	opt.Option = append(opt.Option, &dns.EDNS0_NSID{Code: dns.EDNS0NSID, Nsid: "6e6f6465"})
	resp.Extra = append(resp.Extra, opt)
	before := packRR(t, opt)
	if opt.Hdr.Ttl < 30 {
		t.Fatalf("test needs an OPT whose TTL field is outside the window, got %d", opt.Hdr.Ttl)
	}

	got := serve(t, serverCtx("opt:53"), New(), req, resp)

	if v := ttls(got.Answer); !slices.Equal(v, []uint32{30, 30}) {
		t.Errorf("answer TTLs %v, want [30 30]", v)
	}
	if sig := got.Answer[1].(*dns.RRSIG); sig.OrigTtl != 3600 {
		t.Errorf("RRSIG original TTL %d, want 3600 (it is signed data)", sig.OrigTtl)
	}
	gotOPT := got.IsEdns0()
	if gotOPT == nil {
		t.Fatal("OPT record is gone")
	}
	if after := packRR(t, gotOPT); !bytes.Equal(before, after) {
		t.Errorf("OPT record changed:\n got % x\nwant % x", after, before)
	}

	// And on the wire, as the client sees it.
	wire, err := got.Pack()
	if err != nil {
		t.Fatalf("packing the response: %v", err)
	}
	if !bytes.HasSuffix(wire, before) {
		t.Errorf("packed response does not end with the original OPT record")
	}
}

func packRR(t *testing.T, rr dns.RR) []byte {
	t.Helper()
	buf := make([]byte, dns.Len(rr)+64)
	n, err := dns.PackRR(rr, buf, 0, nil, false)
	if err != nil {
		t.Fatalf("packing %s: %v", rr, err)
	}
	return buf[:n]
}

// TestTruncated checks that a truncated answer has the records it holds clamped and keeps TC:
// the client retries over TCP anyway, and what it may use meanwhile obeys the window.
func TestTruncated(t *testing.T) {
	req := new(dns.Msg)
	req.SetQuestion("example.org.", dns.TypeTXT)

	resp := new(dns.Msg)
	resp.SetReply(req)
	resp.Truncated = true
	resp.Answer = rrs(t, "example.org. 300 IN TXT \"a\"", "example.org. 1 IN TXT \"b\"")

	ctx := serverCtx("truncated:53")
	raised0, lowered0 := counterValue(t, ttlRaised, ctx, "success"), counterValue(t, ttlLowered, ctx, "success")
	got := serve(t, ctx, New(), req, resp)
	if !got.Truncated {
		t.Errorf("TC bit lost")
	}
	if v := ttls(got.Answer); !slices.Equal(v, []uint32{30, 5}) {
		t.Errorf("answer TTLs %v, want [30 5]", v)
	}
	if counterValue(t, ttlRaised, ctx, "success")-raised0 != 1 || counterValue(t, ttlLowered, ctx, "success")-lowered0 != 1 {
		t.Errorf("truncated answer not counted")
	}

	// A truncated answer with nothing in it passes as it is.
	empty := new(dns.Msg)
	empty.SetReply(req)
	empty.Truncated = true
	if got := serve(t, ctx, New(), req, empty); got != empty {
		t.Errorf("empty truncated answer was copied")
	}
}

// TestErrorsUntouched checks that error responses pass as the next plugin wrote them.
func TestErrorsUntouched(t *testing.T) {
	for _, rcode := range []int{dns.RcodeServerFailure, dns.RcodeRefused, dns.RcodeNotImplemented, dns.RcodeFormatError, dns.RcodeYXDomain, dns.RcodeBadVers} {
		t.Run(dns.RcodeToString[rcode], func(t *testing.T) {
			ctx := serverCtx("errors-" + dns.RcodeToString[rcode] + ":53")
			req := new(dns.Msg)
			req.SetQuestion("example.org.", dns.TypeA)
			resp := new(dns.Msg)
			resp.SetRcode(req, rcode)
			resp.Answer = rrs(t, "example.org. 3600 IN CNAME other.example.org.")
			resp.Ns = rrs(t, "example.org. 3600 IN SOA ns.example.org. admin.example.org. 1 7200 3600 1209600 900")

			got := serve(t, ctx, New(), req, resp)
			if got != resp {
				t.Fatalf("%s response was replaced", dns.RcodeToString[rcode])
			}
			if got.Answer[0].Header().Ttl != 3600 || got.Ns[0].Header().Ttl != 3600 || got.Ns[0].(*dns.SOA).Minttl != 900 {
				t.Errorf("%s response TTLs changed: %s", dns.RcodeToString[rcode], got)
			}
			for _, w := range []string{"success", "denial"} {
				if counterValue(t, ttlRaised, ctx, w)+counterValue(t, ttlLowered, ctx, w) != 0 {
					t.Errorf("counters moved for %s", w)
				}
			}
		})
	}
}

// TestZones checks that only names inside the configured zones are clamped.
func TestZones(t *testing.T) {
	c := New()
	c.Zones = []string{"example.org.", "example.net."}

	tests := []struct {
		qname   string
		clamped bool
	}{
		{"example.org.", true},
		{"www.Example.ORG.", true},
		{"deep.www.example.net.", true},
		{"example.com.", false},
		{"notexample.org.", false},
		{"org.", false},
	}
	for _, tc := range tests {
		req := new(dns.Msg)
		req.SetQuestion(tc.qname, dns.TypeA)
		resp := new(dns.Msg)
		resp.SetReply(req)
		resp.Answer = rrs(t, tc.qname+" 3600 IN A 192.0.2.1")

		got := serve(t, serverCtx("zones:53"), c, req, resp)
		want := uint32(3600)
		if tc.clamped {
			want = 30
		}
		if ttl := got.Answer[0].Header().Ttl; ttl != want {
			t.Errorf("%s: TTL %d, want %d", tc.qname, ttl, want)
		}
		if !tc.clamped && got != resp {
			t.Errorf("%s: response outside the zones was replaced", tc.qname)
		}
	}
}

// TestNotQueries checks that zone transfers and other opcodes pass untouched: their TTLs are zone
// data.
func TestNotQueries(t *testing.T) {
	axfr := new(dns.Msg)
	axfr.SetAxfr("example.org.")
	ixfr := new(dns.Msg)
	ixfr.SetIxfr("example.org.", 1, "ns.example.org.", "admin.example.org.")
	notify := new(dns.Msg)
	notify.SetNotify("example.org.")
	update := new(dns.Msg)
	update.SetUpdate("example.org.")

	for name, req := range map[string]*dns.Msg{"AXFR": axfr, "IXFR": ixfr, "NOTIFY": notify, "UPDATE": update} {
		resp := new(dns.Msg)
		resp.SetReply(req)
		resp.Answer = rrs(t,
			"example.org. 3600 IN SOA ns.example.org. admin.example.org. 2 7200 3600 1209600 900",
			"example.org. 3600 IN A 192.0.2.1",
		)
		got := serve(t, serverCtx("notqueries:53"), New(), req, resp)
		if got != resp || !slices.Equal(ttls(got.Answer), []uint32{3600, 3600}) {
			t.Errorf("%s: response changed: %s", name, got)
		}
	}

	// Without a question there is no name to match a zone against.
	c := New()
	c.Next = test.HandlerFunc(func(_ context.Context, w dns.ResponseWriter, _ *dns.Msg) (int, error) {
		return dns.RcodeFormatError, nil
	})
	if _, err := c.ServeDNS(context.Background(), &test.ResponseWriter{}, new(dns.Msg)); err != nil {
		t.Errorf("no question: ServeDNS: %v", err)
	}
}

// TestWriteBytes checks that a response written as wire format is clamped as well.
func TestWriteBytes(t *testing.T) {
	req := new(dns.Msg)
	req.SetQuestion("example.org.", dns.TypeA)
	resp := new(dns.Msg)
	resp.SetReply(req)
	resp.Answer = rrs(t, "example.org. 3600 IN A 192.0.2.1")
	wire, err := resp.Pack()
	if err != nil {
		t.Fatal(err)
	}

	c := New()
	c.Next = test.HandlerFunc(func(_ context.Context, w dns.ResponseWriter, _ *dns.Msg) (int, error) {
		n, err := w.Write(wire)
		if err != nil {
			return dns.RcodeServerFailure, err
		}
		if n != len(wire) {
			t.Errorf("Write returned %d, want %d", n, len(wire))
		}
		return dns.RcodeSuccess, nil
	})
	rec := dnstest.NewRecorder(&test.ResponseWriter{})
	if _, err := c.ServeDNS(context.Background(), rec, req); err != nil {
		t.Fatalf("ServeDNS: %v", err)
	}
	if rec.Msg == nil || rec.Msg.Answer[0].Header().Ttl != 30 {
		t.Fatalf("response written as bytes not clamped: %v", rec.Msg)
	}

	c.Next = test.HandlerFunc(func(_ context.Context, w dns.ResponseWriter, _ *dns.Msg) (int, error) {
		_, err := w.Write([]byte{1, 2, 3})
		return dns.RcodeServerFailure, err
	})
	if _, err := c.ServeDNS(context.Background(), dnstest.NewRecorder(&test.ResponseWriter{}), req); err == nil {
		t.Errorf("garbage written as bytes gave no error")
	}
}

func TestWriteNil(t *testing.T) {
	w := &ResponseWriter{ResponseWriter: &test.ResponseWriter{}, clamp: New()}
	if err := w.WriteMsg(nil); err == nil {
		t.Errorf("writing a nil message gave no error")
	}
}

// TestExpiredSignature checks that a DNSSEC answer whose signature has expired is still clamped:
// judging signatures is the validator's business, not a reason to let the TTLs through.
func TestExpiredSignature(t *testing.T) {
	req := new(dns.Msg)
	req.SetQuestion("example.org.", dns.TypeA)
	req.SetEdns0(1232, true)
	resp := new(dns.Msg)
	resp.SetReply(req)
	resp.Answer = rrs(t,
		"example.org. 3600 IN A 192.0.2.1",
		"example.org. 3600 IN RRSIG A 13 2 3600 20020101000000 20010101000000 12345 example.org. dGVzdA==",
	)
	resp.SetEdns0(1232, true)

	got := serve(t, serverCtx("expired:53"), New(), req, resp)
	if v := ttls(got.Answer); !slices.Equal(v, []uint32{30, 30}) {
		t.Errorf("answer TTLs %v, want [30 30]", v)
	}
}

// TestTTLFloor checks that the floor clamp reports for a response is the MIN it raises that response's
// TTLs to, and that it reports none for the responses it passes untouched.
func TestTTLFloor(t *testing.T) {
	c := New()
	c.Zones = []string{"example.org."}
	c.Success = Window{Min: 10, Max: 60}
	c.Denial = Window{Min: 2, Max: 7}
	const soa = "example.org. 0 IN SOA ns.example.org. admin.example.org. 1 7200 3600 1209600 0"

	tests := []struct {
		name   string
		qname  string
		qtype  uint16
		rcode  int
		answer []string
		ns     []string
		floor  uint32
		ok     bool
	}{
		{name: "data", qname: "www.example.org.", qtype: dns.TypeA, answer: []string{"www.example.org. 0 IN A 192.0.2.1"}, floor: 10, ok: true},
		{name: "referral", qname: "www.sub.example.org.", qtype: dns.TypeA, ns: []string{"sub.example.org. 0 IN NS ns.sub.example.org."}, floor: 10, ok: true},
		{name: "nxdomain", qname: "nope.example.org.", qtype: dns.TypeA, rcode: dns.RcodeNameError, ns: []string{soa}, floor: 2, ok: true},
		{name: "nodata", qname: "www.example.org.", qtype: dns.TypeMX, ns: []string{soa}, floor: 2, ok: true},
		{name: "cname to nodata", qname: "alias.example.org.", qtype: dns.TypeMX,
			answer: []string{"alias.example.org. 0 IN CNAME www.example.org."}, ns: []string{soa}, floor: 2, ok: true},
		{name: "servfail", qname: "www.example.org.", qtype: dns.TypeA, rcode: dns.RcodeServerFailure},
		{name: "outside the zones", qname: "www.example.net.", qtype: dns.TypeA, answer: []string{"www.example.net. 0 IN A 192.0.2.1"}},
		{name: "zone transfer", qname: "example.org.", qtype: dns.TypeAXFR, answer: []string{soa}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := new(dns.Msg)
			req.SetQuestion(tc.qname, tc.qtype)
			resp := new(dns.Msg)
			resp.SetReply(req)
			resp.Rcode = tc.rcode
			resp.Answer = rrs(t, tc.answer...)
			resp.Ns = rrs(t, tc.ns...)

			floor, ok := c.TTLFloor(resp)
			if floor != tc.floor || ok != tc.ok {
				t.Fatalf("TTLFloor = %d, %v; want %d, %v", floor, ok, tc.floor, tc.ok)
			}
			// Every TTL of the response is 0, so clamp raises each to exactly the floor it reports.
			got := serve(t, serverCtx("ttlfloor:53"), c, req, resp)
			for _, rr := range append(slices.Clone(got.Answer), got.Ns...) {
				want := uint32(0)
				if ok {
					want = floor
				}
				if rr.Header().Ttl != want {
					t.Errorf("clamp served %s with TTL %d, want %d", rr, rr.Header().Ttl, want)
				}
			}
		})
	}
}
