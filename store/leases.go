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
	sqlite3 "modernc.org/sqlite/lib"
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
	TTL         time.Duration
	Created     time.Time
	HeartbeatAt time.Time // the last heartbeat, or Created
	ExpiresAt   time.Time // HeartbeatAt + TTL
	ReleasedAt  time.Time // zero unless released
	ExpiredAt   time.Time // zero unless expired
	// Journal is the ID of the journal entry CreateLease created with the
	// lease (NewLease.Journal); zero otherwise, and in the rows other
	// methods return.
	Journal int64
}

// NewLease describes a lease to create.
type NewLease struct {
	// ID is the lease's ID. If empty, a new version 7 UUID: random, but
	// ordered by creation time, so that the indexes of lease IDs (leases,
	// journal) grow at one end instead of touching a random page of a
	// large index at each insert.
	ID      string
	Account int64
	Project int64
	Kind    string // required
	Domain  string
	Holder  string
	// TTL is how long the lease lives without a heartbeat. Required; it is
	// stored with millisecond precision.
	TTL time.Duration
	// TenancyVersion, if nonzero, is the Tenancy.Version of the read that
	// let the account work in the project (CachedTenancy): the lease is
	// created only if no project or membership changed since, else
	// CreateLease fails with ErrTenancyChanged. Zero checks nothing.
	TenancyVersion int64
	// Journal, if non-nil, is the journal entry of the command the lease
	// is for (its Lease is ignored: it is the new lease's ID). The entry is
	// created with the lease, in the same statement (schema 14): one write
	// for a command's start instead of two, and neither exists without the
	// other. Lease.Journal is then its ID.
	Journal *JournalCommand
}

// leaseCols reads a lease's current values: a live lease's expiry comes
// from lease_clock.
const leaseCols = `l.id, l.account, l.project, l.kind, l.domain, l.holder, l.state, l.ttl_ms, l.created_at,
	coalesce(c.expires_at - c.ttl_ms, l.heartbeat_at), coalesce(c.expires_at, l.expires_at),
	l.released_at, l.expired_at`

const leaseFrom = " FROM leases l LEFT JOIN lease_clock c ON c.seq = l.seq"

// The statements of the hot paths, prepared once per Store: parsing them
// costs more than running them.
const (
	// The lease_clock_start trigger starts the new lease's clock: creating
	// a lease is this one statement.
	sqlInsertLease = `INSERT INTO leases (id, account, project, kind, domain, holder, state, ttl_ms, created_at, heartbeat_at, expires_at)
			VALUES (?, ?, ?, ?, ?, ?, 'live', ?, ?, ?, ?)`
	// sqlInsertLeaseAt is sqlInsertLease if the project's tenancy version
	// (schema 16) is still ?11.
	sqlInsertLeaseAt = `INSERT INTO leases (id, account, project, kind, domain, holder, state, ttl_ms, created_at, heartbeat_at, expires_at)
			SELECT ?1, ?2, ?3, ?4, ?5, ?6, 'live', ?7, ?8, ?9, ?10 WHERE (SELECT tenancy_version FROM projects WHERE id = ?3) = ?11`
	sqlHeartbeat = `UPDATE lease_clock SET expires_at = ?1 + ttl_ms
			WHERE seq IN (SELECT seq FROM leases WHERE id IN (SELECT value FROM json_each(?2)))
			  AND expires_at >= ?1`
	// sqlRelease releases a live lease that is not overdue, copying its
	// clock's final values into its row; the lease_clock_stop trigger then
	// deletes the clock. It changes nothing (and returns no row) for any
	// other lease, which ReleaseLease then examines.
	sqlRelease = `UPDATE leases SET state = 'released', released_at = ?2,
				(heartbeat_at, expires_at) = (SELECT c.expires_at - c.ttl_ms, c.expires_at FROM lease_clock c WHERE c.seq = leases.seq)
			WHERE id = ?1 AND state = 'live'
			  AND (SELECT c.expires_at FROM lease_clock c WHERE c.seq = leases.seq) >= ?2`
	sqlReleaseRow       = sqlRelease + " RETURNING " + leaseColsRow
	sqlSelectForRelease = "SELECT " + leaseCols + ", l.seq" + leaseFrom + " WHERE l.id = ?"
	sqlReleaseSeq       = `UPDATE leases SET state = 'released', released_at = ?, heartbeat_at = ?, expires_at = ? WHERE seq = ?`
	sqlAnyDue           = "SELECT EXISTS (SELECT 1 FROM lease_clock WHERE expires_at < ?)"
)

