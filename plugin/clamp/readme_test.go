package clamp

import (
	"os"
	"strings"
	"testing"

	"github.com/coredns/caddy"
)

// TestReadmeExamples parses the clamp directive of every Corefile example in the README.
func TestReadmeExamples(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatalf("reading the README: %v", err)
	}
	examples := 0
	inCorefile := false
	var directive []string
	for _, line := range strings.Split(string(readme), "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case trimmed == "~~~ corefile":
			inCorefile = true
		case trimmed == "~~~":
			inCorefile = false
		case inCorefile && directive == nil && strings.HasPrefix(trimmed, "clamp"):
			directive = []string{trimmed}
			if !strings.HasSuffix(trimmed, "{") {
				examples++
				checkExample(t, directive)
				directive = nil
			}
		case inCorefile && directive != nil:
			directive = append(directive, trimmed)
			if trimmed == "}" {
				examples++
				checkExample(t, directive)
				directive = nil
			}
		}
	}
	if examples < 2 {
		t.Errorf("found %d clamp examples in the README, want at least 2", examples)
	}
}

func checkExample(t *testing.T, directive []string) {
	t.Helper()
	input := strings.Join(directive, "\n")
	c := caddy.NewTestController("dns", input)
	c.ServerBlockKeys = []string{"."}
	if _, err := parse(c); err != nil {
		t.Errorf("README example %q: %v", input, err)
	}
}
