-- corral schema version 7: Sites publications, persisted.
--
-- A name is published by one project at a time (the primary key); its rows
-- go with the project. owner is the account that published it and, like
-- leases.account, has no foreign key: the publication outlives the
-- account's removal (the project's members still manage it).

CREATE TABLE site_publications (
	name       TEXT    PRIMARY KEY CHECK (name <> ''),
	project    INTEGER NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
	port       INTEGER NOT NULL CHECK (port BETWEEN 1 AND 65535),
	owner      INTEGER NOT NULL,
	created_at INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX site_publications_project ON site_publications(project);
