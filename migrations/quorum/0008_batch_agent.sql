-- quorum/0008_batch_agent: record the agent that proposed a batch (a service, an
-- operator, an automated planner), so every applied change can be traced to who
-- asked for it. Batches proposed before this migration read 'unknown'; new ones
-- must name their agent (no default).
ALTER TABLE quorum_batches
    ADD COLUMN agent text NOT NULL DEFAULT 'unknown' CHECK (agent <> '' AND length(agent) <= 200);
ALTER TABLE quorum_batches ALTER COLUMN agent DROP DEFAULT;
CREATE INDEX quorum_batches_agent ON quorum_batches (agent, created_at);
