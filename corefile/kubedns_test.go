package corefile

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/nodelocaldns/nodelocaldns/internal/atomicfile"
)

func TestParseKubeDNS(t *testing.T) {
	tests := []struct {
		name string
		data map[string]string
		want KubeDNS
		err  string // empty: valid
	}{
		{name: "empty", data: map[string]string{}},
		{name: "blank values", data: map[string]string{StubDomainsKey: " \n", UpstreamNameserversKey: ""}},
		{name: "federations only", data: map[string]string{"federations": `{"myfed": "example.com"}`}},
		{
			name: "stub domains",
			data: map[string]string{StubDomainsKey: `{"acme.local": ["1.2.3.4"], "corp.example.com": ["10.0.0.1:5353", "2001:db8::1", "[2001:db8::2]:53"]}`},
			want: KubeDNS{StubDomains: map[string][]string{
				"acme.local":       {"1.2.3.4"},
				"corp.example.com": {"10.0.0.1:5353", "2001:db8::1", "[2001:db8::2]:53"},
			}},
		},
		{
			name: "three upstreams",
			data: map[string]string{UpstreamNameserversKey: `["8.8.8.8", "[2001:4860:4860::8888]:53", "1.1.1.1:5353"]`},
			want: KubeDNS{UpstreamNameservers: []string{"8.8.8.8", "[2001:4860:4860::8888]:53", "1.1.1.1:5353"}},
		},
		{
			name: "port 65535",
			data: map[string]string{UpstreamNameserversKey: `["1.1.1.1:65535"]`},
			want: KubeDNS{UpstreamNameservers: []string{"1.1.1.1:65535"}},
		},
		{name: "four upstreams", data: map[string]string{UpstreamNameserversKey: `["1.1.1.1", "1.0.0.1", "8.8.8.8", "8.8.4.4"]`}, err: "at most 3"},
		{name: "upstream hostname", data: map[string]string{UpstreamNameserversKey: `["dns.google"]`}, err: "not IP or IP:PORT"},
		{name: "upstream port 0", data: map[string]string{UpstreamNameserversKey: `["1.1.1.1:0"]`}, err: "not in 1-65535"},
		{name: "upstream port too big", data: map[string]string{UpstreamNameserversKey: `["1.1.1.1:65536"]`}, err: "not in 1-65535"},
		{name: "upstream port not a number", data: map[string]string{UpstreamNameserversKey: `["1.1.1.1:dns"]`}, err: "not in 1-65535"},
		{name: "upstream IPv6 port without brackets", data: map[string]string{UpstreamNameserversKey: `["2001:db8::1]:53"]`}, err: "not IP or IP:PORT"},
		{name: "upstream with zone", data: map[string]string{UpstreamNameserversKey: `["fe80::1%eth0"]`}, err: "zones"},
		{name: "upstream not a list", data: map[string]string{UpstreamNameserversKey: `"8.8.8.8"`}, err: "JSON list"},
		{name: "stub not an object", data: map[string]string{StubDomainsKey: `["acme.local"]`}, err: "JSON object"},
		{name: "stub broken JSON", data: map[string]string{StubDomainsKey: `{"acme.local": ["1.2.3.4"]`}, err: "JSON object"},
		{name: "stub domain uppercase", data: map[string]string{StubDomainsKey: `{"Acme.Local": ["1.2.3.4"]}`}, err: "not a valid domain name"},
		{name: "stub domain underscore", data: map[string]string{StubDomainsKey: `{"my_corp.local": ["1.2.3.4"]}`}, err: "not a valid domain name"},
		{name: "stub domain trailing dot", data: map[string]string{StubDomainsKey: `{"acme.local.": ["1.2.3.4"]}`}, err: "not a valid domain name"},
		{name: "stub without servers", data: map[string]string{StubDomainsKey: `{"acme.local": []}`}, err: "no nameservers"},
		{name: "stub server hostname", data: map[string]string{StubDomainsKey: `{"acme.local": ["ns1.acme.local"]}`}, err: "not IP or IP:PORT"},
		{name: "stub server bad port", data: map[string]string{StubDomainsKey: `{"acme.local": ["1.2.3.4:99999"]}`}, err: "not in 1-65535"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseKubeDNS(tt.data)
			if tt.err == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				if !reflect.DeepEqual(got, tt.want) {
					t.Errorf("got %+v, want %+v", got, tt.want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Fatalf("got error %v, want one containing %q", err, tt.err)
			}
		})
	}
}

func TestReadKubeDNSDir(t *testing.T) {
	t.Run("mounted ConfigMap", func(t *testing.T) {
		// A ConfigMap volume: the keys are symlinks into a hidden, atomically swapped directory.
		dir := t.TempDir()
		data := filepath.Join(dir, "..2024_01_01_00_00_00.000000001")
		if err := os.Mkdir(data, 0o755); err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(data, StubDomainsKey), `{"acme.local": ["1.2.3.4"]}`)
		if err := os.Symlink(filepath.Base(data), filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join("..data", StubDomainsKey), filepath.Join(dir, StubDomainsKey)); err != nil {
			t.Fatal(err)
		}
		got, err := ReadKubeDNSDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got.StubDomains, map[string][]string{"acme.local": {"1.2.3.4"}}) || got.UpstreamNameservers != nil {
			t.Errorf("got %+v", got)
		}
	})
	t.Run("empty directory of an optional ConfigMap", func(t *testing.T) {
		got, err := ReadKubeDNSDir(t.TempDir())
		if err != nil || !reflect.DeepEqual(got, KubeDNS{}) {
			t.Errorf("got %+v, %v", got, err)
		}
	})
	t.Run("missing directory", func(t *testing.T) {
		if _, err := ReadKubeDNSDir(filepath.Join(t.TempDir(), "nope")); err == nil {
			t.Error("no error for a missing directory")
		}
	})
	t.Run("invalid content names the directory", func(t *testing.T) {
		dir := t.TempDir()
		writeFile(t, filepath.Join(dir, UpstreamNameserversKey), `["8.8.8.8:0"]`)
		_, err := ReadKubeDNSDir(dir)
		if err == nil || !strings.Contains(err.Error(), dir) {
			t.Errorf("got %v", err)
		}
	})
}

// writeFile replaces path in one rename, as the kubelet updates a ConfigMap volume: a watcher reading it
// sees the old content or the new, never a truncated file (which a plain os.WriteFile shows it for a moment,
// and which reads as a valid, empty setting).
func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := atomicfile.Write(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
