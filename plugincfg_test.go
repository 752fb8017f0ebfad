package nodelocaldns

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/coredns/coredns/core/dnsserver"
)

// ourPlugins says where each nodelocaldns plugin belongs relative to a stock CoreDNS directive.
var ourPlugins = []struct {
	name, pkg string
	// after or before names the stock directive that must be its direct neighbour.
	after, before string
}{
	{name: "notrack", pkg: "github.com/nodelocaldns/nodelocaldns/plugin/notrack", after: "bind"},
	{name: "wirecache", pkg: "github.com/nodelocaldns/nodelocaldns/plugin/wirecache", before: "prometheus"},
	{name: "clamp", pkg: "github.com/nodelocaldns/nodelocaldns/plugin/clamp", before: "cache"},
	{name: "upstreamsvc", pkg: "github.com/nodelocaldns/nodelocaldns/plugin/upstreamsvc", before: "forward"},
}

func TestPluginCfgIsStockOrderPlusOurs(t *testing.T) {
	plugins, err := Plugins()
	if err != nil {
		t.Fatal(err)
	}
	var names, withoutOurs []string
	ours := map[string]string{}
	for _, p := range ourPlugins {
		ours[p.name] = p.pkg
	}
	for _, p := range plugins {
		names = append(names, p.Name)
		if pkg, ok := ours[p.Name]; ok {
			if p.Package != pkg {
				t.Errorf("plugin.cfg: %s is %s, want %s", p.Name, p.Package, pkg)
			}
			continue
		}
		withoutOurs = append(withoutOurs, p.Name)
	}
	// dnsserver.Directives still holds CoreDNS's generated stock order: nothing in this test binary calls
	// SetDirectives.
	if !slices.Equal(withoutOurs, dnsserver.Directives) {
		t.Errorf("plugin.cfg without our plugins differs from CoreDNS's order:\n got %s\nwant %s",
			strings.Join(withoutOurs, " "), strings.Join(dnsserver.Directives, " "))
	}
	for _, p := range ourPlugins {
		i := slices.Index(names, p.name)
		switch {
		case i < 0:
			t.Errorf("plugin.cfg lacks %s", p.name)
		case p.after != "" && (i == 0 || names[i-1] != p.after):
			t.Errorf("plugin.cfg: %s must come right after %s", p.name, p.after)
		case p.before != "" && (i+1 == len(names) || names[i+1] != p.before):
			t.Errorf("plugin.cfg: %s must come right before %s", p.name, p.before)
		}
	}
}

func TestPluginCfgQualifiesStockPackages(t *testing.T) {
	plugins, err := Plugins()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"prometheus": "github.com/coredns/coredns/plugin/metrics",
		"cache":      "github.com/coredns/coredns/plugin/cache",
		"on":         "github.com/coredns/caddy/onevent",
		// CoreDNS's directive, in its place, from our package (plugin/health).
		"health": "github.com/nodelocaldns/nodelocaldns/plugin/health",
	}
	for _, p := range plugins {
		if pkg, ok := want[p.Name]; ok && p.Package != pkg {
			t.Errorf("%s: package %s, want %s", p.Name, p.Package, pkg)
		}
	}
}

func TestParsePluginCfgRejectsWhatGenerateWouldDrop(t *testing.T) {
	for _, tc := range []struct {
		name, text, wantErr string
	}{
		{"no colon", "cache\n", "is not <name>:<package>"},
		{"empty package", "cache:\n", "is not <name>:<package>"},
		{"two colons", "cache:cache:x\n", "is not <name>:<package>"},
		{"indented comment", "  # cache:cache\n", "must start in the first column"},
		{"duplicate", "cache:cache\n# comment\ncache:cache\n", `directive "cache" already listed on line 1`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parsePluginCfg(tc.text)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.wantErr)
			}
		})
	}
	got, err := parsePluginCfg("# c\n\n  bind:bind  \nx:example.com/x\n")
	if err != nil {
		t.Fatal(err)
	}
	want := []Plugin{{"bind", "github.com/coredns/coredns/plugin/bind"}, {"x", "example.com/x"}}
	if !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

// TestPluginCfgNamesOnlyPackagesThatExist keeps `go generate` in a CoreDNS checkout working: an entry for a
// plugin of ours that is not in this repository would break that build.
func TestPluginCfgNamesOnlyPackagesThatExist(t *testing.T) {
	plugins, err := Plugins()
	if err != nil {
		t.Fatal(err)
	}
	const module = "github.com/nodelocaldns/nodelocaldns/"
	for _, p := range plugins {
		dir, ours := strings.CutPrefix(p.Package, module)
		if !ours {
			continue
		}
		if files, _ := filepath.Glob(filepath.Join(filepath.FromSlash(dir), "setup.go")); len(files) == 0 {
			t.Errorf("plugin.cfg lists %s, but %s/setup.go does not exist", p.Name, dir)
		}
	}
}
