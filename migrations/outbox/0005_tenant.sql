-- outbox/0005_tenant: an event records the tenant its appending context named
-- (workers.WithTenant; NULL for none), so sinks and readers can tell whose it
-- is. Appending names the tenant the way enqueueing does (compute_tenant_use:
-- a bad name is refused with 22023, a deleted tenant with BC010). Events of a
-- suspended tenant are appended and delivered like any other: an event records
-- a change that has committed, and holding some of them back would reorder the
-- log every sink reads in order (see docs/tenancy.md).
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
    IF event_tenant IS NOT NULL THEN
        PERFORM compute_tenant_use(event_tenant);
    END IF;
    INSERT INTO compute_events (topic, key, payload, cause, tenant)
    VALUES (event_topic, event_key, event_payload, event_cause, event_tenant);
END
$body$;
