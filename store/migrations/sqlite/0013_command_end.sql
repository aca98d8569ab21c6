-- corral schema version 13: a command's end in one statement.
--
-- A command that exited used to end with two writes: its lease released,
-- then its journal entry finished, each a statement and a commit of its
-- own (and the second paid again for reaching SQLite). Inserting into the
-- view command_end does both in one statement (ReleaseAndFinish): the
-- lease is released exactly as ReleaseHeldLease's statement releases it,
-- and only if it was released is the entry finished. A lease that is not
-- releasable (released, expired, overdue, unknown) aborts the statement,
-- which then changed nothing; the caller learns why as ReleaseHeldLease
-- would tell it, and journals the end on its own.
CREATE VIEW command_end AS SELECT
	NULL AS lease, NULL AS released_at, NULL AS journal, NULL AS outcome, NULL AS code, NULL AS signal,
	NULL AS oom_killed, NULL AS error_kind, NULL AS stdout_bytes, NULL AS stderr_bytes, NULL AS message
	WHERE 0;

CREATE TRIGGER command_end_insert INSTEAD OF INSERT ON command_end
BEGIN
	UPDATE leases SET state = 'released', released_at = NEW.released_at,
			(heartbeat_at, expires_at) = (SELECT c.expires_at - c.ttl_ms, c.expires_at FROM lease_clock c WHERE c.seq = leases.seq)
		WHERE id = NEW.lease AND state = 'live'
		  AND (SELECT c.expires_at FROM lease_clock c WHERE c.seq = leases.seq) >= NEW.released_at;
	SELECT RAISE(ABORT, 'corral: lease not released') WHERE changes() = 0;
	UPDATE journal SET ended_at = NEW.released_at, outcome = NEW.outcome, code = NEW.code, signal = NEW.signal,
			oom_killed = NEW.oom_killed, error_kind = NEW.error_kind, stdout_bytes = NEW.stdout_bytes,
			stderr_bytes = NEW.stderr_bytes, message = NEW.message
		WHERE id = NEW.journal AND outcome IS NULL;
END;
