-- corral schema version 3: what a managed project's machine is built from.
--
-- image names the image of the machine's root filesystem ('base' is the
-- embedded default, made from the host's /usr); the limit columns override
-- the worker's defaults for the machine (0: the default, negative: none):
-- memory and disk and tmp in bytes, pids in tasks, cpu_millis in
-- thousandths of a CPU. Host projects ignore them.

ALTER TABLE projects ADD COLUMN image TEXT NOT NULL DEFAULT 'base' CHECK (image <> '');
ALTER TABLE projects ADD COLUMN limit_memory INTEGER NOT NULL DEFAULT 0;
ALTER TABLE projects ADD COLUMN limit_pids INTEGER NOT NULL DEFAULT 0;
ALTER TABLE projects ADD COLUMN limit_cpu_millis INTEGER NOT NULL DEFAULT 0;
ALTER TABLE projects ADD COLUMN limit_disk INTEGER NOT NULL DEFAULT 0;
ALTER TABLE projects ADD COLUMN limit_tmp INTEGER NOT NULL DEFAULT 0;
CREATE INDEX projects_image ON projects(image);
