-- corral schema version 17: a project's egress policy is part of its
-- tenancy version.
--
-- Every managed command's session read its project's egress policy, a
-- read of its own. The policy is now read with the project and the
-- membership (the tenancy read, which CachedTenancy keeps in memory), and
-- every change to it bumps the project's tenancy version (schema 16), so a
-- command's lease, checked against that version, is refused when the
-- policy changed since its read: a policy tightened by any process applies
-- to the next command. A policy deleted with its project bumps nothing (the
-- project has no version left to check).
CREATE TRIGGER egress_policy_insert AFTER INSERT ON egress_policies
BEGIN
	UPDATE projects SET tenancy_version = tenancy_version + 1 WHERE id = NEW.project;
END;
CREATE TRIGGER egress_policy_update AFTER UPDATE ON egress_policies
BEGIN
	UPDATE projects SET tenancy_version = tenancy_version + 1 WHERE id IN (OLD.project, NEW.project);
END;
CREATE TRIGGER egress_policy_delete AFTER DELETE ON egress_policies
BEGIN
	UPDATE projects SET tenancy_version = tenancy_version + 1 WHERE id = OLD.project;
END;
