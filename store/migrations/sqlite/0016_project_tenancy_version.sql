-- corral schema version 16: the tenancy version is per project.
--
-- Schema 11's version was global: any project or membership change, in
-- any project, bumped it, so a tenant adding and removing members of its
-- own project in a loop made every other tenant's next command pay a
-- refused lease insert and a fresh read (and, past the retries, an
-- unchecked one). Each project now carries its own version, bumped by
-- every change to its row and to its members' rows (a foreign key action
-- too: an account's deletion removing its memberships bumps each project
-- concerned), and a command's lease is checked against its own project's
-- version only. Versions only grow: an update of a project's row that
-- does not raise its version raises it by one.
DROP TRIGGER tenancy_member_insert;
DROP TRIGGER tenancy_member_update;
DROP TRIGGER tenancy_member_delete;
DROP TRIGGER tenancy_project_update;
DROP TRIGGER tenancy_project_delete;
DROP TABLE tenancy_version;

ALTER TABLE projects ADD COLUMN tenancy_version INTEGER NOT NULL DEFAULT 1;

CREATE TRIGGER tenancy_member_insert AFTER INSERT ON members
BEGIN
	UPDATE projects SET tenancy_version = tenancy_version + 1 WHERE id = NEW.project;
END;
CREATE TRIGGER tenancy_member_update AFTER UPDATE ON members
BEGIN
	UPDATE projects SET tenancy_version = tenancy_version + 1 WHERE id IN (OLD.project, NEW.project);
END;
CREATE TRIGGER tenancy_member_delete AFTER DELETE ON members
BEGIN
	UPDATE projects SET tenancy_version = tenancy_version + 1 WHERE id = OLD.project;
END;
-- The guard keeps the trigger's own update from firing it again, should
-- recursive triggers be on.
CREATE TRIGGER tenancy_project_update AFTER UPDATE ON projects
	WHEN NEW.tenancy_version <= OLD.tenancy_version
BEGIN
	UPDATE projects SET tenancy_version = OLD.tenancy_version + 1 WHERE id = NEW.id;
END;
-- A deleted project has no version: a lease checked against one is refused.

DROP TRIGGER command_start_insert;
CREATE TRIGGER command_start_insert INSTEAD OF INSERT ON command_start
BEGIN
	SELECT RAISE(ABORT, 'corral: tenancy changed')
		WHERE NEW.tenancy IS NOT NULL AND NEW.tenancy IS NOT (SELECT tenancy_version FROM projects WHERE id = NEW.project);
	INSERT INTO leases (id, account, project, kind, domain, holder, state, ttl_ms, created_at, heartbeat_at, expires_at)
		VALUES (NEW.id, NEW.account, NEW.project, NEW.kind, NEW.domain, NEW.holder, 'live', NEW.ttl_ms,
			NEW.created_at, NEW.created_at, NEW.created_at + NEW.ttl_ms);
	INSERT INTO journal (id, account, project, domain, lease, lease_kind, argv, limits, started_at)
		VALUES (NEW.journal, NEW.journal_account, NEW.journal_project, NEW.journal_domain, NEW.id, NEW.lease_kind,
			NEW.argv, NEW.limits, NEW.started_at);
END;
