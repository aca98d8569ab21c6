// Package suites holds corral's cross-cutting test suites: load and leak,
// fault, and hostile input. They run real daemons, real workers and real
// processes. Bounded versions run with `go test ./...`; the full versions
// run with -corral.full (see .ci/run and README).
package suites
