package notrack

import (
	"os"
	"strings"
	"testing"

	"github.com/coredns/caddy"
)

// TestReadmeExamples parses the notrack directive of every Corefile example in the README.
func TestReadmeExamples(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatalf("reading the README: %v", err)
	}
	examples := 0
	inCorefile := false
	var directive []string
	check := func() {
		examples++
		input := strings.Join(directive, "\n")
		if _, err := parse(caddy.NewTestController("dns", input)); err != nil {
			t.Errorf("README example %q: %v", input, err)
		}
		directive = nil
	}
	for _, line := range strings.Split(string(readme), "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case trimmed == "~~~ corefile":
			inCorefile = true
		case trimmed == "~~~":
			inCorefile = false
		case inCorefile && directive == nil && strings.HasPrefix(trimmed, "notrack"):
			directive = []string{trimmed}
			if !strings.HasSuffix(trimmed, "{") {
				check()
			}
		case inCorefile && directive != nil:
			directive = append(directive, trimmed)
			if trimmed == "}" {
				check()
			}
		}
	}
	if examples < 5 {
		t.Errorf("found %d notrack examples in the README, want at least 5", examples)
	}
}
