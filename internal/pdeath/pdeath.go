// Package pdeath starts child processes whose parent-death signal
// (SysProcAttr.Pdeathsig) means what it says: "when this process dies".
//
// Linux delivers the parent-death signal when the *thread* that forked the
// child exits, not the process. Go runs goroutines on threads it may
// retire: a goroutine that exits while locked to its thread
// (runtime.LockOSThread without UnlockOSThread) takes the thread with it,
// and corral does that on purpose in several places (threads with
// restricted credentials, namespaces or capability bounding sets that must
// never run other goroutines). A child whose fork happened to run on such a
// thread earlier would get its "parent died" signal while its parent is
// alive: a daemon's supervised worker, a runner or a host command killed at
// random.
//
// Start forks every such child from one thread that is locked for the
// process's whole life and so never exits.
package pdeath

import (
	"os/exec"
	"runtime"
	"sync"
)

type request struct {
	cmd  *exec.Cmd
	done chan error
}

var (
	once     sync.Once
	requests chan request
)

func spawner() {
	runtime.LockOSThread() // never unlocked: this thread lives as long as the process
	for r := range requests {
		r.done <- r.cmd.Start()
	}
}

// Start is cmd.Start run on the package's permanent thread, so that the
// parent-death signal of cmd (if it sets one) is sent only when this
// process exits. It blocks until the child is started (or failed to), like
// cmd.Start; concurrent calls are served one at a time.
func Start(cmd *exec.Cmd) error {
	once.Do(func() {
		requests = make(chan request)
		go spawner()
	})
	done := make(chan error, 1)
	requests <- request{cmd: cmd, done: done}
	return <-done
}
