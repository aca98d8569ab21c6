package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
)

// LeaseState is where a lease is in its life: live, then exactly one of
// released or expired, for good.
type LeaseState string

const (
	LeaseLive     LeaseState = "live"
	LeaseReleased LeaseState = "released"
	LeaseExpired  LeaseState = "expired"
)

// Lease is a lease's row. The lease methods take the caller's current time
// (at) instead of consulting the store's clock, so that one clock, the
// lease manager's, decides expiry.
//
// A live lease is overdue when ExpiresAt is before the current time: it can
// no longer be heartbeated or released, and the next ExpireLeases marks it
// expired.
type Lease struct {
	ID          string
	Account     int64 // the actor's AccountUserID
	Project     int64
	Kind        string // the lease kind (sandbox.LeaseKind)
	Domain      string // the plugin domain it was acquired under
	Holder      string // free text naming the holding process
	State       LeaseState
	Created     time.Time
	HeartbeatAt time.Time
	ExpiresAt   time.Time
	ReleasedAt  time.Time // zero unless released
	ExpiredAt   time.Time // zero unless expired
}

// NewLease describes a lease to create.
type NewLease struct {
	// ID is the lease's ID. If empty, a random UUID.
	ID      string
	Account int64
	Project int64
	Kind    string // required
	Domain  string
	Holder  string
	// TTL is how long the lease lives without a heartbeat. Required.
	TTL time.Duration
}

const leaseCols = "id, account, project, kind, domain, holder, state, created_at, heartbeat_at, expires_at, released_at, expired_at"

func scanLease(r scanner, what string) (Lease, error) {
	var (
		l                           Lease
		state                       string
		created, heartbeat, expires int64
		releasedAt, expiredAt       sql.NullInt64
	)
	if err := r.Scan(&l.ID, &l.Account, &l.Project, &l.Kind, &l.Domain, &l.Holder, &state,
		&created, &heartbeat, &expires, &releasedAt, &expiredAt); err != nil {
		return Lease{}, classify(err, what)
	}
	l.State = LeaseState(state)
	l.Created, l.HeartbeatAt, l.ExpiresAt = fromMS(created), fromMS(heartbeat), fromMS(expires)
	l.ReleasedAt, l.ExpiredAt = fromNullMS(releasedAt), fromNullMS(expiredAt)
	return l, nil
}

// CreateLease inserts a live lease that expires at at+TTL. An unknown
// project is ErrNotFound; a duplicate ID is ErrExists.
func (s *Store) CreateLease(ctx context.Context, n NewLease, at time.Time) (Lease, error) {
	if n.Kind == "" {
		return Lease{}, errors.New("store: create lease: kind is required")
	}
	if n.TTL <= 0 {
		return Lease{}, fmt.Errorf("store: create lease: invalid TTL %v", n.TTL)
	}
	if n.ID == "" {
		n.ID = uuid.NewString()
	}
	now := ms(at)
	l := Lease{
		ID: n.ID, Account: n.Account, Project: n.Project, Kind: n.Kind, Domain: n.Domain, Holder: n.Holder,
		State: LeaseLive, Created: fromMS(now), HeartbeatAt: fromMS(now), ExpiresAt: fromMS(now + n.TTL.Milliseconds()),
	}
	_, err := s.w.ExecContext(ctx, `
		INSERT INTO leases (id, account, project, kind, domain, holder, state, created_at, heartbeat_at, expires_at)
		VALUES (?, ?, ?, ?, ?, ?, 'live', ?, ?, ?)`,
		l.ID, l.Account, l.Project, l.Kind, l.Domain, l.Holder, now, now, ms(l.ExpiresAt))
	if err != nil {
		return Lease{}, classify(err, fmt.Sprintf("create lease for project %d", n.Project))
	}
	return l, nil
}

// GetLease returns the lease with the given ID, or ErrNotFound.
func (s *Store) GetLease(ctx context.Context, id string) (Lease, error) {
	return scanLease(s.r.QueryRowContext(ctx, "SELECT "+leaseCols+" FROM leases WHERE id = ?", id),
		"lease "+id)
}

