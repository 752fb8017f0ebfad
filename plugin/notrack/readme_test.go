//go:build linux

package notrack

import (
	"testing"

	"github.com/coredns/caddy"

	"github.com/nodelocaldns/nodelocaldns/internal/readmetest"
)

// TestReadmeExamples parses the notrack directive of every Corefile example in the README.
func TestReadmeExamples(t *testing.T) {
	for _, example := range readmetest.Examples(t, "README.md", "notrack", 5) {
		c := caddy.NewTestController("dns", example)
		c.ServerBlockKeys = []string{"."}
		if _, err := parse(c); err != nil {
			t.Errorf("README example %q: %v", example, err)
		}
	}
}
