// Package clamp implements a plugin that keeps the TTLs of the responses it passes inside a window.
package clamp

import (
	"context"
	"errors"
	"fmt"

	"github.com/coredns/coredns/plugin"
	"github.com/coredns/coredns/plugin/metrics"
	"github.com/nodelocaldns/nodelocaldns/plugin/internal/answer"
	"github.com/nodelocaldns/nodelocaldns/plugin/internal/zones"

	"github.com/miekg/dns"
)

const pluginName = "clamp"

// Window is a closed range of TTLs in seconds.
type Window struct {
	Min uint32
	Max uint32
}

// clamp returns ttl moved into the window.
func (w Window) clamp(ttl uint32) uint32 { return min(max(ttl, w.Min), w.Max) }

// Defaults match the TTLs a node-local cache hands out today: positive answers for 5 to 30 seconds,
// negative answers for 5.
var (
	DefaultSuccess = Window{Min: 5, Max: 30}
	DefaultDenial  = Window{Min: 5, Max: 5}
)

// Clamp is a plugin that moves the TTL of every record of a response into a window: Success for
// answers with data and referrals, Denial for NXDOMAIN and NODATA.
type Clamp struct {
	Next  plugin.Handler
	Zones []string

	Success Window
	Denial  Window

	counters counterSet
}

// New returns a Clamp with the default windows, applying to every zone.
func New() *Clamp {
	return &Clamp{Zones: []string{"."}, Success: DefaultSuccess, Denial: DefaultDenial}
}

// Name implements the plugin.Handler interface.
func (c *Clamp) Name() string { return pluginName }

// ServeDNS implements the plugin.Handler interface.
func (c *Clamp) ServeDNS(ctx context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
	if !c.applies(r) {
		return plugin.NextOrFailure(c.Name(), c.Next, ctx, w, r)
	}
	cw := &ResponseWriter{ResponseWriter: w, clamp: c, server: metrics.WithServer(ctx)}
	return plugin.NextOrFailure(c.Name(), c.Next, ctx, cw, r)
}

// TTLFloor returns the MIN of the window clamp applies to res, a response that passed through it, and
// whether clamp applies one: res must be an answer to a query in clamp's zones, and NOERROR or NXDOMAIN.
// A plugin that replays answers ahead of clamp (wirecache) asks once per answer it stores, and keeps the
// TTLs it counts down from going below the floor, as clamp would on a cache hit.
func (c *Clamp) TTLFloor(res *dns.Msg) (floor uint32, ok bool) {
	if !c.applies(res) {
		return 0, false
	}
	switch classify(res) {
	case success:
		return c.Success.Min, true
	case denial:
		return c.Denial.Min, true
	}
	return 0, false
}

// applies reports whether responses to r are clamped; r may also be such a response, which has the
// query's opcode and question. Zone transfers, NOTIFY and UPDATE are left alone: their TTLs are zone
// data, not cache lifetimes.
func (c *Clamp) applies(r *dns.Msg) bool {
	if r.Opcode != dns.OpcodeQuery || len(r.Question) == 0 {
		return false
	}
	q := r.Question[0]
	if q.Qtype == dns.TypeAXFR || q.Qtype == dns.TypeIXFR {
		return false
	}
	// zones.Matches compares names case-insensitively, so the question name needs no lowering.
	return zones.Matches(c.Zones, q.Name) != ""
}

// ResponseWriter clamps the TTLs of the response it writes.
type ResponseWriter struct {
	dns.ResponseWriter
	clamp  *Clamp
	server string
}

// WriteMsg implements the dns.ResponseWriter interface.
func (w *ResponseWriter) WriteMsg(res *dns.Msg) error {
	if res == nil {
		return errors.New("clamp: response message is nil")
	}
	return w.ResponseWriter.WriteMsg(w.clamp.clampMsg(res, w.server))
}

// Write implements the dns.ResponseWriter interface. A plugin after clamp that writes wire format
// would otherwise slip past the window, so the bytes are parsed and clamped like any message.
func (w *ResponseWriter) Write(buf []byte) (int, error) {
	res := new(dns.Msg)
	if err := res.Unpack(buf); err != nil {
		return 0, fmt.Errorf("clamp: parsing a response written as bytes: %w", err)
	}
	if err := w.WriteMsg(res); err != nil {
		return 0, err
	}
	return len(buf), nil
}

// kind says which window, if any, applies to a response.
type kind int

const (
	untouched kind = iota
	success
	denial
)

var windowLabels = [...]string{success: "success", denial: "denial"}

// classify tells answers with data and referrals (success) from NXDOMAIN and NODATA (denial), as CoreDNS's
// cache and wirecache do (answer.Classify).
func classify(m *dns.Msg) kind {
	switch answer.Classify(m) {
	case answer.Success:
		return success
	case answer.Denial:
		return denial
	}
	// SERVFAIL, REFUSED and the other errors carry no cacheable data.
	return untouched
}

// sections of a message, in the order of dns.Msg.
const (
	answerSection = iota
	authoritySection
	additionalSection
)

