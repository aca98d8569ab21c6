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

// Migrations are the files migrations/BACKEND/NNNN_description.sql, one set
// per backend (sqlite, postgres); file NNNN takes that backend's schema
// from version NNNN-1 to NNNN, except a set's first file, which creates
// the schema of its version from nothing (PostgreSQL's set starts at the
// SQLite version it was written for: its 0017 creates version 17). Both
// sets end at the same version, LatestVersion. They are never edited once
// released: a change is a new file in each set.
//
//go:embed migrations/sqlite/*.sql migrations/postgres/*.sql
var migrationFS embed.FS

type migration struct {
	version int
	name    string
	sql     string
}

var (
	migrationsOnce sync.Once
	migrationSets  map[string][]migration // by backend scheme
)

// loadMigrations returns the embedded migrations of backend (SchemeSQLite
// or SchemePostgres), parsed once. A malformed set (a gap, a duplicate, a
// bad name, sets ending at different versions) is a build mistake and
// panics.
func loadMigrations(backend string) []migration {
	migrationsOnce.Do(func() {
		migrationSets = map[string][]migration{}
		for _, b := range []string{SchemeSQLite, SchemePostgres} {
			migrationSets[b] = parseMigrations(path.Join("migrations", b))
		}
		if s, p := migrationSets[SchemeSQLite], migrationSets[SchemePostgres]; s[len(s)-1].version != p[len(p)-1].version {
			panic(fmt.Sprintf("store: the SQLite migrations end at version %d, PostgreSQL's at %d", s[len(s)-1].version, p[len(p)-1].version))
		}
	})
	return migrationSets[backend]
}

func parseMigrations(dir string) []migration {
	entries, err := fs.ReadDir(migrationFS, dir)
	if err != nil {
		panic(fmt.Sprintf("store: embedded migrations: %v", err))
	}
	var out []migration
	for _, e := range entries {
		name := e.Name()
		num, _, ok := strings.Cut(name, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			panic(fmt.Sprintf("store: bad migration file name %s/%s", dir, name))
		}
		b, err := migrationFS.ReadFile(path.Join(dir, name))
		if err != nil {
			panic(fmt.Sprintf("store: embedded migrations: %v", err))
		}
		out = append(out, migration{version: v, name: name, sql: string(b)})
	}
	if len(out) == 0 {
		panic(fmt.Sprintf("store: no migrations in %s", dir))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	for i, m := range out {
		if m.version != out[0].version+i {
			panic(fmt.Sprintf("store: migration %s/%s out of sequence: want version %d", dir, m.name, out[0].version+i))
		}
	}
	return out
}

// pending returns the migrations of set that take a schema at version have
// to the latest: every file after have, or, for a new database (have 0),
// the set from its first file on.
func pending(set []migration, have int) []migration {
	if have == 0 {
		return set
	}
	return set[have-set[0].version+1:]
}

// LatestVersion is the schema version this binary knows and creates, on
// either backend.
func LatestVersion() int {
	set := loadMigrations(SchemeSQLite)
	return set[len(set)-1].version
}

// migrate applies every pending migration in one write transaction. The
// version is read inside the transaction, so processes migrating the same
// file at once apply each migration exactly once.
func (s *sqliteStore) migrate(ctx context.Context) error {
	all := loadMigrations(SchemeSQLite)
	return s.tx(ctx, func(tx *sql.Tx) error {
		var have int
		if err := tx.QueryRowContext(ctx, "PRAGMA user_version").Scan(&have); err != nil {
			return fmt.Errorf("store: read schema version: %w", err)
		}
		if have > len(all) {
			return &SchemaError{Path: s.path, Have: have, Want: len(all)}
		}
		for _, m := range pending(all, have) {
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
