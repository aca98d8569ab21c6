package daemon

import (
	"net/http"
	"sync"

	"github.com/corral-sandbox/corral/store"
)

// inflight bounds one kind of work in flight at once: per account that is
// not an admin, and for the whole daemon. Over either bound, start
// answers 429 "busy" (retry later), never queues.
type inflight struct {
	what    string // what is counted, in messages ("git imports")
	account int    // the most per account that is not an admin
	daemon  int    // the most for the whole daemon

	mu  sync.Mutex
	n   int           // in flight
	per map[int64]int // in flight, by account
}

// start reserves one for acct (admin: not bounded per account), or answers
// 429; the returned function gives it back (idempotent).
func (f *inflight) start(acct store.Account, admin bool) (func(), error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n >= f.daemon {
		return nil, apiErr(http.StatusTooManyRequests, KindBusy, "the daemon has %d %s in flight, the most at once; retry later", f.n, f.what)
	}
	if n := f.per[acct.ID]; n >= f.account && !admin {
		return nil, apiErr(http.StatusTooManyRequests, KindBusy, "account %s has %d %s in flight, the most at once; retry later", acct.Name, n, f.what)
	}
	if f.per == nil {
		f.per = make(map[int64]int)
	}
	f.per[acct.ID]++
	f.n++
	var once sync.Once
	return func() {
		once.Do(func() {
			f.mu.Lock()
			defer f.mu.Unlock()
			if f.per[acct.ID]--; f.per[acct.ID] == 0 {
				delete(f.per, acct.ID)
			}
			f.n--
		})
	}, nil
}

// of returns how many acct has in flight.
func (f *inflight) of(acct int64) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.per[acct]
}
