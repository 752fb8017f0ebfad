//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	clog "github.com/coredns/coredns/plugin/pkg/log"
)

// log is node-cache's one logger, in every mode (cache, drop-in, guard): CoreDNS's, under the name the
// corefile package's drop-in watch logs with, so that every line of the process has one form and goes where
// CoreDNS's go. It is a nodelocal.Logger.
var log = clog.NewWithPlugin("node-cache")

// metricsReadHeaderTimeout bounds how long a client may take to send its request headers, so that slow or
// idle connections cannot pile up on the metrics listener.
const metricsReadHeaderTimeout = 5 * time.Second

// serveMetrics is node-cache's one metrics server: it serves h at /metrics on addr until ctx ends. The
// drop-in mode serves the default Prometheus registry (node-cache's setup error counter along with
// everything CoreDNS registers), the guard a registry of its own.
func serveMetrics(ctx context.Context, addr string, h http.Handler) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("-metrics-listen-address: %w", err)
	}
	srv := metricsServer(h)
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Errorf("metrics listener %s: %v", addr, err)
		}
	}()
	go func() { <-ctx.Done(); srv.Close() }()
	return nil
}

func metricsServer(h http.Handler) *http.Server {
	mux := http.NewServeMux()
	mux.Handle("/metrics", h)
	return &http.Server{Handler: mux, ReadHeaderTimeout: metricsReadHeaderTimeout}
}