var (
	hotWriteStmts = []string{sqlInsertLease, sqlInsertLeaseAt, sqlHeartbeat, sqlRelease, sqlReleaseRow, sqlJournalStart, sqlJournalFinish, sqlCommandEnd, sqlCommandStart}
	hotReadStmts  = []string{sqlAnyDue, sqlGetProject, sqlGetMember, sqlGetTenancy, sqlAuthenticate, sqlEgressPolicy, sqlEgressPolicyAt}
)

// scanLease scans leaseCols, then extra.
func scanLease(r scanner, what string, extra ...any) (Lease, error) {
	var (
		l                                Lease
		state                            string
		ttl, created, heartbeat, expires int64
		releasedAt, expiredAt            sql.NullInt64
	)
	dest := append([]any{&l.ID, &l.Account, &l.Project, &l.Kind, &l.Domain, &l.Holder, &state, &ttl,
		&created, &heartbeat, &expires, &releasedAt, &expiredAt}, extra...)
	if err := r.Scan(dest...); err != nil {
		return Lease{}, classify(err, what)
	}
	l.State, l.TTL = LeaseState(state), time.Duration(ttl)*time.Millisecond
	l.Created, l.HeartbeatAt, l.ExpiresAt = fromMS(created), fromMS(heartbeat), fromMS(expires)
	l.ReleasedAt, l.ExpiredAt = fromNullMS(releasedAt), fromNullMS(expiredAt)
	return l, nil
}

// newLease validates n and returns the lease it creates at at, and n with
// its ID set.
func newLease(n NewLease, at time.Time) (Lease, NewLease, error) {
	if n.Kind == "" {
		return Lease{}, n, errors.New("store: create lease: kind is required")
	}
	ttl := n.TTL.Milliseconds()
	if ttl <= 0 {
		return Lease{}, n, fmt.Errorf("store: create lease: invalid TTL %v", n.TTL)
	}
	if n.ID == "" {
		id, err := uuid.NewV7()
		if err != nil {
			return Lease{}, n, fmt.Errorf("store: create lease: %w", err)
		}
		n.ID = id.String()
	}
	now := ms(at)
	return Lease{
		ID: n.ID, Account: n.Account, Project: n.Project, Kind: n.Kind, Domain: n.Domain, Holder: n.Holder,
		State: LeaseLive, TTL: time.Duration(ttl) * time.Millisecond,
		Created: fromMS(now), HeartbeatAt: fromMS(now), ExpiresAt: fromMS(now + ttl),
	}, n, nil
}

func (s *sqliteStore) CreateLease(ctx context.Context, n NewLease, at time.Time) (Lease, error) {
	l, n, err := newLease(n, at)
	if err != nil {
		return Lease{}, err
	}
	now, ttl := ms(l.Created), l.TTL.Milliseconds()
	// One statement: SQLite runs it in a transaction of its own, which
	// takes the write lock before it reads (no upgrade, as BEGIN IMMEDIATE).
	if n.Journal != nil {
		return s.createCommand(ctx, l, n)
	}
	if n.TenancyVersion == 0 {
		if r := s.exec(ctx, sqlInsertLease, l.ID, l.Account, l.Project, l.Kind, l.Domain, l.Holder, ttl, now, now, now+ttl); r.err != nil {
			return Lease{}, classify(r.err, fmt.Sprintf("create lease for project %d", n.Project))
		}
		return l, nil
	}
	// The version check is part of the insert: no tenancy change can
	// commit between them.
	r := s.exec(ctx, sqlInsertLeaseAt, l.ID, l.Account, l.Project, l.Kind, l.Domain, l.Holder, ttl, now, now, now+ttl, n.TenancyVersion)
	if r.err != nil {
		return Lease{}, classify(r.err, fmt.Sprintf("create lease for project %d", n.Project))
	}
	if r.rows == 0 {
		s.tenancy.forget(n.Project, n.Account, n.TenancyVersion)
		return Lease{}, fmt.Errorf("store: create lease for project %d: %w", n.Project, ErrTenancyChanged)
	}
	return l, nil
}

