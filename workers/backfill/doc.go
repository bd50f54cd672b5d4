// Package backfill runs work that grows with data (filling a new column for
// every row, rebuilding a derived table, deleting millions of child rows) as a
// backfill: bounded batches, one per River job, each in one fenced transaction
// that also records the backfill's progress in compute_backfills. Never in a
// migration.
//
// An application registers a backfill in its module's Register function:
//
//	backfill.Add(reg, backfill.Backfill{
//		Name:      "inventory_normalized_name",
//		BatchSize: 1000,
//		Batch: func(ctx context.Context, tx pgx.Tx, n int) (int, error) {
//			tag, err := tx.Exec(ctx, `
//	UPDATE inventory_items SET normalized_name = lower(name)
//	WHERE id = ANY (ARRAY(
//	        SELECT id FROM inventory_items WHERE normalized_name IS NULL
//	        ORDER BY id LIMIT $1 FOR UPDATE))
//	  AND normalized_name IS NULL`, n)
//			return int(tag.RowsAffected()), err
//		},
//	})
//
// and an operator runs it: better-compute backfill start NAME, pause, resume,
// cancel, status [--watch], list.
//
// # States
//
//	(no row) ──Start──▶ running ──a batch finds no rows──▶ done
//	running ──Pause──▶ paused ──Resume──▶ running
//	running, paused ──Cancel──▶ cancelled
//	done, cancelled ──Start──▶ running (a new run: the counters start again)
//	running, its job dead (discarded, cancelled, deleted) ──Resume──▶ running
//
// # One batch, one transaction
//
// Each batch job runs in workers.InTx (the shard lease of backfill/<name> FOR
// SHARE, the job's own attempt FOR UPDATE), and then, in that same transaction:
//
//  1. locks the backfill's row FOR UPDATE and decides: the job runs only if the
//     row is running with the job's epoch and exactly the job's batch number of
//     committed batches; otherwise the job is stale (the backfill was paused,
//     cancelled, resumed, or another job took this batch) and completes doing
//     nothing;
//  2. calls the batch function, which selects only unfinished rows and handles
//     at most the batch size;
//  3. adds the batch to the row with an UPDATE guarded by the same epoch and
//     batch number;
//  4. if the batch handled rows, inserts the next batch's job, scheduled after
//     the pause and the rate limit; if it found none, marks the backfill done;
//  5. completes its own job, and commits.
//
// So a batch's rows, its progress and the next job commit together or not at
// all: two runners can never both commit the same batch, a kill -9 mid-batch
// loses nothing and repeats nothing that committed, and the progress counters
// always equal what the committed batches did.
//
// A batch function that fails rolls its transaction back; its error is recorded
// as last_error in a separate short transaction, and River retries the job
// with backoff. An error with code INVALID_ARGUMENT cancels the job instead: the
// backfill then stalls (status says so) until Resume.
//
// # Pause, resume, cancel
//
// Pause and Cancel take effect at the next batch boundary: they wait for the
// batch in flight (its transaction holds the row) and bump the epoch, so no
// batch starts after they return; the waiting job is cancelled in River. Resume
// bumps the epoch again and enqueues the next batch.
package backfill
