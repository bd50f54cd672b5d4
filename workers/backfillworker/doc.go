// Package backfill runs work that grows with data (filling a new column for
// every row, rebuilding a derived table, deleting millions of child rows) as a
// backfill: bounded batches sized by time, each in one fenced transaction that
// also records the backfill's progress in compute_backfills, a River job
// draining them while they come back full. Never in a migration.
//
// An application registers a backfill in its module's Register function:
//
//	workers.AddBackfill(reg, workers.Backfill{
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
// # One batch, one transaction; many batches, one job
//
// Each batch runs in its own transaction, fenced as workers.InTx fences a job
// (the shard lease of backfill/<name> FOR KEY SHARE, the job's own attempt FOR
// UPDATE), and then, in that same transaction:
//
//  1. takes the backfill's advisory lock shared (an operator's verb takes it
//     exclusive, so a verb waiting for the batch in flight goes before the
//     next batch), and locks the backfill's row FOR UPDATE and decides: the
//     batch runs only if the row is running with the job's epoch and names
//     this job as the one that carries the run on (job_id); otherwise the job
//     is stale (the backfill was paused, cancelled or resumed, another job
//     carries it on, or it is a duplicate) and completes doing nothing;
//  2. calls the batch function with the batch size (see Sizing), which selects
//     only unfinished rows and handles at most that many;
//  3. adds the batch to the row with an UPDATE guarded by the same epoch, job
//     and batch number, recording the size the next batch asks for;
//  4. if the batch found no rows, marks the backfill done and completes the
//     job; if it came back full and the job's drain has time for the next one
//     (after the pause and the rate limit), keeps the job running and named in
//     the row; otherwise inserts the next batch's job, scheduled after the
//     pause and the rate limit, names it in the row and completes its own job;
//  5. commits.
//
// So a job drains batch after batch while they come back full, for up to
// DrainFor (at most half its timeout), instead of one batch per River poll,
// and each batch's rows, its progress and whatever carries the run on commit
// together or not at all: two runners can never both commit the same batch, a
// kill -9 mid-batch loses nothing and repeats nothing that committed (the
// killed job, still running and named in the row, is handed back to the
// shard's next holder and carries on from the last committed batch), and the
// progress counters always equal what the committed batches did.
//
// # Sizing
//
// Batches are sized by time (the chunk-time rule of gh-ost and
// pt-online-schema-change): after a batch of n rows that took t, the next asks
// for n × BatchTime / t rows (25 ms by default), at least n/2 and at most 2n,
// between 1 and BatchSize (and MaxRowsPerSecond × BatchTime with a rate limit).
// A run's first batch asks for min(BatchSize, 1000). The size is kept in the
// backfill's row (Progress.BatchSize), so it carries over from job to job.
// FixedBatchSize turns the sizing off.
//
// A batch function that fails rolls its transaction back; its error is recorded
// as last_error in a separate short transaction, and River retries the job
// with backoff. An error with code INVALID_ARGUMENT cancels the job instead: the
// backfill then stalls (status says so) until Resume.
//
// # Pause, resume, cancel
//
// Pause and Cancel take effect at the next batch boundary: they wait for the
// batch in flight (its transaction holds the advisory lock and the row), the
// draining job's next batch waits for them, and they bump the epoch, so no
// batch starts after they return; a job waiting in River is cancelled, and a
// draining one finds the new epoch and completes. Resume bumps the epoch again
// and enqueues the next batch.
package backfillworker
