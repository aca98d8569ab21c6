// Package layout is the guest layout of a machine: where its sessions find
// the project's workspace and the per-project home. It is one fact, shared
// by the worker that mounts them, the gateway and provider that name them
// in requests, and the consumers that show a project's paths (a host
// project's root is shown as the workspace too).
package layout

const (
	// Workspace is where a project's workspace is mounted inside its
	// machine, and what a host project's root is shown as.
	Workspace = "/workspace"
	// Home is the per-project home directory inside a machine.
	Home = "/home/corral"
)
