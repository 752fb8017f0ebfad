// Package stats holds the summaries the benchmarks report over their rounds and repetitions.
package stats

import "slices"

// Number is what Median summarises: measured figures (time.Duration among them) and ratios.
type Number interface {
	~int64 | ~float64
}

// Median is the middle value of v, or the mean of the two middle values when v has an even number of them
// (as bench/simnode.sh's awk median does), and 0 for none. v is not changed.
func Median[T Number](v []T) T {
	if len(v) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(v))
	mid := len(s) / 2
	if len(s)%2 == 1 {
		return s[mid]
	}
	return s[mid-1] + (s[mid]-s[mid-1])/2
}