// sqlCommandStart creates a lease and its command's journal entry (schema
// 14's command_start); the entry's ID is one more than the newest's,
// chosen under the statement's write lock, and returned.
const sqlCommandStart = `INSERT INTO command_start (id, account, project, kind, domain, holder, ttl_ms, created_at, tenancy,
		journal, journal_account, journal_project, journal_domain, lease_kind, argv, limits, started_at)
	VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, (SELECT coalesce(max(id), 0) + 1 FROM journal), ?10, ?11, ?12, ?13, ?14, ?15, ?16)
	RETURNING journal`

// createCommand is CreateLease with n.Journal: the lease l and the entry
// in one statement.
func (s *sqliteStore) createCommand(ctx context.Context, l Lease, n NewLease) (Lease, error) {
	argv, limits, err := journalJSON(*n.Journal)
	if err != nil {
		return Lease{}, fmt.Errorf("store: journal start: %w", err)
	}
	var tenancy any // NULL: not checked
	if n.TenancyVersion != 0 {
		tenancy = n.TenancyVersion
	}
	j := n.Journal
	r := s.execQuery(ctx, sqlCommandStart, l.ID, l.Account, l.Project, l.Kind, l.Domain, l.Holder, l.TTL.Milliseconds(),
		ms(l.Created), tenancy, j.Account, j.Project, j.Domain, j.LeaseKind, argv, limits, ms(s.now()))
	switch {
	case r.err == nil:
		l.Journal = r.lastID
		return l, nil
	case sqliteCode(r.err) == sqlite3.SQLITE_CONSTRAINT_TRIGGER && strings.Contains(r.err.Error(), "tenancy changed"):
		s.tenancy.forget(n.Project, n.Account, n.TenancyVersion)
		return Lease{}, fmt.Errorf("store: create lease for project %d: %w", n.Project, ErrTenancyChanged)
	}
	return Lease{}, classify(r.err, fmt.Sprintf("create lease for project %d", n.Project))
}

func (s *sqliteStore) GetLease(ctx context.Context, id string) (Lease, error) {
	return scanLease(s.r.QueryRowContext(ctx, "SELECT "+leaseCols+leaseFrom+" WHERE l.id = ?", id),
		"lease "+id)
}

// LeaseFilter selects leases for ListLeases; zero fields match everything.
type LeaseFilter struct {
	Project int64
	Account int64
	State   LeaseState
	Holder  string
}

func (s *sqliteStore) ListLeases(ctx context.Context, f LeaseFilter) ([]Lease, error) {
	// CROSS JOIN fixes SQLite's order of the live leases' join.
	q, args := leaseQuery(f, "CROSS JOIN")
	return s.queryLeases(ctx, s.r, q, args...)
}

// leaseQuery returns ListLeases' query of f, with ? placeholders; join
// joins the live leases' clocks to their rows.
func leaseQuery(f LeaseFilter, join string) (string, []any) {
	var (
		where []string
		args  []any
	)
	if f.Project != 0 {
		where, args = append(where, "l.project = ?"), append(args, f.Project)
	}
	if f.Account != 0 {
		where, args = append(where, "l.account = ?"), append(args, f.Account)
	}
	if f.State != "" {
		where, args = append(where, "l.state = ?"), append(args, string(f.State))
	}
	if f.Holder != "" {
		where, args = append(where, "l.holder = ?"), append(args, f.Holder)
	}
	q := "SELECT " + leaseCols + leaseFrom
	if f.State == LeaseLive {
		// The live leases are those with a clock: start from there
		// rather than from the history.
		q = "SELECT " + leaseCols + " FROM lease_clock c " + join + " leases l ON l.seq = c.seq"
	}
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	return q + " ORDER BY l.seq", args
}

type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

