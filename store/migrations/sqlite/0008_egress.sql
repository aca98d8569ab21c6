-- corral schema version 8 (egress): a project's
-- network policy and the journal of its machine's outbound connections.
--
-- egress_policies.policy is the policy as JSON ({"mode":"proxy","allow":[],
-- "deny":[]}), validated by package egress before it is stored; a project
-- without a row is mode none.
--
-- egress_log is an audit trail like the command journal: no foreign keys,
-- it survives its project. verdict is allowed, denied or failed; rule the
-- rule or reason that decided; addr the address dialed or refused.

CREATE TABLE egress_policies (
	project    INTEGER PRIMARY KEY REFERENCES projects(id) ON DELETE CASCADE,
	policy     TEXT    NOT NULL CHECK (json_valid(policy)),
	updated_at INTEGER NOT NULL
);

CREATE TABLE egress_log (
	id          INTEGER PRIMARY KEY AUTOINCREMENT,
	account     INTEGER NOT NULL,
	project     INTEGER NOT NULL,
	protocol    TEXT    NOT NULL,
	name        TEXT    NOT NULL,
	addr        TEXT    NOT NULL,
	port        INTEGER NOT NULL,
	verdict     TEXT    NOT NULL CHECK (verdict IN ('allowed', 'denied', 'failed')),
	rule        TEXT    NOT NULL,
	error       TEXT    NOT NULL,
	bytes_in    INTEGER NOT NULL,
	bytes_out   INTEGER NOT NULL,
	started_at  INTEGER NOT NULL,
	duration_ms INTEGER NOT NULL
);
CREATE INDEX egress_log_project ON egress_log(project, id);
