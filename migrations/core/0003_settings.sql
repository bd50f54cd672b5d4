-- Deployment-wide settings fixed at the first migrate. shard_count is the number of
-- shards: a key maps to shard (fnv1a32(key) % shard_count), and each shard's work
-- runs in its own River queue, shard_<n>. Changing it would move keys between
-- shards, so it is written once and every process reads it.
CREATE TABLE compute_settings (
    id          boolean PRIMARY KEY DEFAULT true CHECK (id),
    shard_count integer NOT NULL CHECK (shard_count BETWEEN 1 AND 4096),
    created_at  timestamptz NOT NULL DEFAULT compute_now()
);
