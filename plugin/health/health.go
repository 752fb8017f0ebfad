// Package health is the health directive: CoreDNS's, with the same syntax, endpoint and metrics, and a
// self-check that backs off while the process answers it quickly.
//
// CoreDNS's health plugin asks its own /health every second, over a new connection each time, to measure
// how well the process keeps up with its load. On an idle node that is most of what the cache does: some
// twenty context switches and a millisecond of CPU every second. This one asks after a second, then
// doubles the wait after every quick answer, up to a minute, and starts again from a second after a slow
// or failed one.
package health

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/coredns/coredns/plugin/pkg/reuseport"
)

const (
	// defaultAddr is where /health is served when the directive names no address, as CoreDNS's does.
	defaultAddr = ":8080"
	// healthPath is the endpoint; it answers 200 and "OK" while the process runs.
	healthPath = "/health"
	// serverTimeout bounds reading a request, writing a reply and keeping an idle connection.
	serverTimeout = 5 * time.Second
	// shutdownTimeout bounds the wait for the requests being answered when the server stops.
	shutdownTimeout = 5 * time.Second

	// The self-check: first after selfCheckMin, then every selfCheckMax; after a slow or failed one (not
	// within selfCheckSlow) again after selfCheckMin, the wait doubling after every quick answer back up to
	// selfCheckMax; each bounded by selfCheckTimeout.
	selfCheckMin     = time.Second
	selfCheckMax     = time.Minute
	selfCheckSlow    = time.Second
	selfCheckTimeout = 3 * time.Second
)

// Health serves /health on one address for the whole process, and checks now and then that it answers.
type Health struct {
	// Addr is the listen address; defaultAddr when empty.
	Addr string
	// Lameduck delays the final shutdown, /health still answering.
	Lameduck time.Duration

	srv     *http.Server
	stop    context.CancelFunc
	serving bool
}

// New returns a Health for addr with a lame-duck delay.
func New(addr string, lameduck time.Duration) *Health {
	return &Health{Addr: addr, Lameduck: lameduck}
}

// OnStartup listens (SO_REUSEPORT, as CoreDNS's plugins do, so that a successor listens beside its
// owner), serves /health and starts the self-check.
func (h *Health) OnStartup() error {
	addr := h.Addr
	if addr == "" {
		addr = defaultAddr
	}
	ln, err := reuseport.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", addr, err)
	}
	self, err := selfURL(addr, ln.Addr())
	if err != nil {
		ln.Close()
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc(healthPath, func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, http.StatusText(http.StatusOK))
	})
	h.srv = &http.Server{Handler: mux, ReadTimeout: serverTimeout, WriteTimeout: serverTimeout, IdleTimeout: serverTimeout}
	srv := h.srv
	go func() { _ = srv.Serve(ln) }()
	ctx, stop := context.WithCancel(context.Background())
	h.stop = stop
	go selfCheck(ctx, self)
	h.serving = true
	return nil
}

// selfURL is the URL the self-check asks: the listen address, with localhost for no host and the port the
// listener got for port 0.
func selfURL(addr string, bound net.Addr) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("health address %q: %w", addr, err)
	}
	if host == "" {
		host = "localhost"
	}
	if port == "0" {
		if tcp, ok := bound.(*net.TCPAddr); ok {
			port = strconv.Itoa(tcp.Port)
		}
	}
	return "http://" + net.JoinHostPort(host, port) + healthPath, nil
}

// OnRestart stops serving: the Corefile's next instance listens anew.
func (h *Health) OnRestart() error {
	h.shutdown()
	return nil
}

// OnFinalShutdown waits out the lame-duck delay, still answering, then stops serving.
func (h *Health) OnFinalShutdown() error {
	if !h.serving {
		return nil
	}
	if h.Lameduck > 0 {
		log.Infof("Going into lameduck mode for %s", h.Lameduck)
		time.Sleep(h.Lameduck)
	}
	h.shutdown()
	return nil
}

func (h *Health) shutdown() {
	if !h.serving {
		return
	}
	h.stop()
	ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if err := h.srv.Shutdown(ctx); err != nil {
		log.Infof("Failed to stop health http server: %s", err)
	}
	h.serving = false
}

// selfCheck asks url until ctx ends, at the waits nextSelfCheck gives, and observes each answer's time in
// the metrics; a slow or failed one is logged.
func selfCheck(ctx context.Context, url string) {
	// No proxy from the environment, and a connection per request: at these waits, any kept one would have
	// been closed by the server's idle timeout before the next check.
	client := &http.Client{Timeout: selfCheckTimeout, Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
	// One check soon after the start, so that the metrics have a sample, then on as if the checks before
	// had answered quickly: a minute apart.
	t := time.NewTimer(selfCheckMin)
	defer t.Stop()
	wait := selfCheckMax
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		start := time.Now()
		err := askSelf(ctx, client, url)
		took := time.Since(start)
		if ctx.Err() != nil {
			return
		}
		requestDuration.Observe(took.Seconds())
		switch {
		case err != nil:
			requestFailures.Inc()
			log.Warningf("Local health request to %q failed: %s", url, err)
		case took > selfCheckSlow:
			log.Warningf("Local health request to %q took more than %v: %s", url, selfCheckSlow, took)
		}
		wait = nextSelfCheck(wait, took, err)
		t.Reset(wait)
	}
}

// nextSelfCheck is the wait before the next self-check, after one that took took and ended with err
// following a wait of last.
func nextSelfCheck(last, took time.Duration, err error) time.Duration {
	if err != nil || took > selfCheckSlow {
		return selfCheckMin
	}
	return min(2*last, selfCheckMax)
}

// askSelf GETs url and reads the answer whole; anything but 200 is an error.
func askSelf(ctx context.Context, client *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return fmt.Errorf("read the answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return errors.New(resp.Status)
	}
	return nil
}
