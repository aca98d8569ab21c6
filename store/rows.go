package store

import (
	"database/sql"
	"errors"
	"fmt"
	"time"

	sqlite3 "modernc.org/sqlite/lib"
)

// The constraint violations classify tells apart, on either backend.
const (
	violationNone = iota
	violationUnique
	violationForeignKey
)

// violation returns what constraint err violated, from SQLite's extended
// result code or PostgreSQL's SQLSTATE.
func violation(err error) int {
	switch sqliteCode(err) {
	case sqlite3.SQLITE_CONSTRAINT_UNIQUE, sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY:
		return violationUnique
	case sqlite3.SQLITE_CONSTRAINT_FOREIGNKEY:
		return violationForeignKey
	}
	switch pgCode(err) {
	case "23505": // unique_violation
		return violationUnique
	case "23503": // foreign_key_violation
		return violationForeignKey
	}
	return violationNone
}

// classify maps constraint violations to the package's sentinels, wrapping
// the driver error so both remain visible; a lost PostgreSQL connection
// also matches ErrUnavailable.
func classify(err error, what string) error {
	switch violation(err) {
	case violationUnique:
		return &constraintError{msg: fmt.Sprintf("store: %s: already exists", what), class: ErrExists, cause: err}
	case violationForeignKey:
		return &constraintError{msg: fmt.Sprintf("store: %s: a row it refers to does not exist", what), class: ErrNotFound, cause: err}
	}
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("store: %s: %w", what, ErrNotFound)
	}
	return fmt.Errorf("store: %s: %w", what, pgErr(err))
}

// classifyExists is classify for an insert whose uniqueness violation
// means subject exists already: its message is `subject already exists`.
func classifyExists(err error, subject, what string) error {
	if violation(err) == violationUnique {
		return &constraintError{msg: subject + " already exists", class: ErrExists, cause: err}
	}
	return classify(err, what)
}

// constraintError is a constraint violation said for people: its message
// names what conflicted, never SQLite's text; it unwraps to its class
// (ErrExists, ErrNotFound) and to SQLite's error.
type constraintError struct {
	msg   string
	class error
	cause error
}

func (e *constraintError) Error() string   { return e.msg }
func (e *constraintError) Unwrap() []error { return []error{e.class, e.cause} }

func ms(t time.Time) int64 { return t.UnixMilli() }

func fromMS(v int64) time.Time { return time.UnixMilli(v) }

func fromNullMS(v sql.NullInt64) time.Time {
	if !v.Valid {
		return time.Time{}
	}
	return time.UnixMilli(v.Int64)
}

// scanner is a row of either backend: *sql.Row, *sql.Rows, pgx.Row,
// pgx.Rows.
type scanner interface{ Scan(dest ...any) error }

// rowSet is a result of either backend: *sql.Rows or pgx.Rows.
type rowSet interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

// collect scans every row of rows with scan. The caller closes rows.
func collect[T any](rows rowSet, scan func(scanner) (T, error)) ([]T, error) {
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// stamp returns the current time of clock now at the stored precision.
func stamp(now func() time.Time) time.Time { return fromMS(ms(now())) }
