//go:build !linux

package notrack

import (
	"errors"
	"strings"
	"testing"

	"github.com/coredns/caddy"

	"github.com/nodelocaldns/nodelocaldns/nodelocal"
)

func TestSetupNeedsLinux(t *testing.T) {
	err := setup(caddy.NewTestController("dns", "notrack 169.254.20.10"))
	if !errors.Is(err, nodelocal.ErrNotLinux) || !strings.Contains(err.Error(), "notrack needs Linux") {
		t.Fatalf("setup on a system other than Linux: %v, want an error that says notrack needs Linux", err)
	}
}
