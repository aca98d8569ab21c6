package store

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
)

// Group commit of the hot single-statement writes, on SQLite. (The
// PostgreSQL backend has none: see postgres.go for why.)
//
// Every command writes two single statements (its lease created with its
// journal entry, schema 14; its lease released with the entry finished,
// schema 13; until then four), each a transaction of its own on the one
// write connection. A WAL commit costs more than such a
// statement: it writes every page the statement dirtied to the WAL, and
// takes and drops the WAL's locks. When many commands run at once, their
// statements queue for the connection anyway; exec runs the queued ones
// together, in one transaction, so that a page many of them dirty (the end
// of an index, the journal's last page) is written once per batch.
//
//	caller ─ exec ─┬─ connection free (not busy) ─→ runs its statement alone, as before
//	               └─ busy ─→ queues; waits
//	the runner, done ─┬─ queue empty ─→ not busy
//	                  └─ else takes the queue, hands it to its first caller ─→
//	                     BEGIN IMMEDIATE; each statement; COMMIT; answers each
//
// A lone statement therefore takes no extra step. In a batch, a statement
// that fails with a constraint violation (or another error SQLite reports
// before or instead of writing) is undone alone and fails its caller only:
// SQLite's default conflict resolution, ABORT, undoes the failed statement's
// changes and keeps the transaction. Any other error may have ended the
// transaction, and fails every caller of the batch whose statement had not
// already failed. The batched statements must therefore never resolve
// conflicts with ROLLBACK, nor fire a trigger that does: none of the
// package's does. (A SAVEPOINT and RELEASE around each statement would
// isolate it whatever the error, and were measured: at 64 writers they
// cost 16 µs of CPU per command of four writes, a quarter more than the
// batched writes themselves, and at 8 writers 35 µs, a quarter more too.)

// writer is the state of the group commit. Its zero value is ready.
type writer struct {
	mu    sync.Mutex
	busy  bool        // a statement or batch of exec is running
	queue []*writeReq // waiting, in arrival order
	spare []*writeReq // an emptied queue, to reuse
}

// The states of a writeReq. A queued request either is cancelled by its
// caller or taken into a batch, never both.
const (
	reqQueued int32 = iota
	reqTaken
	reqCancelled
)

// writeReq is one statement waiting in the queue.
type writeReq struct {
	ctx   context.Context
	q     string    // st's SQL
	st    *sql.Stmt // q prepared on the write connection
	query bool      // q returns one row of one integer (execQuery)
	args  []any
	state atomic.Int32
	// wake receives once: when the request's result is set, or when it is
	// handed batch to run.
	wake  chan struct{}
	batch []*writeReq

	res execResult
}

// execResult is what a caller of exec needs of its statement.
type execResult struct {
	rows   int64 // RowsAffected
	lastID int64 // LastInsertId
	err    error
}

func resultOf(res sql.Result, err error) execResult {
	if err != nil {
		return execResult{err: err}
	}
	// The driver computed both as the statement ended: neither fails.
	rows, err := res.RowsAffected()
	if err != nil {
		return execResult{err: err}
	}
	id, err := res.LastInsertId()
	if err != nil {
		return execResult{err: err}
	}
	return execResult{rows: rows, lastID: id}
}

