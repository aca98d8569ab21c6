package main

import (
	"context"
	"strings"
)

// extraPhase is a phase that a file of its own adds to the run, after the
// built-in ones, in registration order. A file registers it from init:
//
//	func init() {
//		registerPhase(extraPhase{name: "files", title: "Files API", run: measureFiles})
//	}
//
// Its rows are printed in a section of their own (a latency table: p50,
// p99, mean, n, ×bare), count toward the exit status when they record
// failures, and are selected with -only NAME.
type extraPhase struct {
	name  string // the -only name, and the profile's file name
	title string // the section's heading
	// intro is printed under the heading: how the rows are measured.
	intro string
	run   func(ctx context.Context, env *phaseEnv) []latRow
}

// phaseEnv is what the run built that an extra phase may use. Fields are
// nil (and their skip set) when this host cannot provide them.
type phaseEnv struct {
	cfg config
	// cr is the core with its projects; cr.managed is the warm managed
	// project when workerSkip is empty.
	cr         *corral
	workerSkip string
	// dmn is the daemon's HTTP app on a Unix socket, with a client as
	// alice (cr.alice).
	dmn *daemonProc
	// bare is the floor every ratio is taken against, when the latency
	// phase ran.
	bare *latRow
}

// extraResult is one extra phase's outcome.
type extraResult struct {
	phase extraPhase
	rows  []latRow
}

var extraPhases []extraPhase

// registerPhase adds p to the run; call it from an init function.
func registerPhase(p extraPhase) { extraPhases = append(extraPhases, p) }

// extraNames lists the registered phases' names for -only's usage.
func extraNames() string {
	var names []string
	for _, p := range extraPhases {
		names = append(names, p.name)
	}
	if len(names) == 0 {
		return "none registered"
	}
	return strings.Join(names, ",")
}