// LeaseFilter selects leases for ListLeases; zero fields match everything.
type LeaseFilter struct {
	Project int64
	Account int64
	State   LeaseState
	Holder  string
}

// ListLeases returns the leases matching f, oldest first.
func (s *Store) ListLeases(ctx context.Context, f LeaseFilter) ([]Lease, error) {
	var (
		where []string
		args  []any
	)
	if f.Project != 0 {
		where, args = append(where, "project = ?"), append(args, f.Project)
	}
	if f.Account != 0 {
		where, args = append(where, "account = ?"), append(args, f.Account)
	}
	if f.State != "" {
		where, args = append(where, "state = ?"), append(args, string(f.State))
	}
	if f.Holder != "" {
		where, args = append(where, "holder = ?"), append(args, f.Holder)
	}
	q := "SELECT " + leaseCols + " FROM leases"
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	return s.queryLeases(ctx, s.r, q+" ORDER BY created_at, id", args...)
}

type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

func (s *Store) queryLeases(ctx context.Context, q querier, query string, args ...any) ([]Lease, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("store: leases: %w", err)
	}
	defer rows.Close()
	var out []Lease
	for rows.Next() {
		l, err := scanLease(rows, "leases")
		if err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: leases: %w", err)
	}
	return out, nil
}

// LeasesByID returns the leases with the given IDs that exist, keyed by ID.
func (s *Store) LeasesByID(ctx context.Context, ids []string) (map[string]Lease, error) {
	out := make(map[string]Lease, len(ids))
	if len(ids) == 0 {
		return out, nil
	}
	list, err := s.queryLeases(ctx, s.r,
		"SELECT "+leaseCols+" FROM leases WHERE id IN (SELECT value FROM json_each(?))", jsonIDs(ids))
	if err != nil {
		return nil, err
	}
	for _, l := range list {
		out[l.ID] = l
	}
	return out, nil
}

// LiveLeaseCount returns the number of live leases, overdue ones included.
func (s *Store) LiveLeaseCount(ctx context.Context) (int, error) {
	var n int
	if err := s.r.QueryRowContext(ctx, "SELECT count(*) FROM leases WHERE state = 'live'").Scan(&n); err != nil {
		return 0, fmt.Errorf("store: count live leases: %w", err)
	}
	return n, nil
}

// HeartbeatLease extends a live lease to expire at at+ttl. It fails with
// ErrLeaseExpired if the lease expired or is overdue, ErrLeaseReleased if it
// was released, ErrNotFound if it does not exist.
func (s *Store) HeartbeatLease(ctx context.Context, id string, at time.Time, ttl time.Duration) error {
	errs, err := s.HeartbeatLeases(ctx, []string{id}, at, ttl)
	if err != nil {
		return err
	}
	return errs[0]
}

