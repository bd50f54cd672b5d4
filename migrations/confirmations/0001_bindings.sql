-- Confirmations (the confirmations module, domain/workflow/confirmation): a binding
-- ties a secret token to one action, a signal (with an optional payload) to
-- one workflow. The token is never stored: token_hash is its SHA-256 (the
-- token holds 256 random bits, so a fast hash is as good as a slow one).
--
--   pending ──confirm──▶ confirmed (used_at: the signal was stored in the same
--      │                             transaction, exactly once)
--      ├──revoke──▶ revoked (revoked_at)
--      └──expires_at passes (compute_now())──▶ expired (nothing is written)
--
-- A binding goes with its workflow (ON DELETE CASCADE: workflow retention).
CREATE TABLE compute_confirmations (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    token_hash  bytea NOT NULL UNIQUE CHECK (length(token_hash) = 32),
    workflow_id text NOT NULL REFERENCES compute_workflows (id) ON DELETE CASCADE,
    signal      text NOT NULL,
    payload     jsonb,
    created_at  timestamptz NOT NULL DEFAULT compute_now(),
    expires_at  timestamptz NOT NULL,
    used_at     timestamptz,
    revoked_at  timestamptz,
    CHECK (used_at IS NULL OR revoked_at IS NULL),
    CHECK (expires_at > created_at)
);

CREATE INDEX compute_confirmations_workflow ON compute_confirmations (workflow_id, id);

-- compute_confirm(hash) uses the binding whose token hashes to hash, if it is
-- pending: one row, (outcome, id, workflow_id, signal, payload), outcome
-- 'confirmed' (used_at set now: the caller stores the signal in the same
-- transaction, or rolls back), 'used' (confirmed before: id and the action
-- are given) or 'refused' (no such token, or expired, or revoked: nothing
-- else is said, and both paths read the same index entry and row).
--
-- Concurrent calls for one token serialize on the row: the UPDATE of the
-- second waits for the first transaction and, once it commits, finds used_at
-- set (READ COMMITTED re-checks the row), so only one call is 'confirmed'; if
-- the first rolls back, the second confirms.
CREATE FUNCTION compute_confirm(p_hash bytea)
RETURNS TABLE (outcome text, id bigint, workflow_id text, signal text, payload jsonb)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN QUERY
    UPDATE compute_confirmations c SET used_at = compute_now()
    WHERE c.token_hash = p_hash AND c.used_at IS NULL AND c.revoked_at IS NULL
      AND c.expires_at > compute_now()
    RETURNING 'confirmed'::text, c.id, c.workflow_id, c.signal, c.payload;
    IF FOUND THEN
        RETURN;
    END IF;
    -- A fresh snapshot: a confirmation that committed while the UPDATE waited
    -- for it shows as used.
    RETURN QUERY
    SELECT CASE WHEN c.used_at IS NOT NULL THEN 'used' ELSE 'refused' END,
           CASE WHEN c.used_at IS NOT NULL THEN c.id END,
           CASE WHEN c.used_at IS NOT NULL THEN c.workflow_id END,
           CASE WHEN c.used_at IS NOT NULL THEN c.signal END,
           NULL::jsonb
    FROM compute_confirmations c WHERE c.token_hash = p_hash;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'refused'::text, NULL::bigint, NULL::text, NULL::text, NULL::jsonb;
    END IF;
END
$$;
