package upstreamsvc

import (
	"testing"

	"github.com/coredns/caddy"

	"github.com/nodelocaldns/nodelocaldns/internal/readmetest"
)

// TestReadmeExamples parses the upstreamsvc directive of every Corefile example in the README.
func TestReadmeExamples(t *testing.T) {
	for _, example := range readmetest.Examples(t, "README.md", "upstreamsvc", 3) {
		c := caddy.NewTestController("dns", example)
		c.ServerBlockKeys = []string{"."}
		if _, err := parse(c); err != nil {
			t.Errorf("README example %q: %v", example, err)
		}
	}
}
