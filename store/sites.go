package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// Publication is one Sites publication (schema version 8): HTTP requests
// for Name reach Port on the loopback of Project's machine.
type Publication struct {
	Name    string
	Project int64
	Port    int
	// Owner is the account that published (or last re-published) it.
	Owner   int64
	Created time.Time
}

// ErrNameTaken is wrapped by PutPublication when the name is published by
// another project. It also matches ErrExists.
var ErrNameTaken = fmt.Errorf("store: site name held by another project: %w", ErrExists)

func (s *sqliteStore) PutPublication(ctx context.Context, p Publication) (Publication, error) {
	what := fmt.Sprintf("publish site %q", p.Name)
	err := s.tx(ctx, func(tx *sql.Tx) error {
		var project, created int64
		err := tx.QueryRowContext(ctx, "SELECT project, created_at FROM site_publications WHERE name = ?", p.Name).Scan(&project, &created)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			p.Created = stamp(s.now)
			_, err = tx.ExecContext(ctx,
				"INSERT INTO site_publications (name, project, port, owner, created_at) VALUES (?, ?, ?, ?, ?)",
				p.Name, p.Project, p.Port, p.Owner, ms(p.Created))
			if err != nil {
				return classify(err, what)
			}
			return nil
		case err != nil:
			return classify(err, what)
		case project != p.Project:
			return fmt.Errorf("store: %s: %w", what, ErrNameTaken)
		}
		p.Created = fromMS(created)
		if _, err := tx.ExecContext(ctx, "UPDATE site_publications SET port = ?, owner = ? WHERE name = ?", p.Port, p.Owner, p.Name); err != nil {
			return classify(err, what)
		}
		return nil
	})
	if err != nil {
		return Publication{}, err
	}
	return p, nil
}

func (s *sqliteStore) DeletePublication(ctx context.Context, project int64, name string) error {
	res, err := s.w.ExecContext(ctx, "DELETE FROM site_publications WHERE name = ? AND project = ?", name, project)
	if err != nil {
		return classify(err, fmt.Sprintf("unpublish site %q", name))
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("store: site %q in project %d: %w", name, project, ErrNotFound)
	}
	return nil
}

const sqlPublication = "SELECT name, project, port, owner, created_at FROM site_publications"

func (s *sqliteStore) GetPublication(ctx context.Context, name string) (Publication, error) {
	st, err := s.readStmt(ctx, sqlPublication+" WHERE name = ?")
	if err != nil {
		return Publication{}, err
	}
	return scanPublication(st.QueryRowContext(ctx, name), fmt.Sprintf("site %q", name))
}

func (s *sqliteStore) ListPublications(ctx context.Context, project int64) ([]Publication, error) {
	rows, err := s.r.QueryContext(ctx, sqlPublication+" WHERE project = ? ORDER BY name", project)
	if err != nil {
		return nil, fmt.Errorf("store: list sites: %w", err)
	}
	defer rows.Close()
	out := []Publication{}
	for rows.Next() {
		p, err := scanPublication(rows, "list sites")
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: list sites: %w", err)
	}
	return out, nil
}

func scanPublication(r scanner, what string) (Publication, error) {
	var p Publication
	var created int64
	if err := r.Scan(&p.Name, &p.Project, &p.Port, &p.Owner, &created); err != nil {
		return Publication{}, classify(err, what)
	}
	p.Created = fromMS(created)
	return p, nil
}

func (s *sqliteStore) LiveToken(ctx context.Context, id int64) (Token, error) {
	st, err := s.readStmt(ctx, "SELECT id, account, name, created_at, last_used_at FROM tokens WHERE id = ? AND revoked_at IS NULL")
	if err != nil {
		return Token{}, err
	}
	var (
		t        Token
		created  int64
		lastUsed sql.NullInt64
	)
	if err := st.QueryRowContext(ctx, id).Scan(&t.ID, &t.Account, &t.Name, &created, &lastUsed); err != nil {
		return Token{}, classify(err, fmt.Sprintf("token %d", id))
	}
	t.Created, t.LastUsed = fromMS(created), fromNullMS(lastUsed)
	return t, nil
}
