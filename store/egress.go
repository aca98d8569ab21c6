package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Egress (schema version 7): a project's network policy, kept as the JSON
// that package egress validates and reads, and the journal of outbound
// connections.

const (
	sqlEgressPolicy   = "SELECT policy FROM egress_policies WHERE project = ?"
	sqlEgressPolicyAt = `SELECT coalesce(e.policy, ''), p.tenancy_version
		FROM projects p LEFT JOIN egress_policies e ON e.project = p.id WHERE p.id = ?`
)

func (s *sqliteStore) SetEgressPolicy(ctx context.Context, project int64, policyJSON string) error {
	res, err := s.w.ExecContext(ctx, `INSERT INTO egress_policies (project, policy, updated_at)
		SELECT id, ?, ? FROM projects WHERE id = ?
		ON CONFLICT (project) DO UPDATE SET policy = excluded.policy, updated_at = excluded.updated_at`,
		policyJSON, ms(s.now()), project)
	if err != nil {
		return classify(err, fmt.Sprintf("set egress policy of project %d", project))
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("store: project %d: %w", project, ErrNotFound)
	}
	return nil
}

func (s *sqliteStore) EgressPolicy(ctx context.Context, project int64) (string, error) {
	st, err := s.readStmt(ctx, sqlEgressPolicy)
	if err != nil {
		return "", err
	}
	hctx, err := hot(ctx)
	if err != nil {
		return "", fmt.Errorf("store: egress policy of project %d: %w", project, err)
	}
	var v string
	err = st.QueryRowContext(hctx, project).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", classify(err, fmt.Sprintf("egress policy of project %d", project))
	}
	return v, nil
}

func (s *sqliteStore) EgressPolicyAt(ctx context.Context, project int64) (string, int64, error) {
	st, err := s.readStmt(ctx, sqlEgressPolicyAt)
	if err != nil {
		return "", 0, err
	}
	hctx, err := hot(ctx)
	if err != nil {
		return "", 0, fmt.Errorf("store: egress policy of project %d: %w", project, err)
	}
	var (
		v       string
		version int64
	)
	err = st.QueryRowContext(hctx, project).Scan(&v, &version)
	if errors.Is(err, sql.ErrNoRows) {
		return "", 0, nil
	}
	if err != nil {
		return "", 0, classify(err, fmt.Sprintf("egress policy of project %d", project))
	}
	return v, version, nil
}

// EgressEntry is one row of the egress journal.
type EgressEntry struct {
	ID                int64
	Account           int64
	Project           int64
	Protocol          string
	Name              string
	Addr              string
	Port              int
	Verdict           string
	Rule              string
	Error             string
	BytesIn, BytesOut int64
	StartedAt         time.Time
	Duration          time.Duration
}

// MaxEgressRows is how many egress journal rows a project keeps: its
// older rows are deleted as it appends more (checked every
// egressPruneEvery appends of the project, so it may briefly hold up to
// that many more). A machine opening connections in a loop, thousands a
// second, must not grow the daemon's database without bound.
const MaxEgressRows = 10000

// maxEgressRows is MaxEgressRows (tests lower it).
var maxEgressRows int64 = MaxEgressRows

// egressPruneEvery is how many appends of a project pass between two
// deletions of its rows beyond maxEgressRows.
const egressPruneEvery = 64

// egressPruner counts each project's AppendEgress calls, for either
// backend, to delete its rows beyond maxEgressRows every egressPruneEvery
// of them. Its zero value is ready.
type egressPruner struct {
	appends sync.Map // project id → *atomic.Int64
}

// due counts an append of project and reports whether its rows are due
// for pruning.
func (p *egressPruner) due(project int64) bool {
	n, _ := p.appends.LoadOrStore(project, new(atomic.Int64))
	return n.(*atomic.Int64).Add(1)%egressPruneEvery == 0
}

func (s *sqliteStore) AppendEgress(ctx context.Context, e EgressEntry) (int64, error) {
	res, err := s.w.ExecContext(ctx, `INSERT INTO egress_log (account, project, protocol, name, addr, port,
		verdict, rule, error, bytes_in, bytes_out, started_at, duration_ms) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)`,
		e.Account, e.Project, e.Protocol, e.Name, e.Addr, e.Port, e.Verdict, e.Rule, e.Error,
		e.BytesIn, e.BytesOut, ms(e.StartedAt), e.Duration.Milliseconds())
	if err != nil {
		return 0, classify(err, "append egress journal")
	}
	id, err := res.LastInsertId()
	if err != nil {
		return 0, err
	}
	if s.egress.due(e.Project) {
		if _, err := s.w.ExecContext(ctx, `DELETE FROM egress_log WHERE project = ?1 AND id <=
			(SELECT id FROM egress_log WHERE project = ?1 ORDER BY id DESC LIMIT 1 OFFSET ?2)`, e.Project, maxEgressRows); err != nil {
			return id, classify(err, "prune egress journal")
		}
	}
	return id, nil
}

func (s *sqliteStore) EgressLog(ctx context.Context, project int64, limit int) ([]EgressEntry, error) {
	if limit <= 0 {
		limit = 100
	}
	rows, err := s.r.QueryContext(ctx, "SELECT "+egressCols+" FROM egress_log WHERE project = ? ORDER BY id DESC LIMIT ?", project, limit)
	if err != nil {
		return nil, classify(err, fmt.Sprintf("egress journal of project %d", project))
	}
	defer rows.Close()
	out, err := collect(rows, scanEgress)
	if err != nil {
		return nil, classify(err, "egress journal")
	}
	return out, nil
}

// egressCols are the columns scanEgress scans.
const egressCols = "id, account, project, protocol, name, addr, port, verdict, rule, error, bytes_in, bytes_out, started_at, duration_ms"

func scanEgress(r scanner) (EgressEntry, error) {
	var e EgressEntry
	var started, dur int64
	if err := r.Scan(&e.ID, &e.Account, &e.Project, &e.Protocol, &e.Name, &e.Addr, &e.Port, &e.Verdict, &e.Rule,
		&e.Error, &e.BytesIn, &e.BytesOut, &started, &dur); err != nil {
		return EgressEntry{}, err
	}
	e.StartedAt, e.Duration = fromMS(started), time.Duration(dur)*time.Millisecond
	return e, nil
}
