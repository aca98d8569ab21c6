package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	sqlite3 "modernc.org/sqlite/lib"
)

// Outcome says how a journaled command ended.
type Outcome string

const (
	// OutcomeExit: the command exited; JournalEntry.Code holds the status.
	OutcomeExit Outcome = "exit"
	// OutcomeSignal: the command was killed by JournalEntry.Signal.
	OutcomeSignal Outcome = "signal"
	// OutcomeError: RunCommand failed with a CommandError of ErrorKind.
	OutcomeError Outcome = "error"
	// OutcomeInterrupted: the command's end was never recorded (its process
	// died, or its lease expired under it).
	OutcomeInterrupted Outcome = "interrupted"
)

// Limits are a command's bounds as the journal records them.
type Limits struct {
	TimeoutMS int64 `json:"timeoutMs,omitempty"`
	Stdout    int64 `json:"stdout,omitempty"`
	Stderr    int64 `json:"stderr,omitempty"`
	Combined  int64 `json:"combined,omitempty"`
}

// JournalCommand is what the journal knows when a command starts.
type JournalCommand struct {
	Account   int64
	Project   int64
	Domain    string // the domain of the plugin the call was made under
	Lease     string
	LeaseKind string
	// Argv is the command line with secrets already redacted: the store
	// records it as given.
	Argv   []string
	Limits Limits
}

// JournalEnd is how a command ended. Exactly one of Code (with
// OutcomeExit), Signal (OutcomeSignal) and ErrorKind (OutcomeError) is set.
type JournalEnd struct {
	Outcome Outcome
	Code    *int
	Signal  string
	// OOMKilled accompanies Signal (SIGKILL) when the kernel's OOM
	// killer killed the command.
	OOMKilled   bool
	ErrorKind   string
	StdoutBytes int64
	StderrBytes int64
	Message     string
}

// JournalEntry is one row of the command journal.
type JournalEntry struct {
	ID int64
	JournalCommand
	Started time.Time
	Ended   time.Time // zero while running
	// End is the zero value (Outcome "") while the command runs.
	End JournalEnd
}

// The journal's statements of every command, prepared once per Store.
const (
	sqlJournalStart = `INSERT INTO journal (account, project, domain, lease, lease_kind, argv, limits, started_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?)`
	sqlJournalFinish = `UPDATE journal SET ended_at = ?, outcome = ?, code = ?, signal = ?, oom_killed = ?, error_kind = ?,
			stdout_bytes = ?, stderr_bytes = ?, message = ?
		WHERE id = ? AND outcome IS NULL`
)

// MaxJournalArgv bounds what a journal row keeps of a command's argv, in
// bytes (each argument counting 3 more, its JSON quotes and comma): an
// account sending commands with megabytes of arguments must not grow the
// database by as much per command. A longer argv is kept up to the bound
// and ends with an argument saying how much was not journaled.
const MaxJournalArgv = 16 << 10

// boundArgv returns argv cut to MaxJournalArgv (argv itself when it fits).
func boundArgv(argv []string) []string {
	n := 0
	for _, a := range argv {
		n += len(a) + 3
	}
	if n <= MaxJournalArgv {
		return argv
	}
	var out []string
	left := MaxJournalArgv
	for i, a := range argv {
		if len(a)+3 > left {
			if left > 3 {
				out = append(out, strings.ToValidUTF8(a[:left-3], ""))
			}
			out = append(out, fmt.Sprintf("[corral: argv of %d bytes cut at %d, %d arguments not journaled]", n, MaxJournalArgv, len(argv)-i-1))
			return out
		}
		out = append(out, a)
		left -= len(a) + 3
	}
	return out
}

func (s *sqliteStore) JournalStart(ctx context.Context, in JournalCommand) (int64, error) {
	argvJSON, limitsJSON, err := journalJSON(in)
	if err != nil {
		return 0, fmt.Errorf("store: journal start: %w", err)
	}
	r := s.exec(ctx, sqlJournalStart,
		in.Account, in.Project, in.Domain, in.Lease, in.LeaseKind, argvJSON, limitsJSON, ms(s.now()))
	if r.err != nil {
		return 0, fmt.Errorf("store: journal start: %w", r.err)
	}
	return r.lastID, nil
}

// journalJSON returns the argv (bounded) and limits columns of an entry.
func journalJSON(in JournalCommand) (argv, limits string, err error) {
	a := boundArgv(in.Argv)
	if a == nil {
		a = []string{}
	}
	argvJSON, err := json.Marshal(a)
	if err != nil {
		return "", "", err
	}
	limitsJSON, err := json.Marshal(in.Limits)
	if err != nil {
		return "", "", err
	}
	return string(argvJSON), string(limitsJSON), nil
}

