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
