package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// The PostgreSQL backend's egress policies and journal, and Sites
// publications.

func (s *pgStore) SetEgressPolicy(ctx context.Context, project int64, policyJSON string) error {
	// The policy and its project's tenancy version change in one
	// statement (SQLite's triggers of schema 17).
	var n int
	err := s.pool.QueryRow(ctx, `WITH e AS (INSERT INTO egress_policies (project, policy, updated_at)
			SELECT id, $1, $2 FROM projects WHERE id = $3
			ON CONFLICT (project) DO UPDATE SET policy = excluded.policy, updated_at = excluded.updated_at
			RETURNING project),
		p AS (UPDATE projects SET tenancy_version = tenancy_version + 1 WHERE id IN (SELECT project FROM e))
		SELECT count(*) FROM e`, policyJSON, ms(s.now()), project).Scan(&n)
	if err != nil {
		return classify(err, fmt.Sprintf("set egress policy of project %d", project))
	}
	if n == 0 {
		return fmt.Errorf("store: project %d: %w", project, ErrNotFound)
	}
	return nil
}

func (s *pgStore) EgressPolicy(ctx context.Context, project int64) (string, error) {
	var v string
	err := s.pool.QueryRow(ctx, "SELECT policy FROM egress_policies WHERE project = $1", project).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", classify(err, fmt.Sprintf("egress policy of project %d", project))
	}
	return v, nil
}

func (s *pgStore) EgressPolicyAt(ctx context.Context, project int64) (string, int64, error) {
	var (
		v       string
		version int64
	)
	err := s.pool.QueryRow(ctx, `SELECT coalesce(e.policy, ''), p.tenancy_version
		FROM projects p LEFT JOIN egress_policies e ON e.project = p.id WHERE p.id = $1`, project).Scan(&v, &version)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", 0, nil
	}
	if err != nil {
		return "", 0, classify(err, fmt.Sprintf("egress policy of project %d", project))
	}
	return v, version, nil
}

func (s *pgStore) AppendEgress(ctx context.Context, e EgressEntry) (int64, error) {
	var id int64
	err := s.pool.QueryRow(ctx, `INSERT INTO egress_log (account, project, protocol, name, addr, port,
		verdict, rule, error, bytes_in, bytes_out, started_at, duration_ms) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13)
		RETURNING id`,
		e.Account, e.Project, e.Protocol, e.Name, e.Addr, e.Port, e.Verdict, e.Rule, e.Error,
		e.BytesIn, e.BytesOut, ms(e.StartedAt), e.Duration.Milliseconds()).Scan(&id)
	if err != nil {
		return 0, classify(err, "append egress journal")
	}
	if s.egress.due(e.Project) {
		if _, err := s.pool.Exec(ctx, `DELETE FROM egress_log WHERE project = $1 AND id <=
			(SELECT id FROM egress_log WHERE project = $1 ORDER BY id DESC LIMIT 1 OFFSET $2)`, e.Project, maxEgressRows); err != nil {
			return id, classify(err, "prune egress journal")
		}
	}
	return id, nil
}

func (s *pgStore) EgressLog(ctx context.Context, project int64, limit int) ([]EgressEntry, error) {
	if limit <= 0 {
		limit = 100
	}
	return pgList(ctx, s, fmt.Sprintf("egress journal of project %d", project), scanEgress,
		"SELECT "+egressCols+" FROM egress_log WHERE project = $1 ORDER BY id DESC LIMIT $2", project, limit)
}

func (s *pgStore) PutPublication(ctx context.Context, p Publication) (Publication, error) {
	what := fmt.Sprintf("publish site %q", p.Name)
	// One statement: the name is inserted, or its row updated only if the
	// same project holds it; the row's project says which happened.
	var project, created int64
	err := s.pool.QueryRow(ctx, `INSERT INTO site_publications (name, project, port, owner, created_at) VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (name) DO UPDATE SET port = excluded.port, owner = excluded.owner
			WHERE site_publications.project = excluded.project
		RETURNING project, created_at`, p.Name, p.Project, p.Port, p.Owner, ms(stamp(s.now))).Scan(&project, &created)
	switch {
	case errors.Is(err, pgx.ErrNoRows): // held by another project: not updated
		return Publication{}, fmt.Errorf("store: %s: %w", what, ErrNameTaken)
	case err != nil:
		return Publication{}, classify(err, what)
	}
	p.Created = fromMS(created)
	return p, nil
}

func (s *pgStore) DeletePublication(ctx context.Context, project int64, name string) error {
	return s.execOne(ctx, fmt.Sprintf("site %q in project %d", name, project),
		"DELETE FROM site_publications WHERE name = $1 AND project = $2", name, project)
}

func (s *pgStore) GetPublication(ctx context.Context, name string) (Publication, error) {
	return scanPublication(s.pool.QueryRow(ctx, sqlPublication+" WHERE name = $1", name), fmt.Sprintf("site %q", name))
}

func (s *pgStore) ListPublications(ctx context.Context, project int64) ([]Publication, error) {
	out, err := pgList(ctx, s, "list sites", func(r scanner) (Publication, error) { return scanPublication(r, "list sites") },
		sqlPublication+" WHERE project = $1 ORDER BY name", project)
	if out == nil && err == nil {
		out = []Publication{}
	}
	return out, err
}
