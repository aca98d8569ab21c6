-- corral schema version 15: a command's end finishes only its own lease's
-- journal entry.
--
-- command_end (schema 13) finished the entry NEW.journal whatever lease it
-- recorded: given another command's entry ID (a caller's mistake, or a
-- context carrying another command's journal intent), releasing one
-- account's lease wrote its outcome into another account's running entry.
-- The entry must now also be the released lease's; otherwise nothing is
-- journaled and the caller, told so, journals the end on its own.
DROP TRIGGER command_end_insert;
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
		WHERE id = NEW.journal AND lease = NEW.lease AND outcome IS NULL;
END;
