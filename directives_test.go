package nodelocaldns

import (
	"slices"
	"strings"
	"testing"
)

func TestCompiledDirectives(t *testing.T) {
	order := []string{"bind", "notrack", "wirecache", "prometheus", "clamp", "cache", "upstreamsvc", "forward"}
	got, err := compiledDirectives(order, map[string]bool{"forward": true, "clamp": true, "cache": true, "bind": true})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"bind", "clamp", "cache", "forward"}; !slices.Equal(got, want) {
		t.Errorf("got %v, want plugin.cfg's order %v", got, want)
	}
	registered := map[string]bool{"cache": true, "zeta": true, "alpha": true}
	_, err = compiledDirectives(order, registered)
	if err == nil || !strings.Contains(err.Error(), "absent from plugin.cfg: alpha, zeta") {
		t.Errorf("plugins outside plugin.cfg: got %v", err)
	}
	if len(registered) != 3 {
		t.Errorf("the registered set was changed: %v", registered)
	}
}
