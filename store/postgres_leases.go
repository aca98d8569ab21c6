package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// The PostgreSQL backend's leases and command journal. See postgres.go
// for the order in which statements lock a lease's rows.

// pgCommandStart is a command's start, one statement: the lease, its clock
// and its journal entry, inserted only while the project's row, locked FOR
// SHARE, has tenancy version $9 (NULL: any); it returns the entry's ID, or
// no row if the project is gone or its version is another.
const pgCommandStart = `WITH p AS (SELECT id FROM projects WHERE id = $3 AND ($9::bigint IS NULL OR tenancy_version = $9) FOR SHARE),
	l AS (INSERT INTO leases (id, account, project, kind, domain, holder, state, ttl_ms, created_at, heartbeat_at, expires_at)
		SELECT $1::text, $2::bigint, p.id, $4::text, $5::text, $6::text, 'live', $7::bigint, $8::bigint, $8, $8 + $7 FROM p
		RETURNING seq, project, expires_at, ttl_ms),
	c AS (INSERT INTO lease_clock (seq, expires_at, ttl_ms, project) SELECT seq, expires_at, ttl_ms, project FROM l),
	j AS (INSERT INTO journal (account, project, domain, lease, lease_kind, argv, limits, started_at)
		SELECT $10::bigint, $11::bigint, $12::text, $1, $13::text, $14::text, $15::text, $16::bigint FROM l WHERE $17::boolean
		RETURNING id)
	SELECT coalesce((SELECT id FROM j), 0) FROM l`

func (s *pgStore) CreateLease(ctx context.Context, n NewLease, at time.Time) (Lease, error) {
	l, n, err := newLease(n, at)
	if err != nil {
		return Lease{}, err
	}
	var (
		tenancy any // NULL: not checked
		j       JournalCommand
		argv    string
		limits  string
	)
	if n.TenancyVersion != 0 {
		tenancy = n.TenancyVersion
	}
	if n.Journal != nil {
		j = *n.Journal
		if argv, limits, err = journalJSON(j); err != nil {
			return Lease{}, fmt.Errorf("store: journal start: %w", err)
		}
	}
	err = s.pool.QueryRow(ctx, pgCommandStart, l.ID, l.Account, l.Project, l.Kind, l.Domain, l.Holder, l.TTL.Milliseconds(),
		ms(l.Created), tenancy, j.Account, j.Project, j.Domain, j.LeaseKind, argv, limits, ms(s.now()), n.Journal != nil).Scan(&l.Journal)
	switch {
	case err == nil:
		return l, nil
	case errors.Is(err, pgx.ErrNoRows) && n.TenancyVersion != 0:
		// A deleted project has no version: refused alike.
		s.tenancy.forget(n.Project, n.Account, n.TenancyVersion)
		return Lease{}, fmt.Errorf("store: create lease for project %d: %w", n.Project, ErrTenancyChanged)
	case errors.Is(err, pgx.ErrNoRows):
		return Lease{}, fmt.Errorf("store: create lease for project %d: %w", n.Project, ErrNotFound)
	}
	return Lease{}, classify(err, fmt.Sprintf("create lease for project %d", n.Project))
}

func (s *pgStore) GetLease(ctx context.Context, id string) (Lease, error) {
	return scanLease(s.pool.QueryRow(ctx, "SELECT "+leaseCols+leaseFrom+" WHERE l.id = $1", id), "lease "+id)
}

func (s *pgStore) ListLeases(ctx context.Context, f LeaseFilter) ([]Lease, error) {
	q, args := leaseQuery(f, "JOIN")
	return s.leases(ctx, rebind(q), args...)
}

func (s *pgStore) leases(ctx context.Context, q string, args ...any) ([]Lease, error) {
	return pgList(ctx, s, "leases", func(r scanner) (Lease, error) { return scanLease(r, "leases") }, q, args...)
}

