-- corral schema version 5: reserved for another change of issue 15 (a
-- placeholder on the limits branch, replaced by that change's migration
-- when merged). It changes nothing.
SELECT 1;
