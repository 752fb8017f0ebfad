package health

import (
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
)

func get(t *testing.T, url string) (int, string, error) {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
	resp, err := c.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// A Health answers 200 OK on /health, lets go of its address on a restart (the next instance listens),
// listens again when the restart fails, and stops at the final shutdown.
func TestHealthServesAcrossRestarts(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0") // a free port
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	url := "http://" + addr + healthPath

	h := New(addr, 0)
	if err := h.OnStartup(); err != nil {
		t.Fatal(err)
	}
	if code, body, err := get(t, url); err != nil || code != http.StatusOK || body != "OK" {
		t.Fatalf("GET %s: %d %q %v, want 200 OK", url, code, body, err)
	}
	if err := h.OnRestart(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := get(t, url); err == nil {
		t.Fatal("still answering after OnRestart")
	}
	next := New(addr, 0) // the restarted Corefile's instance
	if err := next.OnStartup(); err != nil {
		t.Fatalf("the next instance cannot listen: %v", err)
	}
	if code, _, err := get(t, url); err != nil || code != http.StatusOK {
		t.Fatalf("next instance: %d %v", code, err)
	}
	if err := next.OnFinalShutdown(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := get(t, url); err == nil {
		t.Fatal("still answering after OnFinalShutdown")
	}
	if err := next.OnFinalShutdown(); err != nil { // a second shutdown does nothing
		t.Fatal(err)
	}
}

func TestSelfURL(t *testing.T) {
	bound := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40123}
	for _, tc := range []struct{ addr, want string }{
		{":8080", "http://localhost:8080/health"},
		{"169.254.20.10:8080", "http://169.254.20.10:8080/health"},
		{"[fd00::a]:8080", "http://[fd00::a]:8080/health"},
		{"127.0.0.1:0", "http://127.0.0.1:40123/health"},
	} {
		if got, err := selfURL(tc.addr, bound); err != nil || got != tc.want {
			t.Errorf("selfURL(%q) = %q %v, want %q", tc.addr, got, err, tc.want)
		}
	}
}

// The self-check's wait starts again from selfCheckMin after a slow or failed answer and doubles after
// every quick one up to selfCheckMax, where it stays (selfCheck starts there after its first check).
func TestNextSelfCheck(t *testing.T) {
	quick := time.Millisecond
	for _, tc := range []struct {
		name       string
		last, took time.Duration
		err        error
		want       time.Duration
	}{
		{"first quick answer after a slow one", selfCheckMin, quick, nil, 2 * selfCheckMin},
		{"doubling", 8 * time.Second, quick, nil, 16 * time.Second},
		{"capped", 40 * time.Second, quick, nil, selfCheckMax},
		{"at the cap", selfCheckMax, quick, nil, selfCheckMax},
		{"slow", selfCheckMax, selfCheckSlow + time.Millisecond, nil, selfCheckMin},
		{"failed", 16 * time.Second, quick, errors.New("connection refused"), selfCheckMin},
	} {
		if got := nextSelfCheck(tc.last, tc.took, tc.err); got != tc.want {
			t.Errorf("%s: nextSelfCheck(%v, %v, %v) = %v, want %v", tc.name, tc.last, tc.took, tc.err, got, tc.want)
		}
	}
}

func samples(t *testing.T) (count uint64, failures float64) {
	t.Helper()
	var m dto.Metric
	if err := requestDuration.Write(&m); err != nil {
		t.Fatal(err)
	}
	count = m.GetHistogram().GetSampleCount()
	if err := requestFailures.Write(&m); err != nil {
		t.Fatal(err)
	}
	return count, m.GetCounter().GetValue()
}

// The self-check asks the endpoint (after selfCheckMin) and observes the answer.
func TestSelfCheckObservesItsAnswers(t *testing.T) {
	before, failedBefore := samples(t)
	h := New("127.0.0.1:0", 0)
	if err := h.OnStartup(); err != nil {
		t.Fatal(err)
	}
	defer h.OnFinalShutdown()
	deadline := time.Now().Add(30 * time.Second)
	for {
		n, failed := samples(t)
		if failed != failedBefore {
			t.Fatalf("the self-check failed %v times", failed-failedBefore)
		}
		if n > before {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no self-check observed within 30 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
