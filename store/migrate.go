package store

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// Migrations are the files migrations/NNNN_description.sql; file NNNN takes
// the schema from version NNNN-1 to NNNN. They are never edited once
// released: a change is a new file.
//
//go:embed migrations/*.sql
var migrationFS embed.FS

type migration struct {
	version int
	name    string
	sql     string
}

var (
	migrationsOnce sync.Once
	migrations     []migration
)

// loadMigrations parses the embedded files once. A malformed set (a gap, a
// duplicate, a bad name) is a build mistake and panics.
func loadMigrations() []migration {
	migrationsOnce.Do(func() {
		entries, err := fs.ReadDir(migrationFS, "migrations")
		if err != nil {
			panic(fmt.Sprintf("store: embedded migrations: %v", err))
		}
		for _, e := range entries {
			name := e.Name()
			num, _, ok := strings.Cut(name, "_")
			v, err := strconv.Atoi(num)
			if !ok || err != nil || v <= 0 {
				panic(fmt.Sprintf("store: bad migration file name %q", name))
			}
			b, err := migrationFS.ReadFile(path.Join("migrations", name))
			if err != nil {
				panic(fmt.Sprintf("store: embedded migrations: %v", err))
			}
			migrations = append(migrations, migration{version: v, name: name, sql: string(b)})
		}
		sort.Slice(migrations, func(i, j int) bool { return migrations[i].version < migrations[j].version })
		for i, m := range migrations {
			if m.version != i+1 {
				panic(fmt.Sprintf("store: migration %q out of sequence: want version %d", m.name, i+1))
			}
		}
	})
	return migrations
}

// LatestVersion is the schema version this binary knows and creates.
func LatestVersion() int { return len(loadMigrations()) }

// migrate applies every pending migration in one write transaction. The
// version is read inside the transaction, so processes migrating the same
// file at once apply each migration exactly once.
func (s *Store) migrate(ctx context.Context) error {
	all := loadMigrations()
	return s.tx(ctx, func(tx *sql.Tx) error {
		var have int
		if err := tx.QueryRowContext(ctx, "PRAGMA user_version").Scan(&have); err != nil {
			return fmt.Errorf("store: read schema version: %w", err)
		}
		if have > len(all) {
			return &SchemaError{Path: s.path, Have: have, Want: len(all)}
		}
		for _, m := range all[have:] {
			if _, err := tx.ExecContext(ctx, m.sql); err != nil {
				return fmt.Errorf("store: migration %s: %w", m.name, err)
			}
		}
		if have == len(all) {
			return nil
		}
		// PRAGMA takes no bound parameters; the value is an int we own.
		if _, err := tx.ExecContext(ctx, "PRAGMA user_version = "+strconv.Itoa(len(all))); err != nil {
			return fmt.Errorf("store: set schema version: %w", err)
		}
		return nil
	})
}
