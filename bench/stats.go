package main

import (
	"slices"
	"time"
)

// stats summarizes latency samples.
type stats struct {
	n              int
	p50, p99, mean time.Duration
}

// summarize returns nearest-rank percentiles and the mean of samples.
func summarize(samples []time.Duration) stats {
	if len(samples) == 0 {
		return stats{}
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	return stats{
		n:    len(s),
		p50:  s[rank(len(s), 50)],
		p99:  s[rank(len(s), 99)],
		mean: sum / time.Duration(len(s)),
	}
}

// rank is the index of the p-th percentile by the nearest-rank method.
func rank(n, p int) int {
	r := (n*p + 99) / 100 // ceil(n*p/100)
	return max(0, min(n-1, r-1))
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
