package bytesize

import "testing"

func TestParse(t *testing.T) {
	for s, want := range map[string]int64{
		"8MiB": 8 << 20, "8Mi": 8 << 20, "8M": 8 << 20, "512KiB": 512 << 10, "512Ki": 512 << 10, "1G": 1 << 30,
		"1000": 1000, "12B": 12, "1000000": 1000000,
	} {
		if n, err := Parse(s); err != nil || n != want {
			t.Errorf("Parse(%q) = %d, %v, want %d", s, n, err, want)
		}
	}
	for _, s := range []string{"", "MiB", "8MB", "-1", "-1MiB", "8 MiB", "9999999999999G", "9999999999G"} {
		if _, err := Parse(s); err == nil {
			t.Errorf("Parse(%q) took it", s)
		}
	}
}

func TestFormat(t *testing.T) {
	for n, want := range map[int64]string{
		0: "0", 1000: "1000", 1024: "1KiB", 10 << 20: "10MiB", 1536 << 10: "1536KiB", 3 << 30: "3GiB", 1<<20 + 1: "1048577",
	} {
		if got := Format(n); got != want {
			t.Errorf("Format(%d) = %q, want %q", n, got, want)
		}
		if back, err := Parse(Format(n)); err != nil || back != n {
			t.Errorf("Parse(Format(%d)) = %d, %v", n, back, err)
		}
	}
}
