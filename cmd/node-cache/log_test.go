//go:build linux

package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/nodelocaldns/nodelocaldns/nodelocal"
)

var _ nodelocal.Logger = log // the guard logs through the one logger too

// TestMetricsServer: the one metrics server serves /metrics and bounds the time a client may take to send
// its headers (a server without ReadHeaderTimeout keeps slow or idle connections open for ever).
func TestMetricsServer(t *testing.T) {
	srv := metricsServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("up 1\n")) }))
	if srv.ReadHeaderTimeout <= 0 {
		t.Errorf("ReadHeaderTimeout %v", srv.ReadHeaderTimeout)
	}
	rec := httptest.NewRecorder()
	srv.Handler.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), "up 1") {
		t.Errorf("/metrics: %d %q", rec.Code, rec.Body.String())
	}
}