// rebind turns a query's ? placeholders into PostgreSQL's $1, $2, ...
// (for the queries both backends build alike: no ? in their literals).
func rebind(q string) string {
	var b strings.Builder
	n := 0
	for _, r := range q {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

func (s *pgStore) LeasesByID(ctx context.Context, ids []string) (map[string]Lease, error) {
	out := make(map[string]Lease, len(ids))
	if len(ids) == 0 {
		return out, nil
	}
	list, err := s.leases(ctx, "SELECT "+leaseCols+leaseFrom+" WHERE l.id = ANY($1)", ids)
	for _, l := range list {
		out[l.ID] = l
	}
	return out, err
}

func (s *pgStore) LiveLeaseCount(ctx context.Context) (int, error) {
	var n int
	if err := s.pool.QueryRow(ctx, "SELECT count(*) FROM lease_clock").Scan(&n); err != nil {
		return 0, fmt.Errorf("store: count live leases: %w", pgErr(err))
	}
	return n, nil
}

func (s *pgStore) ProjectLiveLeases(ctx context.Context, project int64) (int, error) {
	var n int
	if err := s.pool.QueryRow(ctx, "SELECT count(*) FROM lease_clock WHERE project = $1", project).Scan(&n); err != nil {
		return 0, fmt.Errorf("store: count live leases of project %d: %w", project, pgErr(err))
	}
	return n, nil
}

func (s *pgStore) HeartbeatLease(ctx context.Context, id string, at time.Time) error {
	errs, err := s.HeartbeatLeases(ctx, []string{id}, at)
	if err != nil {
		return err
	}
	return errs[0]
}

func (s *pgStore) HeartbeatLeases(ctx context.Context, ids []string, at time.Time) (errs []error, err error) {
	errs = make([]error, len(ids))
	if len(ids) == 0 {
		return errs, nil
	}
	now := ms(at)
	// One statement extends every live lease on time and names them; the
	// others' state is read only when there are any.
	rows, err := s.pool.Query(ctx, `UPDATE lease_clock c SET expires_at = $1 + c.ttl_ms FROM leases l
		WHERE l.id = ANY($2) AND c.seq = l.seq AND c.expires_at >= $1 RETURNING l.id`, now, ids)
	if err != nil {
		return nil, fmt.Errorf("store: heartbeat: %w", pgErr(err))
	}
	extended, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("store: heartbeat: %w", pgErr(err))
	}
	why := make(map[string]error, len(ids))
	for _, id := range ids {
		why[id] = ErrNotFound
	}
	for _, id := range extended {
		why[id] = nil
	}
	if len(extended) < len(ids) {
		var rest []string
		for _, id := range ids {
			if why[id] != nil {
				rest = append(rest, id)
			}
		}
		rows, err := s.pool.Query(ctx, `SELECT l.id, l.state, c.expires_at FROM leases l LEFT JOIN lease_clock c ON c.seq = l.seq
			WHERE l.id = ANY($1)`, rest)
		if err != nil {
			return nil, fmt.Errorf("store: heartbeat: %w", pgErr(err))
		}
		defer rows.Close()
		for rows.Next() {
			var (
				id, state string
				expires   sql.NullInt64
			)
			if err := rows.Scan(&id, &state, &expires); err != nil {
				return nil, fmt.Errorf("store: heartbeat: %w", pgErr(err))
			}
			why[id] = heartbeatRefusal(LeaseState(state), expires, now)
		}
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("store: heartbeat: %w", pgErr(err))
		}
	}
	for i, id := range ids {
		if why[id] != nil {
			errs[i] = fmt.Errorf("store: heartbeat lease %s: %w", id, why[id])
		}
	}
	return errs, nil
}

// pgEndLease is the part of a statement that ends a lease: its clock row
// is deleted first (the lock order of postgres.go) if the lease is
// releasable at $2 (not overdue), then its row takes the clock's final
// values. $1 is the lease's ID.
const pgEndLease = `c AS (DELETE FROM lease_clock c USING leases l WHERE l.id = $1 AND c.seq = l.seq AND c.expires_at >= $2
		RETURNING c.seq, c.expires_at, c.ttl_ms),
	r AS (UPDATE leases l SET state = 'released', released_at = $2, heartbeat_at = c.expires_at - c.ttl_ms, expires_at = c.expires_at
		FROM c WHERE l.seq = c.seq RETURNING l.*)`

