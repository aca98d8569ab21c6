-- corral schema version 12: the journal's IDs without AUTOINCREMENT.
--
-- AUTOINCREMENT made every JournalStart also rewrite the journal's row of
-- sqlite_sequence: one more page written to the WAL per command, of about
-- twelve. Its only promise over a plain INTEGER PRIMARY KEY is that an ID
-- is never reused after the newest row is deleted, and no journal row is
-- ever deleted (it is an audit trail): a new entry's ID is still one more
-- than the newest's. The table is rebuilt with the same columns, rows and
-- IDs.
CREATE TABLE journal_v12 (
	id           INTEGER PRIMARY KEY,
	account      INTEGER NOT NULL,
	project      INTEGER NOT NULL,
	domain       TEXT    NOT NULL,
	lease        TEXT    NOT NULL,
	lease_kind   TEXT    NOT NULL,
	argv         TEXT    NOT NULL,  -- JSON array of strings, secrets redacted by the caller
	limits       TEXT    NOT NULL,  -- JSON object
	started_at   INTEGER NOT NULL,
	ended_at     INTEGER,
	outcome      TEXT    CHECK (outcome IN ('exit', 'signal', 'error', 'interrupted')),
	code         INTEGER,
	signal       TEXT    NOT NULL DEFAULT '',
	error_kind   TEXT    NOT NULL DEFAULT '',
	stdout_bytes INTEGER NOT NULL DEFAULT 0,
	stderr_bytes INTEGER NOT NULL DEFAULT 0,
	message      TEXT    NOT NULL DEFAULT '',
	oom_killed   INTEGER NOT NULL DEFAULT 0 CHECK (oom_killed IN (0, 1))
);
INSERT INTO journal_v12 (id, account, project, domain, lease, lease_kind, argv, limits, started_at, ended_at,
		outcome, code, signal, error_kind, stdout_bytes, stderr_bytes, message, oom_killed)
	SELECT id, account, project, domain, lease, lease_kind, argv, limits, started_at, ended_at,
		outcome, code, signal, error_kind, stdout_bytes, stderr_bytes, message, oom_killed FROM journal;
DROP TABLE journal;
ALTER TABLE journal_v12 RENAME TO journal;
CREATE INDEX journal_project ON journal(project, id);
CREATE INDEX journal_running ON journal(lease) WHERE outcome IS NULL;
