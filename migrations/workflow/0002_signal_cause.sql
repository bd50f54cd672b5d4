-- A signal records its cause: the W3C traceparent of the sender's sampled span
-- (platform/tracing; NULL when it had none, as always with tracing off). The
-- step that consumes the signal links to it. A step job's own cause travels in
-- its River job's metadata ("traceparent"), which needs no column.
ALTER TABLE compute_workflow_signals ADD COLUMN cause text;