func (s *pgStore) ReleaseLease(ctx context.Context, id string, at time.Time) (Lease, error) {
	l, err := scanLease(s.pool.QueryRow(ctx, "WITH "+pgEndLease+" SELECT "+leaseColsRow+" FROM r", id, ms(at)), "release lease "+id)
	if err == nil || !errors.Is(err, ErrNotFound) {
		return l, err
	}
	return s.releaseSlow(ctx, id, at)
}

func (s *pgStore) ReleaseHeldLease(ctx context.Context, id string, at time.Time) error {
	tag, err := s.pool.Exec(ctx, "WITH "+pgEndLease+" SELECT 1 FROM r", id, ms(at))
	if err != nil {
		return fmt.Errorf("store: release lease %s: %w", id, pgErr(err))
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	_, err = s.releaseSlow(ctx, id, at)
	return err
}

// releaseSlow is the rest of a release whose statement released nothing:
// it finds out why, and releases the lease if it became releasable in
// between (another process's heartbeat).
func (s *pgStore) releaseSlow(ctx context.Context, id string, at time.Time) (Lease, error) {
	if testHookReleaseFallback != nil {
		testHookReleaseFallback()
	}
	l, err := scanLease(s.pool.QueryRow(ctx, "SELECT "+leaseCols+leaseFrom+" WHERE l.id = $1", id), "release lease "+id)
	if err != nil {
		return Lease{}, err
	}
	if err := releaseRefusal(l, at); err != nil || l.State == LeaseReleased {
		return l, err
	}
	// Live and on time now: release it as the first statement would have.
	out, err := scanLease(s.pool.QueryRow(ctx, "WITH "+pgEndLease+" SELECT "+leaseColsRow+" FROM r", id, ms(at)), "release lease "+id)
	if errors.Is(err, ErrNotFound) {
		// Ended by someone else meanwhile: say how, once more.
		if l, err = s.GetLease(ctx, id); err != nil {
			return Lease{}, err
		}
		return l, releaseRefusal(l, at)
	}
	return out, err
}

func (s *pgStore) ExpireLeases(ctx context.Context, at time.Time) ([]Lease, error) {
	now := ms(at)
	var due bool
	if err := s.pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM lease_clock WHERE expires_at < $1)", now).Scan(&due); err != nil {
		return nil, fmt.Errorf("store: expire leases: %w", pgErr(err))
	}
	if !due {
		return nil, nil
	}
	// The clocks are deleted first (the lock order of postgres.go): of two
	// sweeps, the second finds them gone and returns nothing.
	out, err := s.leases(ctx, `WITH c AS (DELETE FROM lease_clock WHERE expires_at < $1 RETURNING seq, expires_at, ttl_ms),
		r AS (UPDATE leases l SET state = 'expired', expired_at = $1, heartbeat_at = c.expires_at - c.ttl_ms, expires_at = c.expires_at
			FROM c WHERE l.seq = c.seq RETURNING l.*)
		SELECT `+leaseColsRow+` FROM r ORDER BY seq`, now)
	if err != nil {
		return nil, fmt.Errorf("store: expire leases: %w", err)
	}
	return out, nil
}

func (s *pgStore) JournalStart(ctx context.Context, in JournalCommand) (int64, error) {
	argv, limits, err := journalJSON(in)
	if err != nil {
		return 0, fmt.Errorf("store: journal start: %w", err)
	}
	var id int64
	err = s.pool.QueryRow(ctx, `INSERT INTO journal (account, project, domain, lease, lease_kind, argv, limits, started_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING id`,
		in.Account, in.Project, in.Domain, in.Lease, in.LeaseKind, argv, limits, ms(s.now())).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("store: journal start: %w", pgErr(err))
	}
	return id, nil
}

// pgFinish is the update of a running journal entry's end: $3 is the
// entry, $2 the time, $4... the end's columns.
const pgFinish = `UPDATE journal SET ended_at = $2, outcome = $4, code = $5, signal = $6, oom_killed = $7, error_kind = $8,
	stdout_bytes = $9, stderr_bytes = $10, message = $11 WHERE id = $3 AND outcome IS NULL`

