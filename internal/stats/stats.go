// Package stats holds the summaries the benchmarks report over their rounds and repetitions.
package stats

import (
	"math/rand/v2"
	"slices"
)

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

// Interval is a bootstrap percentile interval of statistic over groups of samples: statistic is computed on
// resamples drawn with replacement within each group (each the size of its group), and Interval returns the
// quantiles (1-level)/2 and (1+level)/2 of those values. The resamples come from a fixed seed, so the same
// samples give the same interval. It says how far a figure summarising a few noisy rounds may be from the one
// many more rounds would give; with fewer than two samples in every group it is the statistic itself.
func Interval(groups [][]float64, statistic func(groups [][]float64) float64, level float64, resamples int) (lo, hi float64) {
	rng := rand.New(rand.NewPCG(1, 2))
	values := make([]float64, resamples)
	drawn := make([][]float64, len(groups))
	for i, g := range groups {
		drawn[i] = make([]float64, len(g))
	}
	for r := range values {
		for i, g := range groups {
			for j := range drawn[i] {
				drawn[i][j] = g[rng.IntN(len(g))]
			}
		}
		values[r] = statistic(drawn)
	}
	slices.Sort(values)
	at := func(q float64) float64 {
		return values[min(len(values)-1, max(0, int(q*float64(len(values)))))]
	}
	return at((1 - level) / 2), at((1 + level) / 2)
}
