-- Fenced job kinds: the kinds an application registered with workers.AddWorker,
-- worked only in shard queues (shard_<n>) under the shard's lease. A job of such
-- a kind inserted into any other queue would wait for ever (no worker works
-- River's default queue), so the insert is refused, whatever path it takes
-- (jobs.InsertTx, a River client, SQL). migrate and every worker start record
-- the kinds of the binary's registry.
CREATE TABLE compute_fenced_kinds (
    kind text PRIMARY KEY,
    recorded_at timestamptz NOT NULL DEFAULT compute_now()
);

CREATE FUNCTION compute_refuse_stranded_job() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM compute_fenced_kinds WHERE kind = NEW.kind) THEN
        RAISE EXCEPTION 'job kind % is fenced (worked only in shard queues, under the shard''s lease), so it cannot go to queue %, which no worker works: insert it with jobs.InsertForKeyTx, whose key picks its shard queue',
            NEW.kind, NEW.queue USING ERRCODE = '22023';
    END IF;
    RETURN NEW;
END
$$;

-- Shard queues need no look-up: the WHEN clause keeps the hot path (DirtyTx,
-- InsertForKeyTx) free of the trigger.
CREATE TRIGGER compute_refuse_stranded_job
    BEFORE INSERT OR UPDATE OF queue ON river_job
    FOR EACH ROW WHEN (left(NEW.queue, 6) <> 'shard_')
    EXECUTE FUNCTION compute_refuse_stranded_job();
