-- A signal never waits for a step in progress, and none is lost to a wait that
-- commits beside it (domain/workflow: SignalTx, LockTx, AdvanceTx).
--
-- The row locks: every transaction that moves a workflow (a step, a re-arm, a
-- cancel, a retry) holds its row FOR NO KEY UPDATE from its start to its end;
-- SignalTx holds it FOR KEY SHARE (as the foreign key of the signal's insert
-- would anyway). The two do not conflict, so a signal is stored while a step
-- runs, even one whose process is paused (SIGSTOP) in the middle of its
-- transaction. FOR UPDATE, the only mode that conflicts with FOR KEY SHARE, is
-- taken only here, at COMMIT.
--
-- That leaves the race the lock used to close: a step reads the inbox (nothing
-- yet) and commits a wait, while a signal is stored and looks for the waiting
-- job to wake before that job is committed. This barrier closes it. It runs at
-- the COMMIT of every transaction that moved a workflow to a signal wait, or to
-- a status that refuses signals (cancelling, completed, failed, cancelled):
--   1. it takes the row FOR UPDATE, so the COMMIT first waits for every signal
--      in flight (each holds FOR KEY SHARE) to commit or roll back;
--   2. then, in a statement of its own (a snapshot taken after that wait), it
--      makes the waiting job due now when a signal the wait names is in the
--      inbox, unconsumed: one committed before the step looked, or while it
--      ran, or during the wait of 1. (A wait's job is scheduled for its
--      deadline, or an hour out; one due within jobs.ScheduledAfter is
--      inserted available, due at that deadline.)
-- A signal that takes its FOR KEY SHARE after 1 waits for the COMMIT to end,
-- and then sees the committed wait and wakes the job itself (SignalTx's second
-- statement). Either way one of the two sees the other, in any interleaving.
-- The barrier is part of COMMIT, run by the server: a client paused before its
-- COMMIT holds only FOR NO KEY UPDATE, and one paused after sending it cannot
-- stop the server from finishing it, so no signal ever waits on a paused
-- process.
--
-- For the statuses that refuse signals it makes the answer exact: a signal in
-- flight when a workflow finishes (or starts its compensation) commits before
-- the finish, accepted into the inbox of a workflow that had not finished (and
-- is never consumed, like any signal a workflow does not await again); one that
-- comes after waits for the finish and is refused (CONFLICT).
--
-- Its lock wait is bounded by the transaction's statement_timeout (when no
-- lock_timeout is set): the server disarms statement_timeout before COMMIT, and
-- a sender that keeps its transaction open after signalling must fail the step's
-- COMMIT (the step is retried) rather than hold it, and its locks, for ever. A
-- step must not SET CONSTRAINTS ALL IMMEDIATE: the barrier would then run at its
-- UPDATE, and hold FOR UPDATE until its COMMIT.
--
-- River's clock for the woken job is its created_at: River's column default,
-- the start of the transaction that inserted it (this one), so it is due at
-- once; this function reads no clock.
CREATE FUNCTION compute_workflow_signal_barrier() RETURNS trigger
    LANGUAGE plpgsql
    AS $body$
DECLARE
    w record;
BEGIN
    IF current_setting('lock_timeout') = '0' THEN
        PERFORM set_config('lock_timeout', current_setting('statement_timeout'), true);
    END IF;
    SELECT id, status, wait, job_id INTO w FROM compute_workflows WHERE id = NEW.id FOR UPDATE;
    IF w.status = 'waiting' AND w.wait ? 'signal' THEN
        UPDATE river_job j SET state = 'available', scheduled_at = j.created_at
        WHERE j.id = w.job_id
          AND (j.state = 'scheduled' OR (j.state = 'available' AND j.scheduled_at > j.created_at))
          AND EXISTS (SELECT 1 FROM compute_workflow_signals s
                      WHERE s.workflow_id = w.id AND s.name = w.wait->>'signal' AND s.consumed_at IS NULL);
    END IF;
    RETURN NULL;
END
$body$;

CREATE CONSTRAINT TRIGGER compute_workflow_signal_barrier
    AFTER UPDATE ON compute_workflows
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    WHEN (NEW.wait ? 'signal' OR NEW.status IN ('cancelling', 'completed', 'failed', 'cancelled'))
    EXECUTE FUNCTION compute_workflow_signal_barrier();
