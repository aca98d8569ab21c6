package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"modernc.org/sqlite"
)

// The SQLite backend: one SQLite file (through modernc.org/sqlite, no cgo) in WAL mode,
// shared by every corral process on the machine: the daemon and each runner
// open the same file and see each other's rows. Within a process, writes go
// through a single connection, so they queue in Go instead of spinning on
// SQLite's busy handler, and the hot single-statement writes of commands
// (a command's lease created with its journal entry, and released with the
// entry finished: one statement each) that queued meanwhile are
// committed together, in one transaction (a write whose context ends
// while it waits returns the context's error and makes no change); reads
// use a small pool of read-only connections and never wait for a writer. Between processes, writers wait for each other for
// up to Options.BusyTimeout, and every write transaction takes the write lock
// when it begins (BEGIN IMMEDIATE), so two processes never deadlock upgrading
// a read transaction.
//
// Commits are synchronous=NORMAL in WAL mode: a committed write (a lease
// created or released) survives a crash of any process at once; a power
// loss or kernel crash may undo the last commits before a checkpoint, but
// never corrupts the database.

// sqliteStore is the SQLite backend of Store.
type sqliteStore struct {
	path string
	now  func() time.Time
	w    *sql.DB // one read-write connection
	r    *sql.DB // read-only connections

	// Prepared statements of the hot paths (leases, the journal, tenancy),
	// by SQL text. SQLite parsing costs more than executing these.
	stmtMu sync.Mutex
	wStmts map[string]*sql.Stmt
	rStmts map[string]*sql.Stmt

	wr  writer   // the group commit of the hot writes (exec)
	raw rawStmts // its batches' statements (runBatch)

	tenancy tenancyCache // CachedTenancy's reads
	egress  egressPruner // AppendEgress's retention
}

