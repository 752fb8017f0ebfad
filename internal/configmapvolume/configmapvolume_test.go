package configmapvolume

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestProject checks the layout after each of three updates: the keys read through ..data, a dropped key
// loses its symlink, and only the current data directory is left.
func TestProject(t *testing.T) {
	v, err := New(filepath.Join(t.TempDir(), "kube-dns"))
	if err != nil {
		t.Fatal(err)
	}
	for _, data := range []map[string]string{
		{},
		{"stubDomains": `{"acme.local":["192.0.2.54"]}`, "upstreamNameservers": `["192.0.2.54"]`},
		{"stubDomains": `{"acme.local":["192.0.2.55"]}`},
	} {
		if err := v.Project(data); err != nil {
			t.Fatal(err)
		}
		entries, err := os.ReadDir(v.Dir())
		if err != nil {
			t.Fatal(err)
		}
		var keys, hidden []string
		for _, e := range entries {
			if name := e.Name(); name[0] == '.' {
				hidden = append(hidden, name)
			} else {
				keys = append(keys, name)
			}
		}
		want := make([]string, 0, len(data))
		for key, value := range data {
			want = append(want, key)
			got, err := os.ReadFile(filepath.Join(v.Dir(), key))
			if err != nil || string(got) != value {
				t.Errorf("%s reads %q (%v), want %q", key, got, err, value)
			}
			if link, err := os.Readlink(filepath.Join(v.Dir(), key)); err != nil || link != filepath.Join("..data", key) {
				t.Errorf("%s is a link to %q (%v), want ..data/%s", key, link, err, key)
			}
		}
		slices.Sort(want)
		if !slices.Equal(keys, want) {
			t.Errorf("keys %v, want %v", keys, want)
		}
		if len(hidden) != 2 || !slices.Contains(hidden, "..data") {
			t.Errorf("hidden entries %v, want ..data and one data directory", hidden)
		}
	}
}
