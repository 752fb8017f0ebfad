package clamp

import (
	"slices"
	"strings"
	"testing"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin/test"
)

func TestSetup(t *testing.T) {
	tests := []struct {
		input   string
		zones   []string
		success Window
		denial  Window
		err     string // substring of the expected error, empty for none
	}{
		// good
		{input: `clamp`, zones: []string{"example.org."}, success: Window{5, 30}, denial: Window{5, 5}},
		{input: `clamp {
		}`, zones: []string{"example.org."}, success: Window{5, 30}, denial: Window{5, 5}},
		{input: `clamp example.net example.com`, zones: []string{"example.net.", "example.com."}, success: Window{5, 30}, denial: Window{5, 5}},
		{input: `clamp {
			success 0 60
			denial 1 10
		}`, zones: []string{"example.org."}, success: Window{0, 60}, denial: Window{1, 10}},
		{input: `clamp {
			denial 10 20
		}`, zones: []string{"example.org."}, success: Window{5, 30}, denial: Window{10, 20}},
		{input: `clamp {
			success 30 30
		}`, zones: []string{"example.org."}, success: Window{30, 30}, denial: Window{5, 5}},
		{input: `clamp {
			success 0 2147483647
			denial 0 0
		}`, zones: []string{"example.org."}, success: Window{0, 2147483647}, denial: Window{0, 0}},

		// bad
		{input: `clamp {
			success 40 30
		}`, err: "success: MIN 40 is greater than MAX 30"},
		{input: `clamp {
			denial 6 5
		}`, err: "denial: MIN 6 is greater than MAX 5"},
		{input: `clamp {
			success -1 30
		}`, err: "success: MIN -1 is negative"},
		{input: `clamp {
			denial 5 -3
		}`, err: "denial: MAX -3 is negative"},
		{input: `clamp {
			success 5 -99999999999999999999
		}`, err: "MAX -99999999999999999999 is negative"},
		{input: `clamp {
			success five 30
		}`, err: "MIN 'five' is not a number of seconds"},
		{input: `clamp {
			success 5 30s
		}`, err: "MAX '30s' is not a number of seconds"},
		{input: `clamp {
			success 5.5 30
		}`, err: "MIN '5.5' is not a number of seconds"},
		{input: `clamp {
			success 5 2147483648
		}`, err: "MAX 2147483648 is over 2147483647"},
		{input: `clamp {
			denial 2147483648 2147483649
		}`, err: "MIN 2147483648 is over 2147483647"},
		{input: `clamp {
			success 5 99999999999999999999
		}`, err: "MAX 99999999999999999999 is over 2147483647"},
		{input: `clamp {
			success
		}`, err: "Wrong argument count"},
		{input: `clamp {
			success 5
		}`, err: "Wrong argument count"},
		{input: `clamp {
			denial 5 6 7
		}`, err: "Wrong argument count"},
		{input: `clamp {
			prefetch 10
		}`, err: "unknown property 'prefetch'"},
		{input: `clamp {
			success 5 30
			success 5 60
		}`, err: "property 'success' given more than once"},
		{input: `clamp {
			denial 5 5
			denial 1 1
		}`, err: "property 'denial' given more than once"},
		{input: "clamp\nclamp", err: "can only be used once per Server Block"},
	}

	for i, tc := range tests {
		c := caddy.NewTestController("dns", tc.input)
		c.ServerBlockKeys = []string{"example.org:53"}
		cl, err := parse(c)
		if tc.err != "" {
			if err == nil {
				t.Errorf("Test %d: expected error containing %q, got none for %q", i, tc.err, tc.input)
				continue
			}
			if !strings.Contains(err.Error(), tc.err) {
				t.Errorf("Test %d: expected error containing %q, got %q", i, tc.err, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("Test %d: unexpected error %q for %q", i, err, tc.input)
			continue
		}
		if !slices.Equal(cl.Zones, tc.zones) {
			t.Errorf("Test %d: zones %v, want %v", i, cl.Zones, tc.zones)
		}
		if cl.Success != tc.success {
			t.Errorf("Test %d: success window %v, want %v", i, cl.Success, tc.success)
		}
		if cl.Denial != tc.denial {
			t.Errorf("Test %d: denial window %v, want %v", i, cl.Denial, tc.denial)
		}
	}
}

// TestSetupRegisters checks that setup adds the handler and wraps its errors with the plugin name.
func TestSetupRegisters(t *testing.T) {
	c := caddy.NewTestController("dns", `clamp`)
	if err := setup(c); err != nil {
		t.Fatalf("setup: %v", err)
	}
	plugins := dnsserver.GetConfig(c).Plugin
	if len(plugins) != 1 {
		t.Fatalf("setup added %d plugins, want 1", len(plugins))
	}
	if _, ok := plugins[0](test.ErrorHandler()).(*Clamp); !ok {
		t.Fatalf("setup added a handler that is not *Clamp")
	}

	c = caddy.NewTestController("dns", "clamp {\n success 9 8\n}")
	err := setup(c)
	if err == nil || !strings.HasPrefix(err.Error(), "plugin/clamp: ") {
		t.Fatalf("setup error %v, want one starting with plugin/clamp", err)
	}
}
