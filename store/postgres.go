package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The PostgreSQL backend.
//
// One pool of connections (pgxpool, bounded by Options.MaxConns, each
// connection dialled within Options.ConnectTimeout) serves every method.
// Each method is one statement, which PostgreSQL runs as a transaction of
// its own, or one explicit transaction where it must read before it
// writes. Over a connection, pgx prepares a statement once and then runs
// it in one round trip: a command's start and its end are one round trip
// each.
//
// Concurrency is PostgreSQL's, READ COMMITTED, with row locks where a race
// matters:
//
//   - a command's lease is inserted only while its project's row, locked
//     FOR SHARE by the insert, still has the tenancy version the command's
//     decision was taken at: a concurrent change of the project, of a
//     membership or of the egress policy (which raises the version) either
//     commits first, and the insert sees the new version and is refused, or
//     waits for the insert to commit, and then finds its lease;
//   - DeleteProject locks the project's row FOR UPDATE before it counts
//     the live leases, so no lease is inserted between the count and the
//     deletion (the lease insert's foreign key check waits for the lock);
//   - statements that end a lease (release, expiry) lock its lease_clock
//     row first and its leases row second, in that order everywhere, and
//     delete the clock row: of a release and a sweep racing for one lease,
//     the second finds no clock and does nothing.
//
// The SQLite backend's group commit (batch.go) has no counterpart here: it
// exists because SQLite has one writer, whose every commit rewrites the
// WAL pages the statements share. PostgreSQL takes concurrent writers on
// as many connections, and flushes the WAL of commits that arrive together
// with one fsync of its own (group commit in the server); batching
// callers' statements into one transaction in the client would make each
// wait for the others and let one failure abort them all (or cost a
// SAVEPOINT round trip each).

// MigrationLockID is the key of the PostgreSQL advisory lock that
// migrations take (pg_advisory_xact_lock, in the migration's transaction):
// daemons starting together on one database migrate one after the other,
// and each migration applies once.
const MigrationLockID int64 = 0x636f7272616c // "corral"

// pgStore is the PostgreSQL backend of Store.
type pgStore struct {
	where string // the URL, redacted
	pool  *pgxpool.Pool
	now   func() time.Time

	tenancy tenancyCache
	egress  egressPruner
}

// Pool bounds besides Options'.
const (
	pgMaxConnLifetime  = 30 * time.Minute
	pgMaxConnIdleTime  = 5 * time.Minute
	pgHealthCheck      = 15 * time.Second
	pgIdleInTxTimeout  = time.Minute // a stuck client's transaction ends, and its locks with it
	pgApplicationName  = "corral"
	pgDefaultMigrateTO = time.Minute
)

// openPostgres opens the PostgreSQL database conn names (a URL or
// keyword/value string, with libpq's environment variables and passfile).
func openPostgres(ctx context.Context, conn string, opts Options) (*pgStore, error) {
	where := Redact(conn)
	cfg, err := pgxpool.ParseConfig(conn)
	if err != nil {
		// pgx's message may quote the string: say ours instead.
		return nil, fmt.Errorf("store: %s: invalid PostgreSQL connection string", where)
	}
	maxConns := opts.MaxConns
	if maxConns <= 0 {
		maxConns = DefaultMaxConns
	}
	cfg.MaxConns = int32(maxConns)
	cfg.MinConns = 0
	cfg.MaxConnLifetime, cfg.MaxConnIdleTime, cfg.HealthCheckPeriod = pgMaxConnLifetime, pgMaxConnIdleTime, pgHealthCheck
	if opts.ConnectTimeout > 0 {
		cfg.ConnConfig.ConnectTimeout = opts.ConnectTimeout
	} else if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = DefaultConnectTimeout
	}
	busy := opts.BusyTimeout
	if busy <= 0 {
		busy = DefaultBusyTimeout
	}
	rp := cfg.ConnConfig.RuntimeParams
	rp["lock_timeout"] = strconv.FormatInt(busy.Milliseconds(), 10)
	rp["idle_in_transaction_session_timeout"] = strconv.FormatInt(pgIdleInTxTimeout.Milliseconds(), 10)
	if rp["application_name"] == "" {
		rp["application_name"] = pgApplicationName
	}
	if testHookPoolConfig != nil {
		testHookPoolConfig(cfg)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("store: %s: %w", where, pgErr(err))
	}
	s := &pgStore{where: where, pool: pool, now: opts.Now}
	if s.now == nil {
		s.now = time.Now
	}
	if opts.Migrate {
		err = s.migrate(ctx)
	} else {
		err = s.checkVersion(ctx)
	}
	if err != nil {
		pool.Close()
		return nil, err
	}
	return s, nil
}