func (s *pgStore) JournalFinish(ctx context.Context, id int64, end JournalEnd) error {
	code, err := end.check(id)
	if err != nil {
		return err
	}
	// $1 (a lease) is unused here: the statement is pgFinish alone.
	tag, err := s.pool.Exec(ctx, pgFinish+" AND $1::text IS NULL", nil, ms(s.now()), id, string(end.Outcome), code, end.Signal,
		end.OOMKilled, end.ErrorKind, end.StdoutBytes, end.StderrBytes, end.Message)
	if err != nil {
		return fmt.Errorf("store: journal finish %d: %w", id, pgErr(err))
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("store: journal finish %d: no running entry: %w", id, ErrNotFound)
	}
	return nil
}

func (s *pgStore) ReleaseAndFinish(ctx context.Context, lease string, at time.Time, id int64, end JournalEnd) (journaled bool, err error) {
	code, err := end.check(id)
	if err != nil {
		return false, err
	}
	// One statement: the lease ended (pgEndLease) and, only then and only
	// if the entry is that lease's, the entry finished.
	// As on SQLite, journaled is the release's: an entry that is not
	// running, or not the lease's, is left as it is.
	var released bool
	err = s.pool.QueryRow(ctx, "WITH "+pgEndLease+", j AS ("+pgFinish+" AND lease = $1 AND EXISTS (SELECT 1 FROM r))"+
		" SELECT EXISTS (SELECT 1 FROM r)",
		lease, ms(at), id, string(end.Outcome), code, end.Signal, end.OOMKilled, end.ErrorKind,
		end.StdoutBytes, end.StderrBytes, end.Message).Scan(&released)
	if err != nil {
		return false, fmt.Errorf("store: release lease %s: %w", lease, pgErr(err))
	}
	if released {
		return true, nil
	}
	_, err = s.releaseSlow(ctx, lease, at)
	return false, err
}

func (s *pgStore) JournalInterrupt(ctx context.Context, lease, message string) (int, error) {
	tag, err := s.pool.Exec(ctx,
		"UPDATE journal SET ended_at = $1, outcome = 'interrupted', message = $2 WHERE lease = $3 AND outcome IS NULL",
		ms(s.now()), message, lease)
	if err != nil {
		return 0, fmt.Errorf("store: journal interrupt lease %s: %w", lease, pgErr(err))
	}
	return int(tag.RowsAffected()), nil
}

func (s *pgStore) JournalInterruptReleased(ctx context.Context, before time.Time, message string) (int, error) {
	tag, err := s.pool.Exec(ctx, `UPDATE journal SET ended_at = $1, outcome = 'interrupted', message = $2
		WHERE outcome IS NULL AND EXISTS (SELECT 1 FROM leases l
			WHERE l.id = journal.lease AND l.state = 'released' AND l.released_at < $3)`,
		ms(s.now()), message, ms(before))
	if err != nil {
		return 0, fmt.Errorf("store: journal interrupt released: %w", pgErr(err))
	}
	return int(tag.RowsAffected()), nil
}

func (s *pgStore) ListJournal(ctx context.Context, f JournalFilter) ([]JournalEntry, error) {
	q, args := journalQuery(f)
	return pgList(ctx, s, "list journal", scanJournal, rebind(q), args...)
}

func (s *pgStore) RecordArtifact(ctx context.Context, project int64, path, lease string) (Artifact, error) {
	if path == "" {
		return Artifact{}, fmt.Errorf("store: record artifact: empty path")
	}
	a := Artifact{Project: project, Path: path, Lease: lease, Created: stamp(s.now)}
	err := s.pool.QueryRow(ctx, "INSERT INTO artifacts (project, path, lease, created_at) VALUES ($1, $2, $3, $4) RETURNING id",
		project, path, lease, ms(a.Created)).Scan(&a.ID)
	if err != nil {
		return Artifact{}, classify(err, fmt.Sprintf("record artifact in project %d", project))
	}
	return a, nil
}

func (s *pgStore) ListArtifacts(ctx context.Context, project int64, includeDeleted bool) ([]Artifact, error) {
	return pgList(ctx, s, "list artifacts", scanArtifact, rebind(artifactQuery(includeDeleted)), project)
}

func (s *pgStore) MarkArtifactDeleted(ctx context.Context, id int64) error {
	return s.setOnce(ctx, "artifacts", "deleted_at", id, fmt.Sprintf("artifact %d", id))
}
