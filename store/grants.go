package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
)

// Permissions beyond membership (schema version 4): an account's host-path
// grant, and a project's export remotes.

func (s *sqliteStore) SetHostPaths(ctx context.Context, account int64, on bool) error {
	v := 0
	if on {
		v = 1
	}
	res, err := s.w.ExecContext(ctx, "UPDATE accounts SET host_paths = ? WHERE id = ?", v, account)
	if err != nil {
		return classify(err, fmt.Sprintf("set host paths of account %d", account))
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("store: account %d: %w", account, ErrNotFound)
	}
	return nil
}

func (s *sqliteStore) HostPaths(ctx context.Context, account int64) (bool, error) {
	var v int
	err := s.r.QueryRowContext(ctx, "SELECT host_paths FROM accounts WHERE id = ?", account).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return false, fmt.Errorf("store: account %d: %w", account, ErrNotFound)
	}
	if err != nil {
		return false, classify(err, fmt.Sprintf("host paths of account %d", account))
	}
	return v == 1, nil
}

func (s *sqliteStore) SetExportRemotes(ctx context.Context, project int64, patterns []string) error {
	v, err := exportRemotes(patterns)
	if err != nil {
		return err
	}
	res, err := s.w.ExecContext(ctx, "UPDATE projects SET export_remotes = ? WHERE id = ?", v, project)
	if err != nil {
		return classify(err, fmt.Sprintf("set export remotes of project %d", project))
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("store: project %d: %w", project, ErrNotFound)
	}
	return nil
}

func (s *sqliteStore) ExportRemotes(ctx context.Context, project int64) ([]string, error) {
	var v string
	err := s.r.QueryRowContext(ctx, "SELECT export_remotes FROM projects WHERE id = ?", project).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("store: project %d: %w", project, ErrNotFound)
	}
	if err != nil {
		return nil, classify(err, fmt.Sprintf("export remotes of project %d", project))
	}
	if v == "" {
		return nil, nil
	}
	return strings.Split(v, "\n"), nil
}

// exportRemotes returns the export_remotes column of patterns, or an error
// for an empty or multi-line pattern.
func exportRemotes(patterns []string) (string, error) {
	for _, p := range patterns {
		if p == "" || strings.ContainsAny(p, "\r\n") {
			return "", fmt.Errorf("store: export remote pattern %q: empty or multi-line", p)
		}
	}
	return strings.Join(patterns, "\n"), nil
}
