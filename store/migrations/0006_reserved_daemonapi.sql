-- Placeholder (branch sites): the number is reserved for another branch's
-- migration; the lead drops this file and renumbers 0008 at merge.
SELECT 1;
