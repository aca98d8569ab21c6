package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// copyTables are the tables of an installation, parents before children.
// Every one is copied whole: accounts and token hashes, projects and
// members, leases (live ones with their clocks), the command journal,
// artifacts, Sites publications, egress policies and the egress journal.
var copyTables = []string{
	"accounts", "tokens", "projects", "members", "leases", "lease_clock", "journal",
	"artifacts", "site_publications", "egress_policies", "egress_log",
}

// ErrTargetNotEmpty is wrapped by Copy's error when the target database
// holds rows already: Copy never merges two installations.
var ErrTargetNotEmpty = errors.New("store: the target store is not empty")

// CopyCount is how many rows of one table Copy copied.
type CopyCount struct {
	Table string
	Rows  int64
}

// Copy copies every row of the installation in src, an SQLite store, into
// dst, an empty PostgreSQL store, keeping every ID (accounts', projects',
// journal entries'...), then moves dst's ID sequences past them, so that
// no ID is handed out twice. Both must be at this binary's schema version
// (open src without migrating, dst with).
//
// src is read in one read transaction: a daemon may keep running on it,
// and the copy is the installation as of the transaction's start (stop the
// daemon first to move what it writes afterwards). dst is written in one
// transaction that first checks, under an exclusive lock of its tables,
// that they hold no row: a target with rows is refused with an error
// wrapping ErrTargetNotEmpty and nothing is written. On any error nothing
// is written to dst.
func Copy(ctx context.Context, dst, src Store) ([]CopyCount, error) {
	from, ok := src.(*sqliteStore)
	if !ok {
		return nil, fmt.Errorf("store: copy: the source must be an SQLite store, not %T", src)
	}
	to, ok := dst.(*pgStore)
	if !ok {
		return nil, fmt.Errorf("store: copy: the target must be a PostgreSQL store, not %T", dst)
	}
	rtx, err := from.r.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("store: copy: read %s: %w", from.path, err)
	}
	defer rtx.Rollback()
	var out []CopyCount
	err = to.tx(ctx, func(wtx pgx.Tx) error {
		// A table the schema has and the list lacks (a later migration's)
		// would be left behind: refuse rather than copy part of it.
		rows, err := wtx.Query(ctx, `SELECT table_name FROM information_schema.tables
			WHERE table_schema = current_schema() AND table_type = 'BASE TABLE' AND table_name <> 'corral_schema'
			AND NOT (table_name = ANY($1))`, copyTables)
		if err != nil {
			return fmt.Errorf("store: copy: %w", pgErr(err))
		}
		missed, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("store: copy: %w", pgErr(err))
		}
		if len(missed) > 0 {
			return fmt.Errorf("store: copy: this corral does not know how to copy table(s) %s", strings.Join(missed, ", "))
		}
		if _, err := wtx.Exec(ctx, "LOCK TABLE "+strings.Join(copyTables, ", ")+" IN EXCLUSIVE MODE"); err != nil {
			return fmt.Errorf("store: copy: lock %s: %w", to.where, pgErr(err))
		}
		for _, t := range copyTables {
			var any bool
			if err := wtx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM "+t+")").Scan(&any); err != nil {
				return fmt.Errorf("store: copy: %s: %w", to.where, pgErr(err))
			}
			if any {
				return fmt.Errorf("store: copy to %s: table %s has rows: %w", to.where, t, ErrTargetNotEmpty)
			}
		}
		for _, t := range copyTables {
			n, err := copyTable(ctx, rtx, wtx, t)
			if err != nil {
				return fmt.Errorf("store: copy %s: %w", t, err)
			}
			out = append(out, CopyCount{Table: t, Rows: n})
		}
		// Each identity's sequence continues after the largest ID copied.
		rows, err = wtx.Query(ctx, `SELECT table_name, column_name FROM information_schema.columns
			WHERE table_schema = current_schema() AND is_identity = 'YES'`)
		if err != nil {
			return fmt.Errorf("store: copy: %w", pgErr(err))
		}
		idents, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([2]string, error) {
			var ic [2]string
			return ic, r.Scan(&ic[0], &ic[1])
		})
		if err != nil {
			return fmt.Errorf("store: copy: %w", pgErr(err))
		}
		for _, ic := range idents {
			t, c := pgx.Identifier{ic[0]}.Sanitize(), pgx.Identifier{ic[1]}.Sanitize()
			if _, err := wtx.Exec(ctx, `SELECT setval(pg_get_serial_sequence($1, $2), coalesce(max(`+c+`), 0) + 1, false) FROM `+t,
				ic[0], ic[1]); err != nil {
				return fmt.Errorf("store: copy: move the sequence of %s.%s: %w", ic[0], ic[1], pgErr(err))
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// copyTable copies table from the SQLite transaction to the PostgreSQL
// one: the columns are the target's (each must exist in the source, under
// the same name); SQLite's 0/1 integers become booleans where the target's
// column is one.
func copyTable(ctx context.Context, from *sql.Tx, to pgx.Tx, table string) (int64, error) {
	rows, err := to.Query(ctx, `SELECT column_name, data_type = 'boolean' FROM information_schema.columns
		WHERE table_schema = current_schema() AND table_name = $1 ORDER BY ordinal_position`, table)
	if err != nil {
		return 0, pgErr(err)
	}
	var (
		cols    []string
		boolean []bool
	)
	for rows.Next() {
		var (
			c string
			b bool
		)
		if err := rows.Scan(&c, &b); err != nil {
			rows.Close()
			return 0, pgErr(err)
		}
		cols, boolean = append(cols, c), append(boolean, b)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, pgErr(err)
	}
	src, err := from.QueryContext(ctx, "SELECT "+strings.Join(cols, ", ")+" FROM "+table)
	if err != nil {
		return 0, fmt.Errorf("read the source: %w", err)
	}
	defer src.Close()
	n, err := to.CopyFrom(ctx, pgx.Identifier{table}, cols, &sqliteRows{rows: src, boolean: boolean})
	if err != nil {
		return 0, pgErr(err)
	}
	return n, nil
}

// sqliteRows is a pgx.CopyFromSource over SQLite rows.
type sqliteRows struct {
	rows    *sql.Rows
	boolean []bool // columns to convert from 0/1
	err     error
}

func (r *sqliteRows) Next() bool { return r.err == nil && r.rows.Next() }

func (r *sqliteRows) Values() ([]any, error) {
	vals := make([]any, len(r.boolean))
	ptrs := make([]any, len(vals))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	if err := r.rows.Scan(ptrs...); err != nil {
		r.err = err
		return nil, err
	}
	for i, b := range r.boolean {
		if v, ok := vals[i].(int64); ok && b {
			vals[i] = v != 0
		}
	}
	return vals, nil
}

func (r *sqliteRows) Err() error {
	if r.err != nil {
		return r.err
	}
	return r.rows.Err()
}
