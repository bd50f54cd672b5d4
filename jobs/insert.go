package jobs

import (
	"context"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"
)

var (
	inserterOnce sync.Once
	inserter     *river.Client[pgx.Tx]
	inserterErr  error
)

// InsertTx inserts a River job in the caller's transaction: if tx rolls back, so
// does the job. It needs no running client (domain code and applications use it
// inside their own transactions); worker processes pick the job up by its queue.
// A job that a shard's holder must fence goes to that shard's queue:
//
//	jobs.InsertTx(ctx, tx, args, &river.InsertOpts{Queue: jobs.ShardQueue(jobs.ShardOf(key, n))})
func InsertTx(ctx context.Context, tx pgx.Tx, args river.JobArgs, opts *river.InsertOpts) (*rivertype.JobInsertResult, error) {
	inserterOnce.Do(func() {
		inserter, inserterErr = river.NewClient(riverpgxv5.New(nil), &river.Config{})
	})
	if inserterErr != nil {
		return nil, inserterErr
	}
	return inserter.InsertTx(ctx, tx, args, opts)
}

// ShardCountTx reads the deployment's shard count in tx.
func ShardCountTx(ctx context.Context, tx pgx.Tx) (int, error) {
	var n int
	err := tx.QueryRow(ctx, `SELECT shard_count FROM compute_settings`).Scan(&n)
	return n, err
}

// ShardQueueOfTx is the shard queue of key, read in tx.
func ShardQueueOfTx(ctx context.Context, tx pgx.Tx, key string) (string, error) {
	n, err := ShardCountTx(ctx, tx)
	if err != nil {
		return "", err
	}
	return ShardQueue(ShardOf(key, n)), nil
}
