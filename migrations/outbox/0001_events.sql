-- The event log (seed 000, "The outbox"). Producers append rows in their own
-- transaction (domain/outbox.Append); txid is that transaction's id and seq a
-- sequence number. Commit order is not seq order, so every reader reads
--
--     WHERE txid < pg_snapshot_xmin(pg_current_snapshot())
--       AND (txid, seq) > ($cursor_txid, $cursor_seq)
--     ORDER BY txid, seq
--
-- by the columns themselves (never a text form of txid): every transaction below
-- the snapshot's xmin has ended, so no row can later commit behind a cursor. The
-- primary key is the (txid, seq) index that keeps a read proportional to its
-- batch: the scan starts at the cursor and stops at the limit or at xmin.
CREATE TABLE compute_events (
    txid       xid8 NOT NULL DEFAULT pg_current_xact_id(),
    seq        bigint GENERATED ALWAYS AS IDENTITY,
    topic      text NOT NULL CHECK (topic <> '' AND length(topic) <= 200),
    key        text NOT NULL DEFAULT '' CHECK (length(key) <= 512),
    payload    jsonb NOT NULL DEFAULT 'null',
    created_at timestamptz NOT NULL DEFAULT compute_now(),
    PRIMARY KEY (txid, seq)
);

-- Sinks: named consumers of the event log, each with its own cursor (the last
-- (txid, seq) it has delivered) and its own lease, sink/<name> in compute_leases.
-- Delivery advances the cursor only after the sink's handler returned, in a
-- transaction fenced by that lease. job_id is the sink's one live delivery job
-- (River, queue better_compute); a new one is started only when it has none.
-- reset_gen goes up at every operator reset, so a delivery that read before a
-- reset cannot move the cursor after it (even back to the same place).
-- Retention deletes only rows every cursor here has passed.
CREATE TABLE compute_sinks (
    name          text PRIMARY KEY CHECK (name ~ '^[a-z][a-z0-9_.-]{0,62}$'),
    cursor_txid   xid8 NOT NULL DEFAULT '0',
    cursor_seq    bigint NOT NULL DEFAULT 0,
    reset_gen     bigint NOT NULL DEFAULT 0,
    paused        boolean NOT NULL DEFAULT false,
    job_id        bigint,
    delivered     bigint NOT NULL DEFAULT 0,  -- events handed to the handler and committed
    delivered_at  timestamptz,                -- last cursor advance
    failures      integer NOT NULL DEFAULT 0, -- consecutive failed deliveries
    last_error    text,
    last_error_at timestamptz,
    created_at    timestamptz NOT NULL DEFAULT compute_now(),
    updated_at    timestamptz NOT NULL DEFAULT compute_now()
);
