package upstreamsvc

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"time"

	"github.com/coredns/coredns/plugin/dnstap"
	"github.com/coredns/coredns/plugin/dnstap/msg"
	"github.com/coredns/coredns/plugin/metadata"
	"github.com/coredns/coredns/plugin/metrics"
	"github.com/coredns/coredns/plugin/pkg/proxy"
	"github.com/coredns/coredns/request"

	tap "github.com/dnstap/golang-dnstap"
	"github.com/miekg/dns"
	ot "github.com/opentracing/opentracing-go"
	otext "github.com/opentracing/opentracing-go/ext"
	"github.com/prometheus/client_golang/prometheus"
)

// errAttemptsExhausted means a query was sent max_attempts times and got no answer.
var errAttemptsExhausted = errors.New("no answer within max_attempts")

// attempts is one client query's retry budget (max_attempts): how many copies of it may still be sent
// upstream. Every copy counts, whatever sends it: the pipelined one, a stalled query's copy sent once more,
// each one through the proxies (forward's loop, which tried proxies until its 5 s deadline, is not used).
// A copy counts once it is handed to a connection, whether or not an answer comes; a query that no
// connection took (no pipelined connection up, a kept connection the cluster DNS had closed) spends
// nothing. Only the query's own goroutine spends it.
type attempts struct {
	max, sent int
	counter   prometheus.Counter // attempts_total of the query's server and zones
}

func newAttempts(maxAttempts int, counter prometheus.Counter) *attempts {
	return &attempts{max: maxAttempts, counter: counter}
}

// left reports whether one more copy may be sent.
func (a *attempts) left() bool { return a.sent < a.max }

// spent reports whether every copy the budget allows was sent.
func (a *attempts) spent() bool { return a.sent >= a.max }

// spend counts one copy sent.
func (a *attempts) spend() {
	a.sent++
	a.counter.Inc()
}

// forwarded sends r through the proxies, one copy at a time, until one is answered or the budget is spent,
// and writes the answer as forward would. pipeErr is why the pipelined copy, if one was sent, got no
// answer. It takes over the hold on up. A copy sent after one that got no answer goes to the current
// upstream: when the Service moved while the query was on its way, the retry goes to the new address
// (switch_retries_total).
func (u *UpstreamSvc) forwarded(ctx context.Context, up *upstream, w dns.ResponseWriter, r *dns.Msg, budget *attempts, pipeErr error) (int, error) {
	defer func() { u.release(up) }()
	state := request.Request{W: w, Req: r}
	var last *lazyProxy
	lastErr := pipeErr
	for budget.left() {
		if err := ctx.Err(); err != nil {
			return dns.RcodeServerFailure, err
		}
		if budget.sent > 0 {
			if next := u.acquire(); next != nil && next != up {
				u.release(up)
				up, last = next, nil
				switchRetries.WithLabelValues(metrics.WithServer(ctx), u.zones).Inc()
			} else if next != nil {
				u.release(next)
			}
		}
		px := up.pick(last)
		if px == nil {
			failFasts.WithLabelValues(metrics.WithServer(ctx), u.zones).Inc()
			return dns.RcodeServerFailure, errAllDown
		}
		last = px
		ret, err := u.connect(ctx, px, state, budget)
		switch {
		case err == nil && !state.Match(ret):
			// As forward answers a reply that does not match the query.
			formerr := new(dns.Msg)
			formerr.SetRcode(r, dns.RcodeFormatError)
			_ = w.WriteMsg(formerr)
			return dns.RcodeSuccess, nil
		case err == nil:
			_ = w.WriteMsg(ret)
			return dns.RcodeSuccess, nil
		case errors.Is(err, proxy.ErrInvalidRequest):
			return dns.RcodeFormatError, err
		case errors.Is(err, proxy.ErrUnsupportedRequest):
			return dns.RcodeNotImplemented, err
		}
		lastErr = err
		if ctx.Err() == nil {
			px.started().Healthcheck() // as forward does: is it our upstream that is broken?
		}
	}
	if lastErr == nil {
		lastErr = errors.New("nothing sent")
	}
	return dns.RcodeServerFailure, fmt.Errorf("%w (%d sent): %w", errAttemptsExhausted, budget.sent, lastErr)
}