// tally counts TTL values moved up and down.
type tally struct{ raised, lowered int }

// note records that a value goes from one TTL to another and reports whether it changed.
func (t *tally) note(from, to uint32) bool {
	switch {
	case to > from:
		t.raised++
	case to < from:
		t.lowered++
	default:
		return false
	}
	return true
}

// target returns the TTL rr gets and, when soaMinimum is set and rr is a SOA, its MINIMUM;
// changed reports whether either differs from rr.
func (w Window) target(rr dns.RR, soaMinimum bool, t *tally) (ttl, minimum uint32, changed bool) {
	h := rr.Header()
	switch h.Rrtype {
	case dns.TypeOPT, dns.TypeTSIG, dns.TypeSIG:
		// Pseudo-records: OPT's TTL holds the extended RCODE, version and DO bit; TSIG and SIG(0)
		// must carry TTL 0.
		return h.Ttl, 0, false
	}
	ttl = w.clamp(h.Ttl)
	changed = t.note(h.Ttl, ttl)
	if soa, ok := rr.(*dns.SOA); ok && soaMinimum {
		// RFC 2308 section 5: the negative TTL is the smaller of the SOA's TTL and MINIMUM.
		minimum = w.clamp(soa.Minttl)
		changed = t.note(soa.Minttl, minimum) || changed
	}
	return ttl, minimum, changed
}

// inlineRRs is how many records of the changed sections fit in the allocation of the message copy.
const inlineRRs = 8

// clampedMsg is a response copy together with room for its changed sections.
type clampedMsg struct {
	msg dns.Msg
	rrs [inlineRRs]dns.RR
}

// clampMsg returns m with its TTLs inside the window that applies, and counts the changes.
//
// The records m holds can be shared: the cache plugin keeps the ones it writes on a miss, and
// plugins such as file answer from their zone data. So m is never modified; when a TTL has to
// change, the message, the sections that change and the changed records are copied. A response
// whose TTLs already fit costs nothing.
func (c *Clamp) clampMsg(m *dns.Msg, server string) *dns.Msg {
	k := classify(m)
	if k == untouched {
		return m
	}
	win := c.Success
	if k == denial {
		win = c.Denial
	}

	sections := [3][]dns.RR{m.Answer, m.Ns, m.Extra}
	var changed [3]bool
	var t tally
	size := 0
	for s, rrs := range sections {
		soaMinimum := k == denial && s == authoritySection
		for _, rr := range rrs {
			if _, _, ch := win.target(rr, soaMinimum, &t); ch {
				changed[s] = true
			}
		}
		if changed[s] {
			size += len(rrs)
		}
	}
	if size == 0 {
		return m
	}
	c.counters.add(server, k, t)

	cm := &clampedMsg{msg: *m}
	backing := cm.rrs[:0]
	if size > inlineRRs {
		backing = make([]dns.RR, 0, size)
	}
	for s, rrs := range sections {
		if !changed[s] {
			continue
		}
		soaMinimum := k == denial && s == authoritySection
		start := len(backing)
		for _, rr := range rrs {
			if ttl, minimum, ch := win.target(rr, soaMinimum, &tally{}); ch {
				rr = withTTL(rr, ttl, minimum, soaMinimum)
			}
			backing = append(backing, rr)
		}
		// The full slice expression keeps a later append to one section from overwriting the next.
		sections[s] = backing[start:len(backing):len(backing)]
	}
	cm.msg.Answer, cm.msg.Ns, cm.msg.Extra = sections[answerSection], sections[authoritySection], sections[additionalSection]
	return &cm.msg
}

// withTTL returns a copy of rr with the given TTL, and for a SOA with setMinimum, MINIMUM. The
// common types are copied shallowly, sharing their read-only RDATA, which saves an allocation per
// record over dns.Copy.
func withTTL(rr dns.RR, ttl, minimum uint32, setMinimum bool) dns.RR {
	var cp dns.RR
	switch v := rr.(type) {
	case *dns.SOA:
		soa := shallow(v)
		if setMinimum {
			soa.Minttl = minimum
		}
		cp = soa
	case *dns.A:
		cp = shallow(v)
	case *dns.AAAA:
		cp = shallow(v)
	case *dns.CNAME:
		cp = shallow(v)
	case *dns.DNAME:
		cp = shallow(v)
	case *dns.NS:
		cp = shallow(v)
	case *dns.PTR:
		cp = shallow(v)
	case *dns.MX:
		cp = shallow(v)
	case *dns.SRV:
		cp = shallow(v)
	case *dns.TXT:
		cp = shallow(v)
	case *dns.RRSIG:
		cp = shallow(v)
	case *dns.SVCB:
		cp = shallow(v)
	case *dns.HTTPS:
		cp = shallow(v)
	default:
		cp = dns.Copy(rr)
	}
	cp.Header().Ttl = ttl
	return cp
}

func shallow[T any](v *T) *T {
	c := *v
	return &c
}
