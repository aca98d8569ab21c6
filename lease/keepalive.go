package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/store"
)

var _ sandbox.KeepAliver = (*Lease)(nil)

// keepAlive heartbeats every kept-alive lease of a Manager from one loop,
// in batches: no goroutine, timer or transaction per lease.
type keepAlive struct {
	mu      sync.Mutex
	entries map[*Lease]*keepEntry
	running bool
	wake    chan struct{}
}

type keepEntry struct {
	interval time.Duration
	next     time.Time

	mu      sync.Mutex // held while failed runs, and by stop
	failed  func(error)
	stopped bool
}

// keepTick is how often the keep-alive loop looks for due leases when
// every interval is the usual 5 s: a heartbeat is late by at most this
// much. Shorter intervals make the loop look more often (a quarter of the
// shortest interval, at least every 5 ms).
const keepTick = 250 * time.Millisecond

// KeepAlive heartbeats l every interval until stop is called, from the
// manager's single keep-alive loop, which writes every due lease of the
// manager in one transaction. If a heartbeat fails (the lease expired or
// was released, or the store failed), failed is called once, from the
// loop, and the lease is no longer kept alive; failed must not block or
// call stop. stop blocks until failed is no longer running and will not be
// called; it is idempotent.
func (l *Lease) KeepAlive(interval time.Duration, failed func(error)) (stop func()) {
	if interval <= 0 {
		interval = sandbox.DefaultHeartbeatInterval
	}
	m := l.m
	e := &keepEntry{interval: interval, next: time.Now().Add(interval), failed: failed}
	m.ka.mu.Lock()
	if m.ka.entries == nil {
		m.ka.entries = make(map[*Lease]*keepEntry)
		m.ka.wake = make(chan struct{}, 1)
	}
	m.ka.entries[l] = e
	if !m.ka.running {
		m.ka.running = true
		go m.keepAliveLoop(min(keepTick, max(interval/4, 5*time.Millisecond)))
	}
	m.ka.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			m.ka.mu.Lock()
			if m.ka.entries[l] == e {
				delete(m.ka.entries, l)
			}
			m.ka.mu.Unlock()
			e.mu.Lock()
			e.stopped = true
			e.mu.Unlock()
		})
	}
}

// keepAliveLoop runs while any lease is kept alive.
func (m *Manager) keepAliveLoop(tick time.Duration) {
	for {
		time.Sleep(tick)
		now := time.Now()
		m.ka.mu.Lock()
		if len(m.ka.entries) == 0 {
			m.ka.running = false
			m.ka.mu.Unlock()
			return
		}
		var due []*Lease
		var entries []*keepEntry
		tick = keepTick
		for l, e := range m.ka.entries {
			tick = min(tick, max(e.interval/4, 5*time.Millisecond))
			if !e.next.After(now) {
				e.next = now.Add(e.interval)
				due = append(due, l)
				entries = append(entries, e)
			}
		}
		m.ka.mu.Unlock()
		for i := 0; i < len(due); i += m.maxBatch {
			j := min(i+m.maxBatch, len(due))
			m.keepBatch(due[i:j], entries[i:j])
		}
	}
}

// keepBatch heartbeats one batch and reports each failure to its holder.
func (m *Manager) keepBatch(leases []*Lease, entries []*keepEntry) {
	ids := make([]string, len(leases))
	for i, l := range leases {
		ids[i] = l.row.ID
	}
	ctx, cancel := context.WithTimeout(context.Background(), flushTimeout)
	defer cancel()
	at := m.now()
	errs, err := m.st.HeartbeatLeases(ctx, ids, at)
	swept := false // one sweep records every expiry of the batch
	for i, l := range leases {
		e := err
		if e == nil {
			e = errs[i]
		}
		if e == nil {
			l.extend(at.Add(l.row.TTL))
			continue
		}
		switch {
		case errors.Is(e, store.ErrLeaseExpired), errors.Is(e, store.ErrNotFound):
			if !swept {
				swept = true
				if _, err := m.Sweep(ctx); err != nil {
					m.log.Warn("lease sweep failed", "lease", l.row.ID, "err", err)
				}
			}
			l.expired()
			e = fmt.Errorf("lease %s: heartbeat: %w (%w)", l.row.ID, ErrExpired, e)
		case errors.Is(e, store.ErrLeaseReleased):
			l.released()
			e = fmt.Errorf("lease %s: heartbeat: %w", l.row.ID, ErrReleased)
		default:
			e = fmt.Errorf("lease %s: heartbeat: %w", l.row.ID, e)
		}
		m.ka.mu.Lock()
		if m.ka.entries[l] == entries[i] {
			delete(m.ka.entries, l)
		}
		m.ka.mu.Unlock()
		entries[i].mu.Lock()
		if !entries[i].stopped && entries[i].failed != nil {
			entries[i].failed(e)
		}
		entries[i].mu.Unlock()
	}
}

// keepAliveCount reports how many leases are kept alive (tests).
func (m *Manager) keepAliveCount() int {
	m.ka.mu.Lock()
	defer m.ka.mu.Unlock()
	return len(m.ka.entries)
}
