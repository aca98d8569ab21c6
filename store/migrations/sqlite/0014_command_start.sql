-- corral schema version 14: a command's start in one statement.
--
-- Every command used to start with two writes: its lease created, then its
-- journal entry, each a statement and a commit of its own. Inserting into
-- the view command_start does both in one statement (CreateLease with
-- NewLease.Journal): the lease is inserted exactly as CreateLease inserts
-- it (its clock started by lease_clock_start), and the entry with it, so
-- that neither exists without the other. The entry's ID is chosen by the
-- statement (one more than the newest, under the write lock the statement
-- holds) and returned by it, as a trigger's insert cannot report its row.
-- A tenancy version other than the current one (schema 11) aborts the
-- statement, which then changed nothing.
CREATE VIEW command_start AS SELECT
	NULL AS id, NULL AS account, NULL AS project, NULL AS kind, NULL AS domain, NULL AS holder, NULL AS ttl_ms,
	NULL AS created_at, NULL AS tenancy, NULL AS journal, NULL AS journal_account, NULL AS journal_project,
	NULL AS journal_domain, NULL AS lease_kind, NULL AS argv, NULL AS limits, NULL AS started_at
	WHERE 0;

CREATE TRIGGER command_start_insert INSTEAD OF INSERT ON command_start
BEGIN
	SELECT RAISE(ABORT, 'corral: tenancy changed')
		WHERE NEW.tenancy IS NOT NULL AND NEW.tenancy IS NOT (SELECT v FROM tenancy_version WHERE id = 1);
	INSERT INTO leases (id, account, project, kind, domain, holder, state, ttl_ms, created_at, heartbeat_at, expires_at)
		VALUES (NEW.id, NEW.account, NEW.project, NEW.kind, NEW.domain, NEW.holder, 'live', NEW.ttl_ms,
			NEW.created_at, NEW.created_at, NEW.created_at + NEW.ttl_ms);
	INSERT INTO journal (id, account, project, domain, lease, lease_kind, argv, limits, started_at)
		VALUES (NEW.journal, NEW.journal_account, NEW.journal_project, NEW.journal_domain, NEW.id, NEW.lease_kind,
			NEW.argv, NEW.limits, NEW.started_at);
END;