func (s *sqliteStore) JournalFinish(ctx context.Context, id int64, end JournalEnd) error {
	code, err := end.check(id)
	if err != nil {
		return err
	}
	r := s.exec(ctx, sqlJournalFinish,
		ms(s.now()), string(end.Outcome), code, end.Signal, end.OOMKilled, end.ErrorKind,
		end.StdoutBytes, end.StderrBytes, end.Message, id)
	if r.err != nil {
		return fmt.Errorf("store: journal finish %d: %w", id, r.err)
	}
	if r.rows == 0 {
		return fmt.Errorf("store: journal finish %d: no running entry: %w", id, ErrNotFound)
	}
	return nil
}

// sqlCommandEnd releases a lease and finishes a journal entry in one
// statement (schema 13's command_end).
const sqlCommandEnd = `INSERT INTO command_end (lease, released_at, journal, outcome, code, signal, oom_killed, error_kind,
		stdout_bytes, stderr_bytes, message) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`

func (s *sqliteStore) ReleaseAndFinish(ctx context.Context, lease string, at time.Time, id int64, end JournalEnd) (journaled bool, err error) {
	code, err := end.check(id)
	if err != nil {
		return false, err
	}
	r := s.exec(ctx, sqlCommandEnd, lease, ms(at), id, string(end.Outcome), code, end.Signal, end.OOMKilled, end.ErrorKind,
		end.StdoutBytes, end.StderrBytes, end.Message)
	switch {
	case r.err == nil:
		return true, nil
	case sqliteCode(r.err) != sqlite3.SQLITE_CONSTRAINT_TRIGGER:
		return false, fmt.Errorf("store: release lease %s: %w", lease, r.err)
	}
	// Not releasable as it stood: find out why, as ReleaseHeldLease does.
	_, err = s.releaseSlow(ctx, lease, at)
	return false, err
}

// check validates the end of entry id and returns its code column.
func (e JournalEnd) check(id int64) (sql.NullInt64, error) {
	if err := e.validate(); err != nil {
		return sql.NullInt64{}, fmt.Errorf("store: journal finish %d: %w", id, err)
	}
	if e.Code == nil {
		return sql.NullInt64{}, nil
	}
	return sql.NullInt64{Int64: int64(*e.Code), Valid: true}, nil
}

func (e JournalEnd) validate() error {
	if e.OOMKilled && e.Outcome != OutcomeSignal {
		return fmt.Errorf("outcome %q carries no OOM kill", e.Outcome)
	}
	switch e.Outcome {
	case OutcomeExit:
		if e.Code == nil || e.Signal != "" || e.ErrorKind != "" {
			return fmt.Errorf("outcome %q needs a code and nothing else", e.Outcome)
		}
	case OutcomeSignal:
		if e.Signal == "" || e.Code != nil || e.ErrorKind != "" {
			return fmt.Errorf("outcome %q needs a signal and nothing else", e.Outcome)
		}
	case OutcomeError:
		if e.ErrorKind == "" || e.Code != nil || e.Signal != "" {
			return fmt.Errorf("outcome %q needs an error kind and nothing else", e.Outcome)
		}
	case OutcomeInterrupted:
		if e.Code != nil || e.Signal != "" || e.ErrorKind != "" {
			return fmt.Errorf("outcome %q carries no code, signal or error kind", e.Outcome)
		}
	default:
		return fmt.Errorf("invalid outcome %q", e.Outcome)
	}
	return nil
}

func (s *sqliteStore) JournalInterrupt(ctx context.Context, lease, message string) (int, error) {
	res, err := s.w.ExecContext(ctx,
		"UPDATE journal SET ended_at = ?, outcome = 'interrupted', message = ? WHERE lease = ? AND outcome IS NULL",
		ms(s.now()), message, lease)
	if err != nil {
		return 0, fmt.Errorf("store: journal interrupt lease %s: %w", lease, err)
	}
	n, _ := res.RowsAffected()
	return int(n), nil
}

func (s *sqliteStore) JournalInterruptReleased(ctx context.Context, before time.Time, message string) (int, error) {
	res, err := s.w.ExecContext(ctx, `UPDATE journal SET ended_at = ?, outcome = 'interrupted', message = ?
		WHERE outcome IS NULL AND EXISTS (SELECT 1 FROM leases l
			WHERE l.id = journal.lease AND l.state = 'released' AND l.released_at < ?)`,
		ms(s.now()), message, ms(before))
	if err != nil {
		return 0, fmt.Errorf("store: journal interrupt released: %w", err)
	}
	n, _ := res.RowsAffected()
	return int(n), nil
}

// JournalFilter selects journal entries; zero fields match everything.
type JournalFilter struct {
	Project int64
	Account int64
	// Lease selects a lease's entries. No index serves it alone (schema
	// 10 dropped it: every command paid for it, and no API lists by
	// lease): with Project, the project's entries are scanned; alone,
	// the journal.
	Lease string
	// Limit caps the number of entries (the newest are kept). If zero, 100.
	Limit int
}

func (s *sqliteStore) ListJournal(ctx context.Context, f JournalFilter) ([]JournalEntry, error) {
	q, args := journalQuery(f)
	rows, err := s.r.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("store: list journal: %w", err)
	}
	defer rows.Close()
	out, err := collect(rows, scanJournal)
	if err != nil {
		return nil, fmt.Errorf("store: list journal: %w", err)
	}
	return out, nil
}

