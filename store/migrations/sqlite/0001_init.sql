-- corral schema version 1.
-- Times are unix milliseconds (INTEGER); NULL means "not yet".

CREATE TABLE accounts (
	id         INTEGER PRIMARY KEY AUTOINCREMENT,
	name       TEXT    NOT NULL UNIQUE CHECK (name <> ''),
	created_at INTEGER NOT NULL
);

-- Bearer tokens. Only the SHA-256 (hex) of a token is stored, never the token.
CREATE TABLE tokens (
	id           INTEGER PRIMARY KEY AUTOINCREMENT,
	account      INTEGER NOT NULL REFERENCES accounts(id) ON DELETE CASCADE,
	hash         TEXT    NOT NULL UNIQUE CHECK (length(hash) = 64),
	name         TEXT    NOT NULL,
	created_at   INTEGER NOT NULL,
	last_used_at INTEGER,
	revoked_at   INTEGER
);
CREATE INDEX tokens_account ON tokens(account);

CREATE TABLE projects (
	id         INTEGER PRIMARY KEY AUTOINCREMENT,
	kind       TEXT    NOT NULL CHECK (kind IN ('managed', 'host')),
	name       TEXT    NOT NULL UNIQUE CHECK (name <> ''),
	root       TEXT    NOT NULL CHECK (root <> ''),
	created_at INTEGER NOT NULL
);

CREATE TABLE members (
	project    INTEGER NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
	account    INTEGER NOT NULL REFERENCES accounts(id) ON DELETE CASCADE,
	role       TEXT    NOT NULL CHECK (role IN ('owner', 'member')),
	trusted    INTEGER NOT NULL DEFAULT 0 CHECK (trusted IN (0, 1)),
	created_at INTEGER NOT NULL,
	PRIMARY KEY (project, account)
) WITHOUT ROWID;
CREATE INDEX members_account ON members(account);

-- Leases. account is the actor's AccountUserID and deliberately has no foreign
-- key: embedders may run commands for accounts the daemon's table does not
-- hold. A lease's row is written when it is created and when it ends; while
-- it is live, its expiry lives in lease_clock instead.
CREATE TABLE leases (
	seq          INTEGER PRIMARY KEY,
	id           TEXT    NOT NULL UNIQUE,
	account      INTEGER NOT NULL,
	project      INTEGER NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
	kind         TEXT    NOT NULL CHECK (kind <> ''),
	domain       TEXT    NOT NULL,
	holder       TEXT    NOT NULL,
	state        TEXT    NOT NULL CHECK (state IN ('live', 'released', 'expired')),
	ttl_ms       INTEGER NOT NULL CHECK (ttl_ms > 0),
	created_at   INTEGER NOT NULL,
	heartbeat_at INTEGER NOT NULL, -- final values once the lease ended;
	expires_at   INTEGER NOT NULL, -- while it is live, see lease_clock
	released_at  INTEGER,
	expired_at   INTEGER
);
CREATE INDEX leases_project ON leases(project, state);
CREATE INDEX leases_state ON leases(state);

-- The expiry of every live lease, and nothing else: a lease has a row here
-- exactly while its state is 'live'. Heartbeats rewrite only this table,
-- whose rows are a few bytes each, so ten thousand live leases fit in a few
-- dozen pages and a batch of heartbeats writes few pages. No index covers
-- expires_at: a sweep scans these few pages instead.
CREATE TABLE lease_clock (
	seq        INTEGER PRIMARY KEY REFERENCES leases(seq) ON DELETE CASCADE,
	expires_at INTEGER NOT NULL,
	ttl_ms     INTEGER NOT NULL
);

-- The command journal: one row per command. It is an audit trail, so it keeps
-- no foreign keys and survives the deletion of its project.
CREATE TABLE journal (
	id           INTEGER PRIMARY KEY AUTOINCREMENT,
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
	message      TEXT    NOT NULL DEFAULT ''
);
CREATE INDEX journal_project ON journal(project, id);
CREATE INDEX journal_lease ON journal(lease);

-- Files core created inside a managed machine (export bundles, ...) and must
-- delete later.
CREATE TABLE artifacts (
	id         INTEGER PRIMARY KEY AUTOINCREMENT,
	project    INTEGER NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
	path       TEXT    NOT NULL CHECK (path <> ''),
	lease      TEXT    NOT NULL,
	created_at INTEGER NOT NULL,
	deleted_at INTEGER
);
CREATE INDEX artifacts_project ON artifacts(project, deleted_at);
