// Package api holds the types of corral's HTTP API (docs/openapi.json):
// its resources, the bodies of its requests, the events of its streamed
// answers and WebSocket sessions, and its error kinds, each with the JSON
// the daemon writes and its clients read. The daemon (package daemon), the
// Go client (package client) and the CLI import it, so that a field is
// declared once; a test of the daemon checks it against the OpenAPI
// document in both directions (every schema and property of the document
// has its type and field here, and every type and field here is in the
// document).
//
// The package imports only the standard library and builds on every GOOS.
// The sandbox seam shares the shapes of a command with it (Command,
// OutputLimit, LeaseKind, TTYSize, Exit, ErrorKind and ErrorBody are
// declared here; the sandbox package names them by alias), since the
// pinned command contract is the same on the wire and in `corral run`.
package api