// HeartbeatLeases heartbeats many leases in one transaction, which is much
// cheaper per lease than one HeartbeatLease each. errs[i] is the outcome for
// ids[i], as HeartbeatLease would report it; err is a failure of the whole
// batch, in which case no lease was extended.
func (s *Store) HeartbeatLeases(ctx context.Context, ids []string, at time.Time, ttl time.Duration) (errs []error, err error) {
	if ttl <= 0 {
		return nil, fmt.Errorf("store: heartbeat: invalid TTL %v", ttl)
	}
	errs = make([]error, len(ids))
	if len(ids) == 0 {
		return errs, nil
	}
	list := jsonIDs(ids)
	now := ms(at)
	err = s.tx(ctx, func(tx *sql.Tx) error {
		rows, err := tx.QueryContext(ctx, `
			UPDATE leases SET heartbeat_at = ?1, expires_at = ?2
			WHERE id IN (SELECT value FROM json_each(?3)) AND +state = 'live' AND expires_at >= ?1
			RETURNING id`, now, now+ttl.Milliseconds(), list)
		if err != nil {
			return fmt.Errorf("store: heartbeat: %w", err)
		}
		done := make(map[string]bool, len(ids))
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return fmt.Errorf("store: heartbeat: %w", err)
			}
			done[id] = true
		}
		if err := rows.Close(); err != nil {
			return fmt.Errorf("store: heartbeat: %w", err)
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("store: heartbeat: %w", err)
		}
		if len(done) == len(ids) {
			return nil
		}
		// Rare: classify the leases that were not extended.
		var missed []string
		for _, id := range ids {
			if !done[id] {
				missed = append(missed, id)
			}
		}
		found, err := s.queryLeases(ctx, tx,
			"SELECT "+leaseCols+" FROM leases WHERE id IN (SELECT value FROM json_each(?))", jsonIDs(missed))
		if err != nil {
			return err
		}
		byID := make(map[string]Lease, len(found))
		for _, l := range found {
			byID[l.ID] = l
		}
		for i, id := range ids {
			if done[id] {
				continue
			}
			l, ok := byID[id]
			if !ok {
				errs[i] = fmt.Errorf("store: heartbeat lease %s: %w", id, ErrNotFound)
				continue
			}
			errs[i] = leaseStateError("heartbeat", l, at)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return errs, nil
}

// leaseStateError explains why a lease could not be heartbeated or
// released.
func leaseStateError(op string, l Lease, at time.Time) error {
	switch {
	case l.State == LeaseReleased:
		return fmt.Errorf("store: %s lease %s: %w", op, l.ID, ErrLeaseReleased)
	case l.State == LeaseExpired:
		return fmt.Errorf("store: %s lease %s: %w at %s", op, l.ID, ErrLeaseExpired, l.ExpiredAt.UTC().Format(time.RFC3339Nano))
	case l.ExpiresAt.Before(at):
		return fmt.Errorf("store: %s lease %s: %w (overdue since %s)", op, l.ID, ErrLeaseExpired, l.ExpiresAt.UTC().Format(time.RFC3339Nano))
	}
	return nil
}

// ReleaseLease releases a live lease and returns its row. Releasing a
// released lease returns its row and nil: release is idempotent. A lease
// that expired, or is overdue, is not released and the error wraps
// ErrLeaseExpired (an overdue lease stays live until ExpireLeases marks it).
// An unknown lease is ErrNotFound.
func (s *Store) ReleaseLease(ctx context.Context, id string, at time.Time) (Lease, error) {
	var out Lease
	err := s.tx(ctx, func(tx *sql.Tx) error {
		l, err := scanLease(tx.QueryRowContext(ctx, "SELECT "+leaseCols+" FROM leases WHERE id = ?", id), "release lease "+id)
		if err != nil {
			return err
		}
		out = l
		if l.State == LeaseReleased {
			return nil
		}
		if err := leaseStateError("release", l, at); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, "UPDATE leases SET state = 'released', released_at = ? WHERE id = ?", ms(at), id); err != nil {
			return fmt.Errorf("store: release lease %s: %w", id, err)
		}
		out.State, out.ReleasedAt = LeaseReleased, fromMS(ms(at))
		return nil
	})
	return out, err
}

// ExpireLeases marks every overdue live lease (ExpiresAt before at) expired
// and returns them, in their new state. Each lease is returned by exactly
// one call, across every process sharing the database.
func (s *Store) ExpireLeases(ctx context.Context, at time.Time) ([]Lease, error) {
	var out []Lease
	err := s.tx(ctx, func(tx *sql.Tx) error {
		var err error
		out, err = s.queryLeases(ctx, tx, `
			UPDATE leases SET state = 'expired', expired_at = ?1
			WHERE state = 'live' AND expires_at < ?1
			RETURNING `+leaseCols, ms(at))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("store: expire leases: %w", err)
	}
	return out, nil
}

func jsonIDs(ids []string) string {
	b, err := json.Marshal(ids)
	if err != nil { // cannot happen for []string
		panic(err)
	}
	return string(b)
}
