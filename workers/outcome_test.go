package workers_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

type plainArgs struct{}

func (plainArgs) Kind() string { return "test_plain" }

// plainWorker is a job without a fenced transaction: River's completer records
// its outcome after Work returns. Each run leaves a row and takes run.
type plainWorker struct {
	river.WorkerDefaults[plainArgs]
	db       *pg.Pool
	run      time.Duration
	returned chan struct{}
}

func (w *plainWorker) Work(ctx context.Context, job *river.Job[plainArgs]) error {
	if _, err := w.db.Exec(ctx, `INSERT INTO test_runs (job_id) VALUES ($1)`, job.ID); err != nil {
		return err
	}
	select {
	case <-time.After(w.run):
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case w.returned <- struct{}{}:
	default:
	}
	return nil
}

// TestFinishedJobIsNotHandedBackWhileItsOutcomeIsRecorded: River's completer
// records a job's outcome after Work returned, asynchronously, retrying a failed
// write after a pause (1 s, then 2 s). While it retries (here the write fails
// while a flag is set, as on a database that is restarting or overloaded), the
// shard's holder must not take the job, still running in the database and
// attempted more than 5 s ago, for one whose outcome was lost and hand it back:
// it would run a second time.
func TestFinishedJobIsNotHandedBackWhileItsOutcomeIsRecorded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	db.MustExec(t, `CREATE TABLE test_runs (job_id bigint NOT NULL)`)
	db.MustExec(t, `CREATE TABLE test_fail_outcome (fail bool NOT NULL)`)
	db.MustExec(t, `INSERT INTO test_fail_outcome VALUES (true)`)
	// While the flag is set, recording test_plain's completion fails.
	db.MustExec(t, `CREATE FUNCTION test_fail_outcome() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.kind = 'test_plain' AND OLD.state = 'running' AND NEW.state = 'completed'
       AND (SELECT fail FROM test_fail_outcome) THEN
        RAISE EXCEPTION 'test: the outcome cannot be written now';
    END IF;
    RETURN NEW;
END $$`)
	db.MustExec(t, `CREATE TRIGGER test_fail_outcome BEFORE UPDATE ON river_job FOR EACH ROW EXECUTE FUNCTION test_fail_outcome()`)

	// The job runs 4.5 s: half a second after it returns, it was attempted more
	// than 5 s ago, old enough to pass for a job whose outcome was lost.
	w := &plainWorker{db: db.Pool, run: 4500 * time.Millisecond, returned: make(chan struct{}, 1)}
	reg := workers.NewRegistry()
	require.NoError(t, workers.AddWorker(reg, w))
	rt := workertest.Start(t, db.Pool, reg, &workers.Options{Shards: []int{3}, LeaseTTL: 6 * time.Second, LeaseRenew: 250 * time.Millisecond})
	workertest.WaitFor(t, 30*time.Second, "the worker holds shard 3", func() bool { return len(rt.HeldShards()) == 1 })

	var id int64
	require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		res, err := jobs.InsertTx(ctx, tx, plainArgs{}, &river.InsertOpts{Queue: jobs.ShardQueue(3)})
		if err == nil {
			id = res.Job.ID
		}
		return err
	}))
	select {
	case <-w.returned:
	case <-time.After(60 * time.Second):
		t.Fatal("the job never returned")
	}
	// Room for the wrong thing: the completer's first two writes fail, and ten
	// lease rounds pass with the job running, attempted over 5 s ago, and not
	// worked by any goroutine. Then the third write goes through.
	time.Sleep(2500 * time.Millisecond)
	db.MustExec(t, `UPDATE test_fail_outcome SET fail = false`)

	workertest.WaitFor(t, 60*time.Second, "the job's outcome recorded", func() bool { return jobState(t, db, id) == "completed" })
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM river_job, unnest(errors) e WHERE id = $1 AND e->>'error' LIKE 'handed back%'`, id),
		"the finished job was handed back")
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM test_runs WHERE job_id = $1`, id), "the finished job ran again")
}
