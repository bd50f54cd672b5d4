-- outbox/0003_append: the write path of one event (domain/outbox.AppendTx),
-- made cheap. An Append is one statement in its caller's transaction, so its
-- whole server cost is added to that transaction; measured on PostgreSQL 15,
-- most of it was not the insert itself:
--
--   * parsing, rewriting and planning the INSERT again at every call (the pool
--     sends only unnamed statements, for PgBouncer), which expands the column
--     defaults from their stored trees, looks the identity sequence up in
--     pg_depend and inlines compute_now();
--   * the two CHECK constraints on topic and key, whose stored trees the
--     executor reads, plans and compiles again at every insert statement, even
--     from a cached plan.
--
-- compute_append_event is the insert in a PL/pgSQL procedure: the server plans
-- it once per connection and keeps the plan (no session state that a pooler
-- could lose: any connection plans it on first use), so a call costs a CALL,
-- the checks and the insert. A change of compute_events or of compute_now()
-- (the sim clock) invalidates the kept plan. The row is the one INSERT INTO
-- compute_events (topic, key, payload) wrote: txid, seq and created_at from the
-- defaults, in the calling transaction.
--
-- The bounds on topic and key are checked here, in the same terms as the
-- CHECK constraints they replace (characters; SQLSTATE 23514), and by
-- outbox.AppendTx before it sends anything (bytes, stricter). An INSERT into
-- compute_events that bypasses both is no longer bounded: write events with
-- AppendTx, or from SQL with CALL compute_append_event(topic, key, payload).
CREATE PROCEDURE compute_append_event(event_topic text, event_key text, event_payload jsonb)
    LANGUAGE plpgsql
    AS $body$
BEGIN
    IF event_topic = '' OR length(event_topic) > 200 THEN
        RAISE EXCEPTION 'event topic must be 1 to 200 characters, got %', length(event_topic)
            USING ERRCODE = '23514';
    END IF;
    IF length(event_key) > 512 THEN
        RAISE EXCEPTION 'event % key must be at most 512 characters, got %', event_topic, length(event_key)
            USING ERRCODE = '23514';
    END IF;
    INSERT INTO compute_events (topic, key, payload) VALUES (event_topic, event_key, event_payload);
END
$body$;

ALTER TABLE compute_events
    DROP CONSTRAINT compute_events_topic_check,
    DROP CONSTRAINT compute_events_key_check;
