package daemon

import (
	"context"
	"runtime"
	"sync"
	"time"

	"github.com/corral-sandbox/corral/sandbox"
)

// Large outputs and the daemon's memory. A command's captured output lives
// in the Go heap until its response is written. Once the floods are over,
// the heap is mostly garbage, but the runtime collects only when the heap
// grows again (or every two minutes), and returns pages to the system only
// after a collection: the daemon would stay at its high-water mark. The
// reclaimer therefore asks for a collection when the last large
// reservation is given back and the captured bytes in flight are small
// again; the runtime's background scavenger then returns the freed pages.
// A collection with little live memory is cheap and concurrent (unlike
// debug.FreeOSMemory, which also scavenges everything synchronously), and
// it runs at most once per reclaimDelay.

// largeReservation is the reservation from which a release schedules a
// collection.
const largeReservation = 16 << 20

// reclaimDelay is how long after the last large release the collection
// runs.
const reclaimDelay = time.Second

// reclaimer is the daemon's Admitter: a sandbox.Limiter that schedules a
// collection once large reservations are gone.
type reclaimer struct {
	*sandbox.Limiter

	mu    sync.Mutex
	timer *time.Timer
}

func (r *reclaimer) Admit(ctx context.Context, a sandbox.Admission) (func(), error) {
	release, err := r.Limiter.Admit(ctx, a)
	if err != nil || a.Bytes < largeReservation {
		return release, err
	}
	return func() {
		release()
		r.schedule()
	}, nil
}

func (r *reclaimer) schedule() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.timer == nil {
		r.timer = time.AfterFunc(reclaimDelay, r.collect)
		return
	}
	r.timer.Reset(reclaimDelay)
}

func (r *reclaimer) collect() {
	if g, _ := r.Usage(0); g.CapturedBytes < largeReservation {
		// Twice: the scavenger's goal follows the heap in use at the end
		// of the previous cycle, which saw the outputs live; only after
		// the second does it return the pages.
		runtime.GC()
		runtime.GC()
	}
}

// stop cancels a pending collection.
func (r *reclaimer) stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.timer != nil {
		r.timer.Stop()
	}
}
