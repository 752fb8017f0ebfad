package stats

import (
	"testing"
	"time"
)

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []float64
		want float64
	}{
		{"none", nil, 0},
		{"one", []float64{0.9}, 0.9},
		{"odd count, unsorted", []float64{1.05, 0.82, 0.9}, 0.9},
		// Two rounds of each order in a hostile benchmark of 4: the upper one alone said 1.05.
		{"even count is the mean of the middle two", []float64{1.05, 0.818}, 0.934},
		{"four", []float64{4, 1, 3, 2}, 2.5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := append([]float64(nil), tc.in...)
			if got := Median(in); got < tc.want-1e-9 || got > tc.want+1e-9 {
				t.Errorf("Median(%v) = %v, want %v", tc.in, got, tc.want)
			}
			for i := range in {
				if in[i] != tc.in[i] {
					t.Fatalf("Median reordered its argument: %v, was %v", in, tc.in)
				}
			}
		})
	}
	if got, want := Median([]time.Duration{3 * time.Millisecond, time.Millisecond}), 2*time.Millisecond; got != want {
		t.Errorf("Median of two durations = %v, want %v", got, want)
	}
}

func TestInterval(t *testing.T) {
	median := func(g [][]float64) float64 { return Median(g[0]) }
	// One group whose values are all equal: no spread to resample.
	if lo, hi := Interval([][]float64{{0.9, 0.9, 0.9}}, median, 0.9, 200); lo != 0.9 || hi != 0.9 {
		t.Errorf("interval of a constant sample [%v, %v], want [0.9, 0.9]", lo, hi)
	}
	// A spread sample: the interval holds its median, within the sample's range, and narrows as the
	// sample grows with the same spread.
	small := []float64{0.80, 0.85, 0.90, 0.95, 1.00}
	var large []float64
	for range 10 {
		large = append(large, small...)
	}
	lo, hi := Interval([][]float64{small}, median, 0.9, 2000)
	if lo > 0.9 || hi < 0.9 || lo < 0.8 || hi > 1.0 || lo == hi {
		t.Errorf("interval of %v: [%v, %v]", small, lo, hi)
	}
	llo, lhi := Interval([][]float64{large}, median, 0.9, 2000)
	if lhi-llo >= hi-lo {
		t.Errorf("interval of 50 samples [%v, %v] not narrower than of 5 [%v, %v]", llo, lhi, lo, hi)
	}
	// The same samples give the same interval.
	if lo2, hi2 := Interval([][]float64{small}, median, 0.9, 2000); lo2 != lo || hi2 != hi {
		t.Errorf("a second interval of the same samples [%v, %v], first [%v, %v]", lo2, hi2, lo, hi)
	}
}