// testHookPoolConfig, if set (by tests), sees each pool's configuration
// before the pool is made.
var testHookPoolConfig func(*pgxpool.Config)

// migrate applies the pending migrations in one transaction that holds
// the migration lock.
func (s *pgStore) migrate(ctx context.Context) error {
	all := loadMigrations(SchemePostgres)
	return s.tx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", MigrationLockID); err != nil {
			return fmt.Errorf("store: %s: take the migration lock: %w", s.where, pgErr(err))
		}
		have, err := pgSchemaVersion(ctx, tx)
		if err != nil {
			return fmt.Errorf("store: %s: %w", s.where, err)
		}
		latest := all[len(all)-1].version
		switch {
		case have > latest || (have != 0 && have < all[0].version):
			return &SchemaError{Path: s.where, Have: have, Want: latest}
		case have == latest:
			return nil
		}
		if have == 0 {
			if _, err := tx.Exec(ctx, "CREATE TABLE corral_schema (version bigint NOT NULL)"); err != nil {
				return fmt.Errorf("store: %s: create corral_schema: %w", s.where, pgErr(err))
			}
			if _, err := tx.Exec(ctx, "INSERT INTO corral_schema (version) VALUES (0)"); err != nil {
				return fmt.Errorf("store: %s: create corral_schema: %w", s.where, pgErr(err))
			}
		}
		for _, m := range pending(all, have) {
			// No parameters: the simple protocol runs a file of several
			// statements.
			if _, err := tx.Exec(ctx, m.sql, pgx.QueryExecModeSimpleProtocol); err != nil {
				return fmt.Errorf("store: %s: migration %s: %w", s.where, m.name, pgErr(err))
			}
		}
		if _, err := tx.Exec(ctx, "UPDATE corral_schema SET version = $1", latest); err != nil {
			return fmt.Errorf("store: %s: set schema version: %w", s.where, pgErr(err))
		}
		return nil
	})
}

// pgSchemaVersion reads the schema version: 0 where corral_schema does
// not exist.
func pgSchemaVersion(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) (int, error) {
	var exists bool
	if err := q.QueryRow(ctx, "SELECT to_regclass('corral_schema') IS NOT NULL").Scan(&exists); err != nil {
		return 0, fmt.Errorf("read schema version: %w", pgErr(err))
	}
	if !exists {
		return 0, nil
	}
	var v int
	if err := q.QueryRow(ctx, "SELECT version FROM corral_schema").Scan(&v); err != nil {
		return 0, fmt.Errorf("read schema version: %w", pgErr(err))
	}
	return v, nil
}

func (s *pgStore) checkVersion(ctx context.Context) error {
	have, err := s.SchemaVersion(ctx)
	if err != nil {
		return err
	}
	if want := LatestVersion(); have != want {
		return &SchemaError{Path: s.where, Have: have, Want: want}
	}
	return nil
}

func (s *pgStore) SchemaVersion(ctx context.Context) (int, error) {
	v, err := pgSchemaVersion(ctx, s.pool)
	if err != nil {
		return 0, fmt.Errorf("store: %s: %w", s.where, err)
	}
	return v, nil
}

func (s *pgStore) Close() error {
	s.pool.Close()
	return nil
}

func (s *pgStore) Path() string { return "" }

func (s *pgStore) Now() time.Time { return s.now() }

// tx runs fn in a transaction and commits it if fn returns nil.
func (s *pgStore) tx(ctx context.Context, fn func(pgx.Tx) error) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("store: begin: %w", pgErr(err))
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("store: commit: %w", pgErr(err))
	}
	return nil
}

// pgErr classifies a driver error: a connection that could not be made or
// broke is also ErrUnavailable; any other error is returned as it is.
func pgErr(err error) error {
	if err == nil || errors.Is(err, ErrUnavailable) {
		return err
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch {
		case strings.HasPrefix(pe.Code, "08"), // connection exception
			strings.HasPrefix(pe.Code, "57P"), // operator intervention: shutdown, crash
			pe.Code == "53300":                // too many connections
			return fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		return err
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) || pgconn.Timeout(err) && !errors.Is(err, context.DeadlineExceeded) || pgconn.SafeToRetry(err) || isClosedConn(err) {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return err
}

// isClosedConn reports whether err is a connection's end met during a
// call (the server went away: EOF, reset).
func isClosedConn(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	msg := err.Error()
	for _, m := range []string{"unexpected EOF", "connection reset", "broken pipe", "conn closed", "connection refused", "no such file or directory"} {
		if strings.Contains(msg, m) {
			return true
		}
	}
	return false
}

// pgCode returns the SQLSTATE of err, or "".
func pgCode(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}
