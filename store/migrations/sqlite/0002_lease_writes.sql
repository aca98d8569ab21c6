-- corral schema version 2: cheaper lease writes.
--
-- Every command creates a lease and releases it, and every page a write
-- touches is one more WAL frame at commit. Version 1 kept two indexes that
-- changed on each release (leases_state, and the state half of
-- leases_project) and wrote lease_clock with a second statement. Now:
--
-- * lease_clock also holds the project of each live lease, so counting a
--   project's live leases reads this small table alone, and no index of
--   leases involves the state: a release rewrites the lease's row and
--   nothing else of leases.
-- * Triggers keep the invariant "a lease has a lease_clock row exactly while
--   its state is live", so that creating or ending a lease is a single
--   statement (and a single-statement write needs no explicit transaction).

DROP INDEX leases_state;
DROP INDEX leases_project;
-- Still needed: deleting a project deletes its leases (ON DELETE CASCADE).
CREATE INDEX leases_project ON leases(project);

CREATE TABLE lease_clock_v2 (
	seq        INTEGER PRIMARY KEY REFERENCES leases(seq) ON DELETE CASCADE,
	expires_at INTEGER NOT NULL,
	ttl_ms     INTEGER NOT NULL,
	project    INTEGER NOT NULL
);
INSERT INTO lease_clock_v2 (seq, expires_at, ttl_ms, project)
	SELECT c.seq, c.expires_at, c.ttl_ms, l.project FROM lease_clock c JOIN leases l ON l.seq = c.seq;
DROP TABLE lease_clock;
ALTER TABLE lease_clock_v2 RENAME TO lease_clock;

-- A new live lease starts its clock.
CREATE TRIGGER lease_clock_start AFTER INSERT ON leases WHEN NEW.state = 'live'
BEGIN
	INSERT INTO lease_clock (seq, expires_at, ttl_ms, project)
		VALUES (NEW.seq, NEW.expires_at, NEW.ttl_ms, NEW.project);
END;

-- A lease that stops being live (released or expired) stops its clock.
-- Whoever ends it copies the clock's final values into the row first.
CREATE TRIGGER lease_clock_stop AFTER UPDATE OF state ON leases
	WHEN OLD.state = 'live' AND NEW.state <> 'live'
BEGIN
	DELETE FROM lease_clock WHERE seq = NEW.seq;
END;
