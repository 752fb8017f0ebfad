package health

import (
	"testing"

	"github.com/coredns/caddy"

	"github.com/nodelocaldns/nodelocaldns/internal/readmetest"
)

// TestReadmeExamples parses the health directive of every Corefile example in the README.
func TestReadmeExamples(t *testing.T) {
	for _, example := range readmetest.Examples(t, "README.md", "health", 2) {
		if _, _, err := parse(caddy.NewTestController("dns", example)); err != nil {
			t.Errorf("README example %q: %v", example, err)
		}
	}
}
