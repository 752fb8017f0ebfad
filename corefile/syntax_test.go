package corefile

import (
	"strings"
	"testing"
)

func TestParseFormat(t *testing.T) {
	in := `# comment
cluster.local:53 in-addr.arpa:53 {   # trailing comment
  errors
  cache {
        success 9984 30
    denial 9984 5
  }
  rewrite name "a b.example." c.example.
  forward . 10.0.0.1 { force_tcp }
}
example.org:53,
example.net:53 {
  template IN A { answer "{{ .Name }} 60 IN A 10.0.0.1" }
  whoami
}
`
	want := `cluster.local:53 in-addr.arpa:53 {
    errors
    cache {
        success 9984 30
        denial 9984 5
    }
    rewrite name "a b.example." c.example.
    forward . 10.0.0.1 {
        force_tcp
    }
}

example.org:53 example.net:53 {
    template IN A {
        answer "{{ .Name }} 60 IN A 10.0.0.1"
    }
    whoami
}
`
	f, err := Parse([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if got := string(f.Format()); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	if f.Blocks[0].Line != 2 || f.Blocks[1].Line != 11 {
		t.Errorf("block lines %d %d", f.Blocks[0].Line, f.Blocks[1].Line)
	}
	cache := f.Blocks[0].Find("cache")[0]
	if cache.Line != 4 || cache.Option("denial").Line != 6 || strings.Join(cache.Option("denial").Args, " ") != "9984 5" {
		t.Errorf("cache %+v", cache)
	}
	again, err := Parse(f.Format())
	if err != nil || string(again.Format()) != want {
		t.Errorf("Format is not a fixed point: %v\n%s", err, again.Format())
	}
}

func TestParseSingleBlockWithoutBraces(t *testing.T) {
	f, err := Parse([]byte(".:53\nwhoami\nlog\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := string(f.Format()); got != ".:53 {\n    whoami\n    log\n}\n" {
		t.Errorf("got %q", got)
	}
}

func TestParseErrors(t *testing.T) {
	for in, want := range map[string]string{
		".:53 {\n errors\n":             "missing closing brace",
		".:53 {\n errors\n}\n}\n":       "line 4: unexpected \"}\"",
		"{\n errors\n}\n":               "line 1: unexpected \"{\"",
		".:53 {\n errors\n}\na:53\nlog": "line 4: server block a:53 has no opening brace",
		".:53 {\n {\n }\n}\n":           "line 2: unexpected '{'",
	} {
		_, err := Parse([]byte(in))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%q): got %v, want %q", in, err, want)
		}
	}
}
