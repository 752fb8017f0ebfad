// Package bytesize reads memory sizes as wirecache's max_memory takes them, for the plugin and for the
// Corefile checks that must read them alike.
package bytesize

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// units are the suffixes a size takes, in Kubernetes' spelling and with a B; all are powers of 1024.
var units = []struct {
	suffixes []string
	shift    uint
}{
	{[]string{"GiB", "Gi", "G"}, 30},
	{[]string{"MiB", "Mi", "M"}, 20},
	{[]string{"KiB", "Ki", "K"}, 10},
	{[]string{"B", ""}, 0},
}

// Parse reads a size such as 8MiB, 512Ki or 65536: bytes, or a number with KiB, MiB or GiB (also spelled
// Ki or K, ...).
func Parse(s string) (int64, error) {
	for _, u := range units {
		for _, suffix := range u.suffixes {
			digits, ok := strings.CutSuffix(s, suffix)
			if !ok || digits == "" {
				continue
			}
			n, err := strconv.ParseInt(digits, 10, 64)
			if err != nil || n < 0 || n > math.MaxInt64>>u.shift {
				return 0, fmt.Errorf("%q is not a size (bytes, or a number with KiB, MiB or GiB)", s)
			}
			return n << u.shift, nil
		}
	}
	return 0, fmt.Errorf("%q is not a size (bytes, or a number with KiB, MiB or GiB)", s)
}

// Format writes n in the largest unit that divides it (8MiB, 640KiB, 1000), as Parse reads it back.
func Format(n int64) string {
	for _, u := range units[:len(units)-1] {
		if n != 0 && n%(1<<u.shift) == 0 {
			return strconv.FormatInt(n>>u.shift, 10) + u.suffixes[0]
		}
	}
	return strconv.FormatInt(n, 10)
}
