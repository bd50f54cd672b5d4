-- The dev demo of backfills (better-compute dev only): people whose greeting a
-- backfill fills in, a batch at a time, so its jobs show in River UI under the
-- kind backfill_demo_greetings. The partial index keeps every batch as cheap as
-- the first.
CREATE TABLE demo_backfill_people (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name       text NOT NULL,
    greeting   text,
    created_at timestamptz NOT NULL DEFAULT compute_now()
);

CREATE INDEX demo_backfill_people_ungreeted ON demo_backfill_people (id) WHERE greeting IS NULL;

INSERT INTO demo_backfill_people (name)
SELECT (ARRAY['Ada', 'Grace', 'Alan', 'Edsger', 'Barbara', 'Ken', 'Frances', 'Donald'])[1 + g % 8] || ' ' || g
FROM generate_series(1, 20000) g;
