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
