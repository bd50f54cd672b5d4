// Package outbox is the outbox's SQL: side effects written as rows in the state
// change's own transaction and delivered after the commit, at least once. A
// rollback writes nothing; a commit delivers even if the process dies right
// after. It has two shapes (see workers/outboxworker for the workers that deliver).
//
// # The event log
//
// AppendTx writes events (topic, key, JSON payload) in the caller's transaction
// to compute_events; each row carries txid = pg_current_xact_id() and a seq. It
// is one statement: a single event is CALL compute_append_event (migration
// outbox/0003_append), whose INSERT the server keeps planned per connection.
// Commit order is not seq order, so every reader (Read: sinks, the SSE stream)
// uses seed 000's rule
//
//	WHERE txid < pg_snapshot_xmin(pg_current_snapshot())
//	  AND (txid, seq) > ($cursorTxid, $cursorSeq)
//	ORDER BY txid, seq
//
// Invariants:
//
//   - Nothing commits behind a cursor: every transaction below the snapshot's
//     xmin has ended, and every later one has a larger txid. A reader that
//     always reads after its last cursor skips no event and reads none twice.
//   - Order is by the columns themselves, never a text form of txid ("10"
//     sorts before "2"); pgx has no xid8 codec, so txids cross the wire as text
//     and are cast back (::text::xid8) in SQL.
//   - A read walks the (txid, seq) primary key from the cursor and stops at its
//     limit or at xmin: its cost is its batch, not the log.
//   - A long write transaction anywhere in the cluster holds every reader at
//     its txid until it ends (that is the rule working).
//
// # Trace context
//
// AppendTx records each event's cause: the W3C traceparent of the span of its
// context, if sampled (platform/tracing.Cause), in compute_events.cause (NULL
// otherwise: with tracing off an append costs one check), and Read returns it as
// Event.Cause. A cause is only a trace id, a span id and flags, never a payload;
// the SSE stream (/v1/events) does not show it. A malformed one is stored as
// NULL. A sink's delivery of a batch is the span bettercompute.outbox.deliver
// caused by the batch's events (workers/outboxworker), so an event appended by
// a reconcile is delivered in that reconcile's trace.
//
// The table dispatchers' rows are the application's own table, which has no
// cause column: a dispatch pass is not tied to the request that wrote the rows.
//
// # Sinks
//
// A sink is a named consumer with a row in compute_sinks (its cursor, a pause
// flag, its last error) and a lease, sink/<name>. A delivery reads a batch after
// the cursor, calls the handler, and only then moves the cursor, in a
// transaction fenced by the lease and guarded by the position it read
// (AdvanceSinkTx): a delivery whose lease was lost, or that an operator reset
// meanwhile, moves nothing, and its batch is delivered again.
//
//	         pump: events after the cursor, no live job
//	idle ───────────────────────────────────────────────▶ job queued
//	  ▲                                                      │ a worker takes the lease
//	  │ caught up / paused                                    ▼
//	  └──────────────────────────────────────────────── delivering ──handler error──▶ retry (backoff)
//	                  cursor moved (fenced), lease released   │ lease lost / process died
//	                                                          ▼
//	                                         batch delivered again by the next owner
//
// # Retention and the horizon
//
// Retention (Prune) deletes, in bounded batches, the rows every sink cursor has
// passed and that are older than the replay window; with no sink, the rows of
// ended transactions older than the window. It deletes a prefix of the log (it
// stops at the first row that must stay) and, in the same transaction, moves
// the horizon in compute_events_pruned to the last row it deleted:
//
//	   deleted: every event ≤ horizon   stored: every committed event > horizon
//	──────────────────────────────────●────────────────────────────────────▶ (txid, seq)
//	                               horizon
//
// Invariants:
//
//   - The horizon only moves forward (PrunedThrough reads it).
//   - A reader at cursor c has lost events iff the horizon is after c
//     (Horizon.Lost). Start means "every retained event" and never loses any.
//   - The SSE stream tells a client that resumes, or falls, behind the horizon
//     with an "event: reset" record naming the horizon and the earliest stored
//     event, then goes on after the horizon (see Tail; the HTTP handler is in package cli, events.go).
//   - ResetSink refuses After(c) behind the horizon (INVALID_ARGUMENT). Prune
//     locks the horizon row FOR UPDATE before its delete, and ResetSink holds it
//     FOR SHARE while it moves the cursor: under read committed the delete's
//     snapshot then sees any reset that committed while it waited, or the reset
//     sees the horizon Prune left. No accepted reset has its events deleted.
//
// # The table dispatcher
//
// An application keeps its own outbox table (see Table for its columns and two
// indexes). Compile validates every identifier before any query; Claim takes a
// batch of due rows in sequence order whose key has no earlier row claimed or
// waiting for a retry; Finish deletes the published rows, records failures
// (attempts + 1, retry after Backoff: 2, 4 … 256 s, the first 1,000 characters
// of the error) and releases the rest. A row's life:
//
//	pending ──Claim──▶ claimed ──published, Finish──▶ deleted
//	   ▲                 │  │
//	   │ Finish:released │  └──failed, Finish──▶ waiting (attempts+1, next_attempt_at)
//	   └─────────────────┘                         │ next_attempt_at passes
//	   ▲                                           ▼
//	   └──────── claim timeout passes ──────── pending (claimable again)
//
// Invariants:
//
//   - One claim or batch end of a table and Where runs at a time, across
//     processes: each takes pg_advisory_xact_lock on a key derived from them (a
//     transaction lock: safe behind PgBouncer), so a claim always sees the
//     previous one's rows as claimed. A claim transaction that stalls for the
//     claim timeout is cancelled by the server (statement and
//     idle-in-transaction timeouts), giving up its turn.
//   - A row is claimed only if no earlier row of its key is claimed or waiting
//     for its retry: per key, rows are published in sequence order, and a
//     failing row holds back its key only.
//   - Finish touches only rows whose claimed_until is still the batch's token,
//     so a batch that outlived its claim never undoes the next claim's work.
//   - A claim walks the sequence index and probes the partial index once per
//     candidate, with sequential scans, bitmap scans and sorts turned off for
//     its transaction, so its cost is its batch whatever the statistics say.
package outbox