// journalQuery returns ListJournal's query of f, with ? placeholders.
func journalQuery(f JournalFilter) (string, []any) {
	var (
		where []string
		args  []any
	)
	if f.Project != 0 {
		where, args = append(where, "project = ?"), append(args, f.Project)
	}
	if f.Account != 0 {
		where, args = append(where, "account = ?"), append(args, f.Account)
	}
	if f.Lease != "" {
		where, args = append(where, "lease = ?"), append(args, f.Lease)
	}
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	q := `SELECT id, account, project, domain, lease, lease_kind, argv, limits, started_at, ended_at,
		outcome, code, signal, oom_killed, error_kind, stdout_bytes, stderr_bytes, message FROM journal`
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	return q + " ORDER BY id DESC LIMIT ?", append(args, limit)
}

// scanJournal scans a row of journalQuery's.
func scanJournal(r scanner) (JournalEntry, error) {
	var (
		e            JournalEntry
		argv, limits string
		started      int64
		ended, code  sql.NullInt64
		outcome      sql.NullString
	)
	if err := r.Scan(&e.ID, &e.Account, &e.Project, &e.Domain, &e.Lease, &e.LeaseKind, &argv, &limits,
		&started, &ended, &outcome, &code, &e.End.Signal, &e.End.OOMKilled, &e.End.ErrorKind,
		&e.End.StdoutBytes, &e.End.StderrBytes, &e.End.Message); err != nil {
		return JournalEntry{}, err
	}
	if err := json.Unmarshal([]byte(argv), &e.Argv); err != nil {
		return JournalEntry{}, fmt.Errorf("journal %d argv: %w", e.ID, err)
	}
	if err := json.Unmarshal([]byte(limits), &e.Limits); err != nil {
		return JournalEntry{}, fmt.Errorf("journal %d limits: %w", e.ID, err)
	}
	e.Started, e.Ended = fromMS(started), fromNullMS(ended)
	e.End.Outcome = Outcome(outcome.String)
	if code.Valid {
		c := int(code.Int64)
		e.End.Code = &c
	}
	return e, nil
}

// Artifact is a file core created inside a managed machine and owns: it
// must be deleted when no longer needed.
type Artifact struct {
	ID      int64
	Project int64
	Path    string // the guest path
	Lease   string // the lease it was created under
	Created time.Time
	Deleted time.Time // zero while it exists
}

func (s *sqliteStore) RecordArtifact(ctx context.Context, project int64, path, lease string) (Artifact, error) {
	if path == "" {
		return Artifact{}, fmt.Errorf("store: record artifact: empty path")
	}
	a := Artifact{Project: project, Path: path, Lease: lease, Created: stamp(s.now)}
	err := s.w.QueryRowContext(ctx,
		"INSERT INTO artifacts (project, path, lease, created_at) VALUES (?, ?, ?, ?) RETURNING id",
		project, path, lease, ms(a.Created)).Scan(&a.ID)
	if err != nil {
		return Artifact{}, classify(err, fmt.Sprintf("record artifact in project %d", project))
	}
	return a, nil
}

func (s *sqliteStore) ListArtifacts(ctx context.Context, project int64, includeDeleted bool) ([]Artifact, error) {
	rows, err := s.r.QueryContext(ctx, artifactQuery(includeDeleted), project)
	if err != nil {
		return nil, fmt.Errorf("store: list artifacts: %w", err)
	}
	defer rows.Close()
	out, err := collect(rows, scanArtifact)
	if err != nil {
		return nil, fmt.Errorf("store: list artifacts: %w", err)
	}
	return out, nil
}

// artifactQuery returns ListArtifacts' query, whose one parameter is the
// project.
func artifactQuery(includeDeleted bool) string {
	q := "SELECT id, project, path, lease, created_at, deleted_at FROM artifacts WHERE project = ?"
	if !includeDeleted {
		q += " AND deleted_at IS NULL"
	}
	return q + " ORDER BY id"
}

func scanArtifact(r scanner) (Artifact, error) {
	var (
		a       Artifact
		created int64
		deleted sql.NullInt64
	)
	if err := r.Scan(&a.ID, &a.Project, &a.Path, &a.Lease, &created, &deleted); err != nil {
		return Artifact{}, err
	}
	a.Created, a.Deleted = fromMS(created), fromNullMS(deleted)
	return a, nil
}

func (s *sqliteStore) MarkArtifactDeleted(ctx context.Context, id int64) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		var deleted sql.NullInt64
		if err := tx.QueryRowContext(ctx, "SELECT deleted_at FROM artifacts WHERE id = ?", id).Scan(&deleted); err != nil {
			return classify(err, fmt.Sprintf("artifact %d", id))
		}
		if deleted.Valid {
			return nil
		}
		if _, err := tx.ExecContext(ctx, "UPDATE artifacts SET deleted_at = ? WHERE id = ?", ms(s.now()), id); err != nil {
			return fmt.Errorf("store: mark artifact %d deleted: %w", id, err)
		}
		return nil
	})
}
