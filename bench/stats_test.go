package main

import (
	"context"
	"errors"
	"math"
	"slices"
	"sync/atomic"
	"testing"
	"time"
)

func TestSummarizeNearestRank(t *testing.T) {
	var s []time.Duration
	for i := 100; i >= 1; i-- { // unsorted on purpose
		s = append(s, time.Duration(i)*time.Millisecond)
	}
	st := summarize(s)
	if st.n != 100 || st.p50 != 50*time.Millisecond || st.p99 != 99*time.Millisecond {
		t.Fatalf("summarize = %+v, want n 100, p50 50ms, p99 99ms", st)
	}
	if st.mean != 50500*time.Microsecond {
		t.Fatalf("mean = %v, want 50.5ms", st.mean)
	}
	if s[0] != 100*time.Millisecond {
		t.Fatal("summarize sorted its argument")
	}
	if one := summarize([]time.Duration{7}); one.p50 != 7 || one.p99 != 7 {
		t.Fatalf("one sample: %+v", one)
	}
	if (summarize(nil) != stats{}) {
		t.Fatal("no samples: want zero stats")
	}
}

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{{nil, 0}, {[]float64{3}, 3}, {[]float64{4, 1, 3}, 3}, {[]float64{4, 1, 3, 2}, 2.5}} {
		if got := median(c.in); got != c.want {
			t.Errorf("median(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

func TestGoalAndRatio(t *testing.T) {
	atMost, atLeast := goal{true, 1.15}, goal{false, 0.85}
	for _, c := range []struct {
		g    goal
		x    float64
		want bool
	}{
		{atMost, 1.15, true}, {atMost, 1.16, false}, {atMost, 0.5, true},
		{atLeast, 0.85, true}, {atLeast, 0.84, false}, {atLeast, 2, true},
		// A ratio that could not be formed never meets a goal, whichever
		// way it points.
		{atMost, math.NaN(), false}, {atLeast, math.NaN(), false},
		{atMost, math.Inf(1), false}, {atLeast, math.Inf(1), false}, {atMost, 0, false},
	} {
		if got := c.g.met(c.x); got != c.want {
			t.Errorf("%v met(%v) = %v, want %v", c.g, c.x, got, c.want)
		}
	}
	if x := ratio(3, 2); x != 1.5 {
		t.Errorf("ratio(3, 2) = %v", x)
	}
	for _, c := range [][2]float64{{0, 1}, {1, 0}, {-1, 1}} {
		if x := ratio(c[0], c[1]); !math.IsNaN(x) {
			t.Errorf("ratio(%v, %v) = %v, want NaN", c[0], c[1], x)
		}
	}
	if atMost.String() != "≤ 1.15×" || atLeast.String() != "≥ 0.85×" {
		t.Errorf("goal strings %q %q", atMost, atLeast)
	}
}

// A target on a skipped or failing row is not met.
func TestLatTarget(t *testing.T) {
	floor := &latRow{name: "floor", st: stats{n: 10, p50: time.Millisecond}}
	good := &latRow{name: "x", st: stats{n: 10, p50: 1100 * time.Microsecond}}
	if tg := latTarget("x", good, floor, "floor", goal{true, 1.15}); tg.verdict != "met" {
		t.Errorf("1.10× against ≤ 1.15×: %+v", tg)
	}
	failing := *good
	failing.failures = 1
	if tg := latTarget("x", &failing, floor, "floor", goal{true, 1.15}); tg.verdict != "missed" {
		t.Errorf("with a failure: %+v", tg)
	}
	if tg := latTarget("x", &latRow{skip: "no worker"}, floor, "floor", goal{true, 1.15}); tg.verdict != "skipped" {
		t.Errorf("skipped row: %+v", tg)
	}
	if tg := latTarget("x", good, nil, "floor", goal{true, 1.15}); tg.verdict != "skipped" {
		t.Errorf("no floor: %+v", tg)
	}
}

func TestParseAgentRequest(t *testing.T) {
	cwd, argv, env := parseAgentRequest([]byte("/w\x00sh\x00-c\x00\x00PATH=/bin\x00A=b=c\x00"))
	if cwd != "/w" || !slices.Equal(argv, []string{"sh", "-c"}) || !slices.Equal(env, []string{"PATH=/bin", "A=b=c"}) {
		t.Fatalf("got %q %q %q", cwd, argv, env)
	}
	// An empty argument ends argv: the wire format cannot carry one.
	if _, argv, _ := parseAgentRequest([]byte("/\x00true\x00\x00")); !slices.Equal(argv, []string{"true"}) {
		t.Fatalf("argv %q", argv)
	}
}

func TestRegisterPhase(t *testing.T) {
	saved := extraPhases
	defer func() { extraPhases = saved }()
	registerPhase(extraPhase{name: "a", run: func(context.Context, *phaseEnv) []latRow { return nil }})
	registerPhase(extraPhase{name: "b"})
	if len(extraPhases) != len(saved)+2 || extraPhases[len(saved)].name != "a" {
		t.Fatalf("phases %v", extraPhases)
	}
	if got := extraNames(); got != "a,b" && len(saved) == 0 {
		t.Fatalf("extraNames = %q", got)
	}
}

// measureConcurrency runs every subject, counts a failing subject's calls
// as failures (not as completed commands), and leaves skipped ones alone.
func TestMeasureConcurrencyCounts(t *testing.T) {
	var okCalls, badCalls atomic.Int64
	subjects := []concSubject{
		{name: "ok", run: func() error { okCalls.Add(1); time.Sleep(time.Millisecond); return nil }},
		{name: "bad", run: func() error { badCalls.Add(1); time.Sleep(time.Millisecond); return errors.New("boom") }},
		{name: "skipped", run: func() error { t.Error("skipped subject ran"); return nil }, skip: "no"},
	}
	rows := measureConcurrency(subjects, 4, 120*time.Millisecond, nil)
	if len(rows) != 3 || rows[0].subject != "ok" || rows[0].level != 4 {
		t.Fatalf("rows %+v", rows)
	}
	if int64(rows[0].done) != okCalls.Load() || rows[0].failures != 0 {
		t.Errorf("ok: done %d of %d calls, %d failures", rows[0].done, okCalls.Load(), rows[0].failures)
	}
	if rows[1].done != 0 || int64(rows[1].failures) != badCalls.Load() || rows[1].firstErr == nil {
		t.Errorf("bad: done %d, failures %d of %d calls, first %v", rows[1].done, rows[1].failures, badCalls.Load(), rows[1].firstErr)
	}
	if rows[2].skip != "no" || rows[2].done != 0 {
		t.Errorf("skipped: %+v", rows[2])
	}
	if okCalls.Load()+badCalls.Load() == 0 {
		t.Error("nothing ran")
	}
}
