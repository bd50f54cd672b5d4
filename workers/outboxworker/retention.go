package outboxworker

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/bettercompute/bettercompute/domain/outbox"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/internal/riverjob"
)

// retentionWorker prunes the event log: see riverjob.OutboxRetention.
type retentionWorker struct {
	river.WorkerDefaults[riverjob.OutboxRetention]
	st *state
}

// Work deletes, one bounded batch per transaction, the events every sink cursor
// has passed and that are older than the replay window, until a batch comes
// back short or RetentionMaxBatches ran. Idempotent: any process may run it.
func (w *retentionWorker) Work(ctx context.Context, job *river.Job[riverjob.OutboxRetention]) error {
	rt := workers.RuntimeFrom(ctx)
	n, err := prune(ctx, rt.Pool(), w.st.options())
	_ = river.RecordOutput(ctx, map[string]int{"deleted": n})
	if n > 0 {
		log := rt.Log()
		log.Debug().Int("deleted", n).Msg("outbox retention")
	}
	return err
}

// prune runs one retention pass with o's window and bounds (see Options) and
// returns how many events it deleted.
func prune(ctx context.Context, db pg.DBTX, o Options) (int, error) {
	o = o.withDefaults()
	total := 0
	for i := 0; i < o.RetentionMaxBatches; i++ {
		var n int
		err := pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
			var err error
			n, err = outbox.Prune(ctx, tx, outbox.PruneOptions{Keep: o.Retain, Batch: o.RetentionBatch})
			return err
		})
		total += n
		if err != nil {
			return total, err
		}
		if n < o.RetentionBatch {
			break
		}
	}
	return total, nil
}
