-- corral schema version 3: reserved.
--
-- Version 3 is the projects' image and limits columns, built on another
-- branch. This placeholder keeps the migration sequence contiguous on the
-- branch that added version 4; it is replaced by the real 0003 when the two
-- meet (delete this file then).
SELECT 1;
