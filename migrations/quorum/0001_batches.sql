-- quorum/0001_batches: a batch of proposed changes that commits only when a
-- quorum of its voters approves before its deadline.
--
--   open ──approvals reach quorum before deadline──▶ committed
--   open ──quorum can no longer be reached────────▶ rejected
--   open ──deadline passes (by compute_now())─────▶ expired
--
-- The tallies live on the batch row, which every vote locks: the decision is
-- taken by the one vote that crosses the line, exactly once.
CREATE TABLE quorum_batches (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind        text NOT NULL CHECK (kind ~ '^[a-z][a-z0-9_]{0,62}$'),
    state       text NOT NULL DEFAULT 'open'
                CONSTRAINT quorum_batches_state_check CHECK (state IN ('open', 'committed', 'rejected', 'expired')),
    quorum      integer NOT NULL CHECK (quorum >= 1),
    voter_count integer NOT NULL CHECK (voter_count >= quorum),
    approvals   integer NOT NULL DEFAULT 0 CHECK (approvals >= 0),
    rejections  integer NOT NULL DEFAULT 0 CHECK (rejections >= 0),
    deadline    timestamptz NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT compute_now(),
    decided_at  timestamptz,
    CHECK (approvals + rejections <= voter_count),
    CHECK ((state = 'open') = (decided_at IS NULL))
);
