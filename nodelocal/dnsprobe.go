//go:build linux

package nodelocal

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/miekg/dns"
)

// DNSProbe returns a ProbeFunc that asks name and qtype over UDP and waits up to timeout. Any well-formed
// answer with the query's ID counts, whatever its rcode: the server is alive. With an empty name it asks
// ". SOA" with EDNS version 1, which a server answers with BADVERS without looking at the question.
func DNSProbe(name string, qtype uint16, timeout time.Duration) ProbeFunc {
	return func(ctx context.Context, server netip.AddrPort) error {
		m := new(dns.Msg)
		if name == "" {
			m.SetQuestion(".", qtype)
			m.SetEdns0(dns.MinMsgSize, false)
			m.IsEdns0().SetVersion(1)
		} else {
			m.SetQuestion(dns.Fqdn(name), qtype)
			m.RecursionDesired = true
		}
		c := &dns.Client{Net: "udp", Timeout: timeout}
		r, _, err := c.ExchangeContext(ctx, m, server.String())
		if err != nil {
			return fmt.Errorf("probe %s: %w", server, err)
		}
		return CheckProbeResponse(m, r)
	}
}

// CheckProbeResponse reports whether r is an answer to q: a response with q's ID and question.
func CheckProbeResponse(q, r *dns.Msg) error {
	switch {
	case r == nil:
		return errors.New("no response")
	case !r.Response:
		return errors.New("a query came back, not a response")
	case r.Id != q.Id:
		return fmt.Errorf("response ID %d, query ID %d", r.Id, q.Id)
	case len(r.Question) > 0 && len(q.Question) > 0 && !sameQuestion(r.Question[0], q.Question[0]):
		return fmt.Errorf("response for %s, query for %s", r.Question[0].String(), q.Question[0].String())
	}
	return nil
}

func sameQuestion(a, b dns.Question) bool {
	return a.Qtype == b.Qtype && a.Qclass == b.Qclass && dns.CanonicalName(a.Name) == dns.CanonicalName(b.Name)
}

// Backoff between probes of an endpoint that did not answer yet, and how often that is logged.
const (
	awaitBackoffMin = 5 * time.Millisecond
	awaitBackoffMax = 500 * time.Millisecond
	awaitLogEvery   = 10 * time.Second
)

// AwaitAnswers probes every endpoint, each on its own, until probe succeeds there, with a growing pause
// between failed probes, and logs to log every awaitLogEvery an endpoint has not answered. It returns
// ctx's error if ctx ends first.
func AwaitAnswers(ctx context.Context, endpoints []netip.AddrPort, probe ProbeFunc, log Logger) error {
	errc := make(chan error, len(endpoints))
	for _, e := range endpoints {
		go func() { errc <- awaitAnswer(ctx, e, probe, log) }()
	}
	var first error
	for range endpoints {
		if err := <-errc; err != nil && first == nil {
			first = err
		}
	}
	return first
}

func awaitAnswer(ctx context.Context, endpoint netip.AddrPort, probe ProbeFunc, log Logger) error {
	start := time.Now()
	nextLog := start.Add(awaitLogEvery)
	wait := awaitBackoffMin
	for {
		err := probe(ctx, endpoint)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if now := time.Now(); now.After(nextLog) {
			log.Warningf("no answer from this server on %s after %v, rules for it wait: %v", endpoint, now.Sub(start).Round(time.Second), err)
			nextLog = now.Add(awaitLogEvery)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		wait = min(2*wait, awaitBackoffMax)
	}
}
