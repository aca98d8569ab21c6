-- corral schema version 6: an out-of-memory kill is recorded as such.
--
-- oom_killed is 1 for an entry with outcome 'signal' (SIGKILL) whose
-- command the kernel's OOM killer killed, 0 otherwise.

ALTER TABLE journal ADD COLUMN oom_killed INTEGER NOT NULL DEFAULT 0 CHECK (oom_killed IN (0, 1));