// hot returns the context a hot statement (one row's write or read, on a
// prepared statement) runs with: ctx without its cancellation, or ctx's
// error if it has already ended. The driver (modernc.org/sqlite) watches
// the cancellable context of every statement with a goroutine of its own
// and sets SQLite's progress handler for it, which costs more than such a
// statement itself: a command's four writes, with a 5 s deadline on each
// context, took 218-253 µs of CPU against 163-175 µs with none (store
// BenchmarkCommandContext). Such a statement is not worth interrupting:
// its only wait is for another process's write lock, which
// Options.BusyTimeout bounds.
func hot(ctx context.Context) (context.Context, error) {
	if ctx.Done() == nil {
		return ctx, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return context.WithoutCancel(ctx), nil
}

// exec runs q, a statement prepared on the write connection, with args, as
// a transaction of its own or within a batch of other callers' statements.
// Either way it is committed when exec returns nil (and its effects are
// undone when it returns an error).
//
// Cancellation: a caller whose ctx ends while its statement waits in the
// queue returns ctx.Err() at once, and the statement never runs. Once the
// statement is taken into a batch, exec waits for the batch: the statement
// is then skipped (the result is ctx.Err(), nothing written) if ctx ended
// before its turn came, else run and committed or not as the batch is, and
// exec returns that outcome, whatever ctx became meanwhile. A statement run
// alone runs if ctx has not ended when its turn comes, and then to its end
// (see hot). In every case an error from ctx means the statement's write
// was not made.
//
// Busy handling is unchanged: a batch's BEGIN IMMEDIATE waits for another
// process's write lock up to the busy timeout, as a lone statement does.
func (s *sqliteStore) exec(ctx context.Context, q string, args ...any) execResult {
	return s.write(ctx, q, false, args)
}

// execQuery is exec for a statement that returns one row of one integer
// (INSERT ... RETURNING): the result's lastID is that integer.
func (s *sqliteStore) execQuery(ctx context.Context, q string, args ...any) execResult {
	return s.write(ctx, q, true, args)
}

// runStmt runs st alone with args.
func runStmt(ctx context.Context, st *sql.Stmt, query bool, args []any) execResult {
	if !query {
		return resultOf(st.ExecContext(ctx, args...))
	}
	var v int64
	if err := st.QueryRowContext(ctx, args...).Scan(&v); err != nil {
		return execResult{err: err}
	}
	return execResult{rows: 1, lastID: v}
}

func (s *sqliteStore) write(ctx context.Context, q string, query bool, args []any) execResult {
	st, err := s.writeStmt(ctx, q)
	if err != nil {
		return execResult{err: err}
	}
	w := &s.wr
	w.mu.Lock()
	if !w.busy {
		w.busy = true
		w.mu.Unlock()
		var r execResult
		if hctx, err := hot(ctx); err != nil {
			r = execResult{err: err}
		} else {
			r = runStmt(hctx, st, query, args)
		}
		s.handOff()
		return r
	}
	// A copy of args, so that the caller's stays on its stack on the path
	// above.
	req := &writeReq{ctx: ctx, q: q, st: st, query: query, args: append([]any(nil), args...), wake: make(chan struct{}, 1)}
	w.queue = append(w.queue, req)
	w.mu.Unlock()

	select {
	case <-req.wake:
	case <-ctx.Done():
		if req.state.CompareAndSwap(reqQueued, reqCancelled) {
			// The runner drops it from the queue.
			return execResult{err: ctx.Err()}
		}
		<-req.wake // taken: wait for the outcome
	}
	if req.batch != nil {
		s.runBatch(req.batch)
		s.handOff()
	}
	return req.res
}

// handOff ends a run: it passes the queued requests to the first of them,
// which runs them, or marks the writer idle if none is left.
func (s *sqliteStore) handOff() {
	w := &s.wr
	for {
		w.mu.Lock()
		q := w.queue
		if len(q) == 0 {
			w.busy = false
			w.mu.Unlock()
			return
		}
		w.queue, w.spare = w.spare[:0], nil
		w.mu.Unlock()

		var batch []*writeReq
		for i, r := range q {
			if r.state.CompareAndSwap(reqQueued, reqTaken) {
				batch = append(batch, r)
			}
			q[i] = nil
		}
		w.mu.Lock()
		if w.spare == nil {
			w.spare = q[:0]
		}
		w.mu.Unlock()
		if len(batch) > 0 {
			batch[0].batch = batch
			batch[0].wake <- struct{}{}
			return
		}
		// Every one was cancelled: look again.
	}
}

// testHookBatch, if set (by tests), runs as a batch of n > 1 statements
// begins, before any of them runs.
var testHookBatch func(n int)

// runBatch runs the statements of batch, which its first request's caller
// runs, and answers every other request.
func (s *sqliteStore) runBatch(batch []*writeReq) {
	defer func() {
		for _, r := range batch[1:] {
			r.wake <- struct{}{}
		}
	}()
	if len(batch) == 1 {
		r := batch[0]
		if hctx, err := hot(r.ctx); err != nil {
			r.res = execResult{err: err}
		} else {
			r.res = runStmt(hctx, r.st, r.query, r.args)
		}
		return
	}
	if testHookBatch != nil {
		testHookBatch(len(batch))
	}
	// The batch is its callers' together: no one caller's context ends it.
	// Each statement checks its own caller's context before it runs.
	ctx := context.Background()
	conn, err := s.w.Conn(ctx)
	if err != nil {
		for _, r := range batch {
			r.res = execResult{err: fmt.Errorf("store: begin: %w", err)}
		}
		return
	}
	defer conn.Close()
	// The transaction runs on the driver's connection, with statements
	// prepared on it once (BEGIN and COMMIT among them): a database/sql
	// transaction starts a goroutine to watch its context, and parses
	// BEGIN and COMMIT each time, which cost a batch of two more than two
	// commits of their own (store BenchmarkBatchTx). conn keeps every
	// other user of the write connection out meanwhile.
	err = conn.Raw(func(dc any) error {
		run := func(q string, args []any) execResult { return s.runRaw(ctx, dc, q, false, args) }
		if r := run("BEGIN IMMEDIATE", nil); r.err != nil {
			for _, req := range batch {
				req.res = execResult{err: fmt.Errorf("store: begin: %w", r.err)}
			}
			return nil
		}
		for _, r := range batch {
			if err := r.ctx.Err(); err != nil {
				r.res = execResult{err: err}
				continue
			}
			r.res = s.runRaw(ctx, dc, r.q, r.query, r.args)
			if r.res.err != nil && !statementLevel(r.res.err) {
				// The error may have ended the transaction: the batch
				// fails. (ROLLBACK fails if SQLite ended it already.)
				run("ROLLBACK", nil)
				s.failBatch(batch, r, fmt.Errorf("store: batch aborted by another statement: %w", r.res.err))
				return nil
			}
		}
		if r := run("COMMIT", nil); r.err != nil {
			// A failed COMMIT may leave the transaction open: end it, so
			// that the connection's next user is not inside it.
			run("ROLLBACK", nil)
			s.failBatch(batch, nil, fmt.Errorf("store: commit: %w", r.err))
		}
		return nil
	})
	if err != nil { // conn was closed under it: nothing ran
		for _, r := range batch {
			r.res = execResult{err: fmt.Errorf("store: batch: %w", err)}
		}
	}
}

// rawStmts are the batch's statements prepared on the driver's write
// connection, used only inside its Raw (which the write connection's
// exclusive use orders), and dropped if the connection changes.
type rawStmts struct {
	dc any
	m  map[string]driver.Stmt
}

// runRaw runs q with args on dc, the driver's write connection, inside
// runBatch's transaction.
func (s *sqliteStore) runRaw(ctx context.Context, dc any, q string, query bool, args []any) execResult {
	st, err := s.rawStmt(dc, q)
	if err != nil {
		return execResult{err: err}
	}
	nv, err := namedValues(args)
	if err != nil {
		return execResult{err: err}
	}
	if !query {
		ec, ok := st.(driver.StmtExecContext)
		if !ok {
			return execResult{err: errors.New("store: driver statement cannot execute with a context")}
		}
		return resultOf(ec.ExecContext(ctx, nv))
	}
	qc, ok := st.(driver.StmtQueryContext)
	if !ok {
		return execResult{err: errors.New("store: driver statement cannot query with a context")}
	}
	rows, err := qc.QueryContext(ctx, nv)
	if err != nil {
		return execResult{err: err}
	}
	defer rows.Close()
	dest := make([]driver.Value, 1)
	if err := rows.Next(dest); err != nil {
		if err == io.EOF {
			err = sql.ErrNoRows
		}
		return execResult{err: err}
	}
	v, ok := dest[0].(int64)
	if !ok {
		return execResult{err: fmt.Errorf("store: statement returned %T, not an integer", dest[0])}
	}
	return execResult{rows: 1, lastID: v}
}

// rawStmt returns q prepared on dc, the driver's write connection.
func (s *sqliteStore) rawStmt(dc any, q string) (driver.Stmt, error) {
	rs := &s.raw
	if rs.dc != dc {
		// A new connection (database/sql replaced a broken one): the old
		// one's statements went with it.
		rs.dc, rs.m = dc, map[string]driver.Stmt{}
	}
	st := rs.m[q]
	if st == nil {
		pc, ok := dc.(driver.ConnPrepareContext)
		if !ok {
			return nil, errors.New("store: driver cannot prepare with a context")
		}
		var err error
		if st, err = pc.PrepareContext(context.Background(), q); err != nil {
			return nil, fmt.Errorf("store: prepare: %w", err)
		}
		rs.m[q] = st
	}
	return st, nil
}

// closeRaw closes the raw statements (as the Store closes).
func (s *sqliteStore) closeRaw() {
	conn, err := s.w.Conn(context.Background())
	if err != nil {
		return
	}
	defer conn.Close()
	_ = conn.Raw(func(dc any) error {
		if s.raw.dc == dc {
			for _, st := range s.raw.m {
				st.Close()
			}
		}
		s.raw = rawStmts{}
		return nil
	})
}

// namedValues converts args as database/sql does for a driver without a
// converter of its own.
func namedValues(args []any) ([]driver.NamedValue, error) {
	nv := make([]driver.NamedValue, len(args))
	for i, a := range args {
		v, err := driver.DefaultParameterConverter.ConvertValue(a)
		if err != nil {
			return nil, fmt.Errorf("store: argument %d: %w", i+1, err)
		}
		nv[i] = driver.NamedValue{Ordinal: i + 1, Value: v}
	}
	return nv, nil
}

// failBatch sets the result of every request of batch that succeeded or was
// yet to run to err. The others keep their own error: their statement was
// undone or skipped either way.
func (s *sqliteStore) failBatch(batch []*writeReq, failed *writeReq, err error) {
	for _, r := range batch {
		if r != failed && r.res.err == nil {
			r.res = execResult{err: err}
		}
	}
}

// statementLevel reports whether err, from a statement inside a
// transaction, undid that statement alone and left the transaction open:
// a constraint violation (SQLite's default ABORT resolution), or an error
// found before the statement wrote anything.
func statementLevel(err error) bool {
	switch sqliteCode(err) & 0xff {
	case 19, // SQLITE_CONSTRAINT
		20, // SQLITE_MISMATCH
		25, // SQLITE_RANGE
		18, // SQLITE_TOOBIG
		1:  // SQLITE_ERROR (a RAISE(ABORT), a bad parameter)
		return true
	}
	return false
}
