// Package runner implements corral's delegated runner: a short-lived child
// process (`corral runner`) that runs one job — a list of bounded commands
// in one project, on behalf of one actor — and reports one JSON line per
// command.
//
// # What a runner receives
//
// A runner receives only the machine gateway. Its parent hands it exactly
// one inherited descriptor, fd 3 (announced with --worker-fd 3): its own
// protocol-2 connection to the privileged worker, which the parent dialled
// and then closed on its side.
// The runner wraps it in a [machine.ConnTransport], which cannot reconnect:
// the runner has no worker socket path and no other way to reach the
// worker. It builds its core with core.Options.Migrate false, so it never
// migrates (a database of another schema version is refused), runs no
// plugin services (core.Core.Services is nil) and loads only the sandbox
// plugin: the Sites control, and every other domain, is absent.
//
// # Protocol
//
// The parent writes the job as one JSON document ([Job]) on the runner's
// stdin and keeps stdin open. The runner runs the commands in order
// through core's sandbox control (RunCommand, lease kind "runner") and
// writes one line per command on stdout: the pinned result
// {"stdout":S,"stderr":S,"code":N|null,"signal":S|null} or error
// {"error":{"kind":K,"message":S,"stdout":S,"stderr":S}} shape ([Result]).
// It exits 0 when every command was reported.
//
// # Parent death
//
// Stdin reaching EOF means the parent is gone; so does SIGTERM, which
// [Start] arranges as the runner's parent-death signal (Pdeathsig). The
// runner then cancels the running command, reports nothing more and exits
// with [ExitAbandoned]. A runner that dies without cleaning up (SIGKILL)
// closes its worker connection, which makes the worker cancel that
// connection's sessions; its leases stop being heartbeated and any
// process's lease reconciler expires them after their TTL.
//
// [Start] is the parent's side: it dials the worker (or takes a dialled
// connection), starts `corral runner`, writes the job and reads the
// results.
package runner
