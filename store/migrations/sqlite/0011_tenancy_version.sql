-- corral schema version 11: a version of the tenancy tables.
--
-- Every command reads its project and the actor's membership before
-- anything else (GetProjectMember), a read that cost about as much as one
-- of the command's writes. Store.CachedTenancy keeps those rows in memory
-- instead, with the version below as of their read, and the command's lease
-- is inserted only if the version is still that one (CreateLease with
-- NewLease.TenancyVersion): a membership revoked, a trust withdrawn or a
-- project changed by any process bumps the version in the same transaction,
-- so the next lease under an older read is refused and the preparation
-- reads again. The version is global, not per project: tenancy changes are
-- rare, and a bump costs each cached entry one refused insert.
CREATE TABLE tenancy_version (
	id INTEGER PRIMARY KEY CHECK (id = 1),
	v  INTEGER NOT NULL
);
INSERT INTO tenancy_version (id, v) VALUES (1, 1);

-- Foreign key actions (an account's deletion removing its memberships, a
-- project's its members) fire these triggers too.
CREATE TRIGGER tenancy_member_insert AFTER INSERT ON members
BEGIN
	UPDATE tenancy_version SET v = v + 1;
END;
CREATE TRIGGER tenancy_member_update AFTER UPDATE ON members
BEGIN
	UPDATE tenancy_version SET v = v + 1;
END;
CREATE TRIGGER tenancy_member_delete AFTER DELETE ON members
BEGIN
	UPDATE tenancy_version SET v = v + 1;
END;
CREATE TRIGGER tenancy_project_update AFTER UPDATE ON projects
BEGIN
	UPDATE tenancy_version SET v = v + 1;
END;
CREATE TRIGGER tenancy_project_delete AFTER DELETE ON projects
BEGIN
	UPDATE tenancy_version SET v = v + 1;
END;