// pick returns one of up's proxies that is not down, at random as forward's default policy picks, and
// another one than last where there is one; nil when every one is down.
func (up *upstream) pick(last *lazyProxy) *lazyProxy {
	n := len(up.proxies)
	start := 0
	if n > 1 {
		start = rand.IntN(n) //nolint:gosec // spreading queries needs no unpredictable choice
	}
	var again *lazyProxy
	for i := range n {
		p := up.proxies[(start+i)%n]
		switch {
		case p.Down(maxFails):
		case p != last:
			return p
		default:
			again = p
		}
	}
	return again
}

// connect sends one copy of state's query through px, as forward's loop does for one proxy: again at once
// when the kept connection it took turned out closed by the cluster DNS (the query did not reach it), and
// over TCP when a UDP answer came truncated, if the budget allows that copy too (else the truncated answer
// goes to the client, which asks over TCP itself). It sets forward/upstream, traces and taps each copy as
// forward does.
func (u *UpstreamSvc) connect(ctx context.Context, lp *lazyProxy, state request.Request, budget *attempts) (*dns.Msg, error) {
	px := lp.started()
	metadata.SetValueFunc(ctx, "forward/upstream", px.Addr)
	if span := ot.SpanFromContext(ctx); span != nil {
		child := span.Tracer().StartSpan("connect", ot.ChildOf(span.Context()))
		otext.PeerAddress.Set(child, px.Addr())
		ctx = ot.ContextWithSpan(ctx, child)
		defer child.Finish()
	}
	opts := u.proxyOptions()
	budget.spend()
	for {
		start := time.Now()
		ret, local, proto, err := px.Connect(ctx, state, opts)
		if errors.Is(err, proxy.ErrCachedClosed) {
			continue
		}
		u.toDnstap(ctx, px.Addr(), local, proto, state, ret, start)
		if err == nil && ret.Truncated && !opts.ForceTCP && budget.left() {
			opts.ForceTCP = true
			budget.spend()
			continue
		}
		return ret, err
	}
}

// toDnstap hands the dnstap plugins of the block a copy sent to addr from local over proto, and its answer
// (nil: none came), as forwarder messages from this server to the upstream.
func (u *UpstreamSvc) toDnstap(ctx context.Context, addr string, local net.Addr, proto string, state request.Request, reply *dns.Msg, start time.Time) {
	if u.tap == nil {
		return
	}
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return // the addresses are IP:port, checked when they were set
	}
	var upstream net.Addr = net.UDPAddrFromAddrPort(ap)
	if proto == "tcp" {
		upstream = net.TCPAddrFromAddrPort(ap)
	}
	message := func(typ tap.Message_Type) *tap.Message {
		t := new(tap.Message)
		msg.SetType(t, typ)
		msg.SetQueryTime(t, start)
		if local != nil {
			_ = msg.SetQueryAddress(t, local)
		}
		_ = msg.SetResponseAddress(t, upstream)
		return t
	}
	for t := u.tap; t != nil; {
		q := message(tap.Message_FORWARDER_QUERY)
		if t.IncludeRawMessage {
			q.QueryMessage, _ = state.Req.Pack()
		}
		t.TapMessageWithMetadata(ctx, q, state)
		if reply != nil {
			a := message(tap.Message_FORWARDER_RESPONSE)
			msg.SetResponseTime(a, time.Now())
			if t.IncludeRawMessage {
				a.ResponseMessage, _ = reply.Pack()
			}
			t.TapMessageWithMetadata(ctx, a, state)
		}
		next, _ := t.Next.(*dnstap.Dnstap) // a block with several dnstap directives chains them
		t = next
	}
}
