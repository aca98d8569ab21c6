-- corral schema version 9: the journal's running entries, indexed.
--
-- A process killed between releasing a command's lease and recording the
-- command's end leaves an entry that no lease expiry will ever close (its
-- lease is released, not expired). The lease reconciler closes such
-- entries (JournalInterruptReleased) on every sweep; this partial index
-- keeps that a look at the few running entries, not a scan of the journal.

CREATE INDEX journal_running ON journal(lease) WHERE outcome IS NULL;
