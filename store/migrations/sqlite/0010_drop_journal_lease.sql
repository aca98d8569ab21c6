-- corral schema version 10: the journal's index by lease, dropped.
--
-- Both paths that look a lease's entries up among the running ones (a lease
-- expired: JournalInterrupt; a lease released by a process that died:
-- JournalInterruptReleased) are served by journal_running (schema 9), the
-- partial index of running entries. journal_lease, over every entry ever
-- journaled, served only a listing by lease, which nothing on the command
-- path makes; keeping it cost every JournalStart an index insert (51 → 42 µs
-- of CPU per start without it, store BenchmarkJournal).

DROP INDEX journal_lease;
