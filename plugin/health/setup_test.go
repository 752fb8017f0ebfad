package health

import (
	"strings"
	"testing"
	"time"

	"github.com/coredns/caddy"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		input    string
		addr     string
		lameduck time.Duration
		err      string
	}{
		{input: "health", addr: ""},
		{input: "health :8080", addr: ":8080"},
		{input: "health 169.254.20.10:8080", addr: "169.254.20.10:8080"},
		{input: "health localhost:8092 {\n lameduck 1s\n}", addr: "localhost:8092", lameduck: time.Second},
		{input: "health {\n lameduck 5s\n}", lameduck: 5 * time.Second},
		{input: "health 169.254.20.10", err: "missing port"},
		{input: "health :8080 :8081", err: "Wrong argument count"},
		{input: "health :8080 {\n lameduck\n}", err: "Wrong argument count"},
		{input: "health :8080 {\n lameduck 1x\n}", err: "unable to parse lameduck duration"},
		{input: "health :8080 {\n overloaded\n}", err: "unknown property 'overloaded'"},
	} {
		t.Run(tc.input, func(t *testing.T) {
			addr, lameduck, err := parse(caddy.NewTestController("dns", tc.input))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want it to contain %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if addr != tc.addr || lameduck != tc.lameduck {
				t.Errorf("got %q %v, want %q %v", addr, lameduck, tc.addr, tc.lameduck)
			}
		})
	}
}
