-- corral schema version 4: permissions that are not membership.
--
-- accounts.host_paths: an admin granted the account the use of host paths
-- (host projects, managed projects copied from a host directory), which the
-- daemon also has to permit as a whole (--allow-host-paths).
--
-- projects.export_remotes: the remotes a project may be exported to, as
-- newline-separated patterns narrowing the daemon's (--export-remote); ''
-- means the daemon's list alone.

ALTER TABLE accounts ADD COLUMN host_paths INTEGER NOT NULL DEFAULT 0 CHECK (host_paths IN (0, 1));
ALTER TABLE projects ADD COLUMN export_remotes TEXT NOT NULL DEFAULT '';
