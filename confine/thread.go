package confine

import (
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// A prepared thread is a goroutine locked for its whole life to an OS
// thread whose state was set up once for one kind of start (its key): the
// capability sets emptied, a network namespace entered, a Landlock domain
// enforced. Setting that state up costs more than the start itself (the
// bounding set alone takes one prctl, each committing new credentials, per
// capability), and a thread so changed can never run anything else, so it
// was discarded after one start; a prepared thread instead serves the
// next start of its kind, and ends (the runtime discards it) once it has
// waited threadIdle for one. Children forked from it must not have a
// parent-death signal: the kernel sends it when the thread ends.
//
// At most maxPrepared threads are kept. A start whose kind has no idle
// thread (its thread is busy, or there are too many kinds) runs on a new
// thread prepared for it, which is kept only if its kind has none.
const (
	threadIdle  = 50 * time.Millisecond
	maxPrepared = 16
)

type preparedThread struct {
	reqs chan func() bool
}

var prepared struct {
	sync.Mutex
	m map[string]*preparedThread
}

// onPrepared runs fn on a locked OS thread that prepare set up for key,
// and returns once fn has returned; prepare's error, if any, is returned
// and fn is not run. fn reports whether it left the thread as prepare
// did: if not, the thread ends after it.
func onPrepared(key string, prepare func() error, fn func() (keep bool)) error {
	prepared.Lock()
	t := prepared.m[key]
	prepared.Unlock()
	if t != nil {
		done := make(chan struct{})
		req := func() bool {
			defer close(done)
			return fn()
		}
		select {
		case t.reqs <- req: // only if t waits for work
			<-done
			return nil
		default:
		}
	}
	errc := make(chan error, 1)
	go runPrepared(key, prepare, fn, errc)
	return <-errc
}

func runPrepared(key string, prepare func() error, fn func() bool, errc chan<- error) {
	// Never unlocked: when this goroutine returns, the runtime ends the
	// thread and the state prepare gave it. (Threads the runtime needs
	// meanwhile are not cloned from a locked thread but from its template
	// thread, so none of that state spreads to anything but what this
	// thread forks. Should this goroutine run on the main thread, the
	// runtime parks that thread for good instead of ending it: it runs
	// nothing else either.)
	runtime.LockOSThread()
	if err := prepare(); err != nil {
		errc <- err
		return
	}
	keep := fn()
	errc <- nil
	if !keep {
		return
	}
	t := &preparedThread{reqs: make(chan func() bool)}
	prepared.Lock()
	if prepared.m == nil {
		prepared.m = make(map[string]*preparedThread)
	}
	if prepared.m[key] != nil || len(prepared.m) >= maxPrepared {
		prepared.Unlock()
		return
	}
	prepared.m[key] = t
	prepared.Unlock()
	t.serve(key)
}

func (t *preparedThread) serve(key string) {
	idle := time.NewTimer(threadIdle)
	defer idle.Stop()
	for {
		select {
		case fn := <-t.reqs:
			if !fn() {
				t.forget(key)
				return
			}
			idle.Reset(threadIdle)
		case <-idle.C:
			t.forget(key)
			return
		}
	}
}

// forget removes t from the kept threads: no start reaches it afterwards
// (a start sends to it only while it waits for work).
func (t *preparedThread) forget(key string) {
	prepared.Lock()
	if prepared.m[key] == t {
		delete(prepared.m, key)
	}
	prepared.Unlock()
}

// threadKey returns the key of the thread state that policy p needs for a
// User's command (the capability sets, p's network namespace, p's Landlock
// ruleset), or of the thread of a tree's init (init names the init's
// program). A ruleset's rules hold the inodes their paths resolved to when
// it was built, so the key names each path with the inode it resolves to
// now: a root replaced since (renamed, or a symlink above it changed) is
// another key, and its commands get a ruleset built for what the path now
// is, exactly as if none were kept. (An inode a kept ruleset names cannot
// be reused meanwhile: the ruleset holds a reference to it.)
func threadKey(kind string, p Policy) (string, error) {
	b := make([]byte, 0, 512)
	b = append(b, kind...)
	add := func(tag byte, paths []string, mustExist bool) error {
		for _, path := range paths {
			b = append(b, 0, tag)
			b = append(b, path...)
			var st unix.Stat_t
			if err := unix.Stat(path, &st); err != nil {
				if mustExist {
					return fmt.Errorf("confine: %s: %w", path, err)
				}
				b = append(b, 0, '-')
				continue
			}
			b = append(b, 0)
			b = strconv.AppendUint(b, st.Dev, 16)
			b = append(b, ':')
			b = strconv.AppendUint(b, st.Ino, 16)
		}
		return nil
	}
	if err := add('s', SystemDirs, false); err != nil {
		return "", err
	}
	if err := add('d', devices, false); err != nil {
		return "", err
	}
	if err := add('w', p.Writable, true); err != nil {
		return "", err
	}
	if err := add('r', p.Readable, true); err != nil {
		return "", err
	}
	if p.Network {
		b = append(b, 0, 'n')
		if target, err := resolvConfTarget(); err == nil {
			_ = add('c', []string{target}, false)
		}
	}
	if p.Init != "" {
		if err := add('i', []string{p.Init}, true); err != nil {
			return "", err
		}
	}
	return string(b), nil
}