func (s *sqliteStore) queryLeases(ctx context.Context, q querier, query string, args ...any) ([]Lease, error) {
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

func (s *sqliteStore) LeasesByID(ctx context.Context, ids []string) (map[string]Lease, error) {
	out := make(map[string]Lease, len(ids))
	if len(ids) == 0 {
		return out, nil
	}
	list, err := s.queryLeases(ctx, s.r,
		"SELECT "+leaseCols+leaseFrom+" WHERE l.id IN (SELECT value FROM json_each(?))", jsonIDs(ids))
	if err != nil {
		return nil, err
	}
	for _, l := range list {
		out[l.ID] = l
	}
	return out, nil
}

func (s *sqliteStore) LiveLeaseCount(ctx context.Context) (int, error) {
	var n int
	if err := s.r.QueryRowContext(ctx, "SELECT count(*) FROM lease_clock").Scan(&n); err != nil {
		return 0, fmt.Errorf("store: count live leases: %w", err)
	}
	return n, nil
}

func (s *sqliteStore) ProjectLiveLeases(ctx context.Context, project int64) (int, error) {
	var n int
	if err := s.r.QueryRowContext(ctx,
		sqlCountProjectLive, project).Scan(&n); err != nil {
		return 0, fmt.Errorf("store: count live leases of project %d: %w", project, err)
	}
	return n, nil
}

func (s *sqliteStore) HeartbeatLease(ctx context.Context, id string, at time.Time) error {
	errs, err := s.HeartbeatLeases(ctx, []string{id}, at)
	if err != nil {
		return err
	}
	return errs[0]
}

func (s *sqliteStore) HeartbeatLeases(ctx context.Context, ids []string, at time.Time) (errs []error, err error) {
	errs = make([]error, len(ids))
	if len(ids) == 0 {
		return errs, nil
	}
	now := ms(at)
	uniq := make(map[string]bool, len(ids))
	for _, id := range ids {
		uniq[id] = true
	}
	list := make([]string, 0, len(uniq))
	for id := range uniq {
		list = append(list, id)
	}
	err = s.tx(ctx, func(tx *sql.Tx) error {
		// The common case, every lease live and on time, is one statement
		// that returns no rows: no per-lease work outside SQLite.
		upd, err := s.txStmt(ctx, tx, sqlHeartbeat)
		if err != nil {
			return err
		}
		res, err := upd.ExecContext(ctx, now, jsonIDs(list))
		if err != nil {
			return fmt.Errorf("store: heartbeat: %w", err)
		}
		if n, err := res.RowsAffected(); err != nil {
			return fmt.Errorf("store: heartbeat: %w", err)
		} else if int(n) == len(list) {
			return nil
		}
		// Some were not extended: find out which, and why.
		rows, err := tx.QueryContext(ctx, `
			SELECT l.id, l.state, c.expires_at FROM leases l LEFT JOIN lease_clock c ON c.seq = l.seq
			WHERE l.id IN (SELECT value FROM json_each(?))`, jsonIDs(list))
		if err != nil {
			return fmt.Errorf("store: heartbeat: %w", err)
		}
		defer rows.Close()
		why := make(map[string]error, len(list))
		for _, id := range list {
			why[id] = ErrNotFound
		}
		for rows.Next() {
			var (
				id, state string
				expires   sql.NullInt64
			)
			if err := rows.Scan(&id, &state, &expires); err != nil {
				return fmt.Errorf("store: heartbeat: %w", err)
			}
			why[id] = heartbeatRefusal(LeaseState(state), expires, now)
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("store: heartbeat: %w", err)
		}
		for i, id := range ids {
			if why[id] != nil {
				errs[i] = fmt.Errorf("store: heartbeat lease %s: %w", id, why[id])
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return errs, nil
}

func (s *sqliteStore) ReleaseLease(ctx context.Context, id string, at time.Time) (Lease, error) {
	// The common case, a live lease on time, is one statement.
	upd, err := s.writeStmt(ctx, sqlReleaseRow)
	if err != nil {
		return Lease{}, err
	}
	l, err := scanLease(upd.QueryRowContext(ctx, id, ms(at)), "release lease "+id)
	if err == nil || !errors.Is(err, ErrNotFound) {
		return l, err
	}
	return s.releaseSlow(ctx, id, at)
}

func (s *sqliteStore) ReleaseHeldLease(ctx context.Context, id string, at time.Time) error {
	r := s.exec(ctx, sqlRelease, id, ms(at))
	if r.err != nil {
		return fmt.Errorf("store: release lease %s: %w", id, r.err)
	}
	if r.rows == 1 {
		return nil
	}
	_, err := s.releaseSlow(ctx, id, at)
	return err
}

// releaseSlow is the rest of ReleaseLease when its single statement
// released nothing.
func (s *sqliteStore) releaseSlow(ctx context.Context, id string, at time.Time) (Lease, error) {
	// Nothing was released: find out why, and release the lease if it
	// became releasable in between (another process's heartbeat).
	if testHookReleaseFallback != nil {
		testHookReleaseFallback()
	}
	var out Lease
	err := s.tx(ctx, func(tx *sql.Tx) error {
		var seq int64
		l, err := scanLease(tx.QueryRowContext(ctx, sqlSelectForRelease, id), "release lease "+id, &seq)
		if err != nil {
			return err
		}
		out = l
		if err := releaseRefusal(l, at); err != nil || l.State == LeaseReleased {
			return err
		}
		if _, err := tx.ExecContext(ctx, sqlReleaseSeq, ms(at), ms(l.HeartbeatAt), ms(l.ExpiresAt), seq); err != nil {
			return fmt.Errorf("store: release lease %s: %w", id, err)
		}
		out.State, out.ReleasedAt = LeaseReleased, fromMS(ms(at))
		return nil
	})
	return out, err
}

// heartbeatRefusal says why a lease in state, with a clock expiring at
// expires (NULL: none), was not extended at now; nil if it was (an
// extended lease expires at now + TTL, never before now).
func heartbeatRefusal(state LeaseState, expires sql.NullInt64, now int64) error {
	switch {
	case state == LeaseReleased:
		return ErrLeaseReleased
	case state == LeaseExpired:
		return ErrLeaseExpired
	case expires.Valid && expires.Int64 < now:
		return fmt.Errorf("%w (overdue)", ErrLeaseExpired)
	}
	return nil
}

// releaseRefusal says why l cannot be released at at: it expired or is
// overdue. A released lease (release is idempotent) and a live one on time
// are nil.
func releaseRefusal(l Lease, at time.Time) error {
	switch {
	case l.State == LeaseExpired:
		return fmt.Errorf("store: release lease %s: %w", l.ID, ErrLeaseExpired)
	case l.State == LeaseLive && l.ExpiresAt.Before(at):
		return fmt.Errorf("store: release lease %s: %w (overdue since %s)", l.ID, ErrLeaseExpired,
			l.ExpiresAt.UTC().Format(time.RFC3339Nano))
	}
	return nil
}

// testHookReleaseFallback, if set (by tests), runs when ReleaseLease's
// single statement released nothing, before it looks for the reason.
var testHookReleaseFallback func()

func (s *sqliteStore) ExpireLeases(ctx context.Context, at time.Time) ([]Lease, error) {
	now := ms(at)
	var due bool
	st, err := s.readStmt(ctx, sqlAnyDue)
	if err != nil {
		return nil, err
	}
	if err := st.QueryRowContext(ctx, now).Scan(&due); err != nil {
		return nil, fmt.Errorf("store: expire leases: %w", err)
	}
	if !due {
		return nil, nil
	}
	var out []Lease
	err = s.tx(ctx, func(tx *sql.Tx) error {
		// The lease_clock_stop trigger deletes the clock of each lease
		// after its row took the clock's final values.
		rows, err := tx.QueryContext(ctx, `
			UPDATE leases SET state = 'expired', expired_at = ?1,
				(heartbeat_at, expires_at) = (SELECT c.expires_at - c.ttl_ms, c.expires_at FROM lease_clock c WHERE c.seq = leases.seq)
			WHERE seq IN (SELECT seq FROM lease_clock WHERE expires_at < ?1)
			RETURNING `+leaseColsRow, now)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			l, err := scanLease(rows, "expire lease")
			if err != nil {
				return err
			}
			out = append(out, l)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("store: expire leases: %w", err)
	}
	return out, nil
}

// leaseColsRow reads a lease's row alone (an ended lease's final values),
// as in UPDATE ... RETURNING.
const leaseColsRow = `id, account, project, kind, domain, holder, state, ttl_ms, created_at,
	heartbeat_at, expires_at, released_at, expired_at`

// sqlCountProjectLive counts a project's live leases: their clocks.
const sqlCountProjectLive = "SELECT count(*) FROM lease_clock WHERE project = ?"

func jsonIDs(ids []string) string {
	b, err := json.Marshal(ids)
	if err != nil { // cannot happen for []string
		panic(err)
	}
	return string(b)
}