// openSQLite opens (and with opts.Migrate, creates and migrates) the
// SQLite database at path. On error nothing stays open. The database file
// and its -wal and -shm files are given mode FileMode (0600) whatever the
// umask, including files an older version left more open.
func openSQLite(ctx context.Context, path string, opts Options) (*sqliteStore, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	want := LatestVersion()
	if !opts.Migrate {
		// Do not let SQLite create the file: a missing database is an
		// un-migrated one.
		if _, err := os.Stat(abs); errors.Is(err, os.ErrNotExist) {
			return nil, &SchemaError{Path: abs, Have: 0, Want: want}
		}
	}
	busy := opts.BusyTimeout
	if busy <= 0 {
		busy = DefaultBusyTimeout
	}
	readConns := opts.ReadConns
	if readConns <= 0 {
		readConns = 4
	}
	s := &sqliteStore{path: abs, now: opts.Now, wStmts: map[string]*sql.Stmt{}, rStmts: map[string]*sql.Stmt{}}
	if s.now == nil {
		s.now = time.Now
	}

	mode := "rw"
	if opts.Migrate {
		mode = "rwc"
		// The database holds every account's secrets: create it 0600
		// before SQLite would (0644 less the umask). SQLite gives its -wal
		// and -shm files the database file's mode.
		f, err := os.OpenFile(abs, os.O_RDWR|os.O_CREATE, FileMode)
		if err != nil {
			return nil, fmt.Errorf("store: create %s: %w", abs, err)
		}
		f.Close()
	}
	if err := restrictFiles(abs); err != nil {
		return nil, err
	}
	base := (&url.URL{Scheme: "file", Path: abs}).String()
	common := "&_pragma=busy_timeout(" + strconv.FormatInt(busy.Milliseconds(), 10) + ")" +
		"&_pragma=foreign_keys(1)&_pragma=synchronous(NORMAL)"

	// wal_autocheckpoint: the commit that makes the WAL reach this many
	// pages checkpoints, and waits for two fsyncs (a few ms). SQLite's
	// default, 1000 pages, is every 100 or so commands, each of which
	// writes 10 or so pages, so 1 % of commands stalled: at their p99. With
	// 4000 (a WAL of up to 16 MiB) it is a quarter as many stalls, for
	// about as much work each, as the hot pages are the same. Durability
	// is unchanged (a commit is in the WAL either way).
	s.w, err = sql.Open("sqlite", base+"?mode="+mode+common+"&_pragma=journal_mode(WAL)&_txlock=immediate"+
		"&_pragma=wal_autocheckpoint("+strconv.Itoa(walAutoCheckpoint)+")")
	if err != nil {
		return nil, fmt.Errorf("store: open %s: %w", abs, err)
	}
	s.w.SetMaxOpenConns(1)
	s.w.SetMaxIdleConns(1)
	s.w.SetConnMaxLifetime(0)
	s.w.SetConnMaxIdleTime(0)
	// Switching a new database to WAL takes an exclusive lock, for which
	// SQLite does not always wait (busy_timeout): several processes
	// creating the database at once may see SQLITE_BUSY. Retry, within the
	// busy timeout.
	for deadline := time.Now().Add(busy); ; {
		err := s.w.PingContext(ctx)
		if err == nil {
			break
		}
		if !isBusy(err) || time.Now().After(deadline) || ctx.Err() != nil {
			s.w.Close()
			return nil, fmt.Errorf("store: open %s: %w", abs, err)
		}
		time.Sleep(10 * time.Millisecond)
	}

	if err := restrictFiles(abs); err != nil { // -wal and -shm now exist
		s.w.Close()
		return nil, err
	}
	if opts.Migrate {
		if err := s.migrate(ctx); err != nil {
			s.w.Close()
			return nil, err
		}
	} else {
		have, err := s.userVersion(ctx)
		if err != nil {
			s.w.Close()
			return nil, err
		}
		if have != want {
			s.w.Close()
			return nil, &SchemaError{Path: abs, Have: have, Want: want}
		}
	}

	// Readers never write: query_only makes an accidental write fail
	// instead of contending for the write lock.
	s.r, err = sql.Open("sqlite", base+"?mode=rw"+common+"&_pragma=query_only(1)")
	if err != nil {
		s.w.Close()
		return nil, fmt.Errorf("store: open %s: %w", abs, err)
	}
	s.r.SetMaxOpenConns(readConns)
	s.r.SetMaxIdleConns(readConns)
	if err := s.r.PingContext(ctx); err != nil {
		s.r.Close()
		s.w.Close()
		return nil, fmt.Errorf("store: open %s: %w", abs, err)
	}
	if err := s.prepareHot(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// FileMode is the mode of the database file and of its -wal and -shm
// files, whatever the umask: Open creates the database with it and sets it
// on all three where they exist and are another mode.
const FileMode os.FileMode = 0o600

// restrictFiles gives the database, -wal and -shm files FileMode.
func restrictFiles(db string) error {
	for _, p := range []string{db, db + "-wal", db + "-shm"} {
		st, err := os.Stat(p)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("store: %w", err)
		}
		if st.Mode().Perm() != FileMode {
			if err := os.Chmod(p, FileMode); err != nil {
				return fmt.Errorf("store: %w", err)
			}
		}
	}
	return nil
}

// walAutoCheckpoint is the writer's wal_autocheckpoint, in pages.
const walAutoCheckpoint = 4000

func (s *sqliteStore) Close() error {
	s.stmtMu.Lock()
	for _, m := range []map[string]*sql.Stmt{s.wStmts, s.rStmts} {
		for q, st := range m {
			st.Close()
			delete(m, q)
		}
	}
	s.stmtMu.Unlock()
	s.closeRaw()
	return errors.Join(s.r.Close(), s.w.Close())
}

// prepareHot prepares the hot statements on both handles. It runs in Open,
// before any transaction holds the single write connection.
func (s *sqliteStore) prepareHot(ctx context.Context) error {
	for _, set := range []struct {
		db    *sql.DB
		m     map[string]*sql.Stmt
		stmts []string
	}{{s.w, s.wStmts, hotWriteStmts}, {s.r, s.rStmts, hotReadStmts}} {
		for _, q := range set.stmts {
			st, err := set.db.PrepareContext(ctx, q)
			if err != nil {
				return fmt.Errorf("store: prepare: %w", err)
			}
			set.m[q] = st
		}
	}
	return nil
}

// txStmt returns q bound to tx: the statement prepared in Open if q is a
// hot one, else q prepared on tx for this transaction only.
func (s *sqliteStore) txStmt(ctx context.Context, tx *sql.Tx, q string) (*sql.Stmt, error) {
	s.stmtMu.Lock()
	st := s.wStmts[q]
	s.stmtMu.Unlock()
	if st != nil {
		return tx.StmtContext(ctx, st), nil
	}
	st, err := tx.PrepareContext(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("store: prepare: %w", err)
	}
	return st, nil
}

// readStmt returns the read statement q, prepared on the read connections
// (in Open if it is a hot one, else now and kept).
func (s *sqliteStore) readStmt(ctx context.Context, q string) (*sql.Stmt, error) {
	return s.stmt(ctx, s.r, s.rStmts, q)
}

// writeStmt returns the statement q, prepared on the write connection (in
// Open if it is a hot one, else now and kept), to run on its own: a single
// statement is a transaction of its own. It must not be called inside tx,
// which holds the write connection (use txStmt there).
func (s *sqliteStore) writeStmt(ctx context.Context, q string) (*sql.Stmt, error) {
	return s.stmt(ctx, s.w, s.wStmts, q)
}

func (s *sqliteStore) stmt(ctx context.Context, db *sql.DB, m map[string]*sql.Stmt, q string) (*sql.Stmt, error) {
	s.stmtMu.Lock()
	st := m[q]
	s.stmtMu.Unlock()
	if st != nil {
		return st, nil
	}
	st, err := db.PrepareContext(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("store: prepare: %w", err)
	}
	s.stmtMu.Lock()
	if old := m[q]; old != nil {
		st.Close()
		st = old
	} else {
		m[q] = st
	}
	s.stmtMu.Unlock()
	return st, nil
}

func (s *sqliteStore) Path() string { return s.path }

func (s *sqliteStore) Now() time.Time { return s.now() }

func (s *sqliteStore) SchemaVersion(ctx context.Context) (int, error) { return s.userVersion(ctx) }

func (s *sqliteStore) userVersion(ctx context.Context) (int, error) {
	var v int
	if err := s.w.QueryRowContext(ctx, "PRAGMA user_version").Scan(&v); err != nil {
		return 0, fmt.Errorf("store: read schema version: %w", err)
	}
	return v, nil
}

// tx runs fn in a write transaction (BEGIN IMMEDIATE) and commits it if fn
// returns nil.
func (s *sqliteStore) tx(ctx context.Context, fn func(*sql.Tx) error) error {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: begin: %w", err)
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("store: commit: %w", err)
	}
	return nil
}

// sqliteCode returns the extended SQLite result code of err, or 0.
func sqliteCode(err error) int {
	var se *sqlite.Error
	if errors.As(err, &se) {
		return se.Code()
	}
	return 0
}

// isBusy reports whether err is SQLite's "database is locked".
func isBusy(err error) bool {
	switch sqliteCode(err) & 0xff {
	case 5, 6: // SQLITE_BUSY, SQLITE_LOCKED
		return true
	}
	return strings.Contains(err.Error(), "SQLITE_BUSY")
}
