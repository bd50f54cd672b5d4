-- outbox/0005_tenant: an event records the tenant its appending context named
-- (workers.WithTenant; NULL for none), so sinks and readers can tell whose it
-- is; a bad name is refused with 22023. An event is not work the tenant's
-- state governs: it records a change that commits with it, so a suspended
-- tenant's events are delivered like any other (holding some back would
-- reorder the log every sink reads in order), and a deleted tenant's workflow
-- compensation can still announce what it undid (see docs/tenancy.md).
ALTER TABLE compute_events ADD COLUMN tenant text;

-- compute_append_event as in outbox/0004, with the tenant: dropped and created
-- again (not overloaded) so that a CALL with four arguments resolves to one
-- procedure.
DROP PROCEDURE compute_append_event(text, text, jsonb, text);

CREATE PROCEDURE compute_append_event(event_topic text, event_key text, event_payload jsonb,
                                      event_cause text DEFAULT NULL, event_tenant text DEFAULT NULL)
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
    IF event_tenant IS NOT NULL AND event_tenant !~ '^[A-Za-z0-9][A-Za-z0-9._:@-]{0,199}$' THEN
        RAISE EXCEPTION 'tenant %: want 1 to 200 of [A-Za-z0-9._:@-], starting with a letter or digit', quote_literal(event_tenant)
            USING ERRCODE = '22023';
    END IF;
    INSERT INTO compute_events (topic, key, payload, cause, tenant)
    VALUES (event_topic, event_key, event_payload, event_cause, event_tenant);
END
$body$;
