-- outbox/0004_cause: each event records its cause, the W3C traceparent of the
-- appending call's sampled span (platform/tracing; NULL when it had none, as
-- always with tracing off), so a sink's delivery span is caused by the spans
-- that appended its batch's events. A cause is only a trace id, a span id and
-- flags; /v1/events does not show it.
ALTER TABLE compute_events ADD COLUMN cause text;

-- compute_append_event as in outbox/0003, with the cause: dropped and created
-- again (not overloaded) so that a CALL with three arguments still resolves to
-- one procedure. A cause that is not 55 characters starting with "00-" is
-- stored as NULL: tracing never fails an append.
DROP PROCEDURE compute_append_event(text, text, jsonb);

CREATE PROCEDURE compute_append_event(event_topic text, event_key text, event_payload jsonb,
                                      event_cause text DEFAULT NULL)
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
    IF event_cause IS NOT NULL AND (length(event_cause) <> 55 OR left(event_cause, 3) <> '00-') THEN
        event_cause := NULL;
    END IF;
    INSERT INTO compute_events (topic, key, payload, cause) VALUES (event_topic, event_key, event_payload, event_cause);
END
$body$;
