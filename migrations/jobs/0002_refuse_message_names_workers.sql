-- The refusal of a fenced job outside the shard queues names the function an
-- application inserts it with, which moved from package jobs to package
-- workers (workers.InsertForKeyTx). Only the message changes.
CREATE OR REPLACE FUNCTION compute_refuse_stranded_job() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM compute_fenced_kinds WHERE kind = NEW.kind) THEN
        RAISE EXCEPTION 'job kind % is fenced (worked only in shard queues, under the shard''s lease), so it cannot go to queue %, which no worker works: insert it with workers.InsertForKeyTx, whose key picks its shard queue',
            NEW.kind, NEW.queue USING ERRCODE = '22023';
    END IF;
    RETURN NEW;
END
$$;
