-- corral schema version 5 (take the next free number when merging; the lead planned 0007): whether a host project's confined commands may
-- use the host's network (0: they run without one, the default).
-- Managed projects ignore it.

ALTER TABLE projects ADD COLUMN network INTEGER NOT NULL DEFAULT 0 CHECK (network IN (0, 1));
