package workers_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

type benchTaskArgs struct {
	Key string `json:"key"`
}

func (benchTaskArgs) Kind() string { return "bench_task" }

// benchTaskWorker is a fenced job of an application (AddWorker): the domain
// write in workers.InTx, worked through River's middleware (ours, and
// otelriver when tracing).
type benchTaskWorker struct {
	river.WorkerDefaults[benchTaskArgs]
}

func (*benchTaskWorker) Work(ctx context.Context, job *river.Job[benchTaskArgs]) error {
	return workers.InTx(ctx, job, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, benchWriteSQL, job.Args.Key)
		return err
	})
}

// BenchmarkThroughputTracing runs the same work with tracing off (no
// TracerProvider: nothing installed) and on with a sampler that samples
// nothing (every span started, none recorded: the price of having tracing
// configured), one after the other on one database, and reports each rate
// and the ratio on/off (1 is no cost):
//
//   - the reconcile drain of BenchmarkThroughput (5,000 dirty keys, 16 at once);
//
//   - 5,000 fenced jobs (AddWorker, a write in workers.InTx), inserted
//     beforehand, drained 16 at once through River's middleware.
//
//     go test -run '^$' -bench ThroughputTracing -benchtime 1x ./workers/
func BenchmarkThroughputTracing(b *testing.B) {
	db := pgtest.New(b, pgtest.Options{MaxConns: 80})
	db.MustExec(b, `CREATE TABLE bench_items (key text PRIMARY KEY, n bigint NOT NULL DEFAULT 0)`)
	db.MustExec(b, `INSERT INTO bench_items (key) SELECT 'k' || g FROM generate_series(1, $1) g`, benchJobs)
	never := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))
	defer func() { _ = never.Shutdown(context.Background()) }()

	var recOff, recOn, jobsOff, jobsOn float64
	for i := 0; i < b.N; i++ {
		recOff = benchReconcileTraced(b, db, "bench_trace_off", nil)
		recOn = benchReconcileTraced(b, db, "bench_trace_on", never)
		jobsOff = benchTasksTraced(b, db, nil)
		jobsOn = benchTasksTraced(b, db, never)
	}
	b.ReportMetric(recOff, "reconciles/s_tracing_off")
	b.ReportMetric(recOn, "reconciles/s_tracing_unsampled")
	b.ReportMetric(recOn/recOff, "reconcile_unsampled/off")
	b.ReportMetric(jobsOff, "fenced_jobs/s_tracing_off")
	b.ReportMetric(jobsOn, "fenced_jobs/s_tracing_unsampled")
	b.ReportMetric(jobsOn/jobsOff, "fenced_jobs_unsampled/off")
}

// benchReconcileTraced is benchFenced with tp as the runtime's TracerProvider.
func benchReconcileTraced(b *testing.B, db *pgtest.DB, kind string, tp trace.TracerProvider) float64 {
	ctx := context.Background()
	reg := benchReconciler(b, kind, 0)
	for i := 0; i < benchJobs; i += 100 {
		require.NoError(b, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
			for j := i; j < i+100 && j < benchJobs; j++ {
				if err := workers.DirtyTx(ctx, tx, kind, "k"+strconv.Itoa(j+1), nil); err != nil {
					return err
				}
			}
			return nil
		}))
	}
	start := time.Now()
	rt := workertest.Start(b, db.Pool, reg, &workers.Options{WorkersPerShard: benchDrainSessions / pgtest.DefaultShardCount,
		PollInterval: benchPoll, TracerProvider: tp})
	workertest.WaitFor(b, 5*time.Minute, "reconciles done", func() bool {
		return db.MustCount(b, `SELECT count(*) FROM compute_dirty WHERE kind = $1`, kind) == 0
	})
	rate := benchJobs / time.Since(start).Seconds()
	require.NoError(b, rt.Stop(ctx))
	return rate
}

// benchTasksTraced inserts benchJobs fenced jobs across the shards, then
// starts a runtime with tp and times their drain.
func benchTasksTraced(b *testing.B, db *pgtest.DB, tp trace.TracerProvider) float64 {
	ctx := context.Background()
	reg := workers.NewRegistry()
	require.NoError(b, workers.AddWorker(reg, &benchTaskWorker{}))
	db.MustExec(b, `DELETE FROM river_job WHERE kind = 'bench_task'`)
	for i := 0; i < benchJobs; i += 100 {
		require.NoError(b, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
			for j := i; j < i+100 && j < benchJobs; j++ {
				key := "k" + strconv.Itoa(j+1)
				if _, err := workers.InsertForKeyTx(ctx, tx, key, benchTaskArgs{Key: key}, nil); err != nil {
					return err
				}
			}
			return nil
		}))
	}
	start := time.Now()
	rt := workertest.Start(b, db.Pool, reg, &workers.Options{WorkersPerShard: benchDrainSessions / pgtest.DefaultShardCount,
		PollInterval: benchPoll, TracerProvider: tp})
	workertest.WaitFor(b, 5*time.Minute, "fenced jobs done", func() bool {
		return db.MustCount(b, `SELECT count(*) FROM river_job WHERE kind = 'bench_task' AND state <> 'completed'`) == 0
	})
	rate := benchJobs / time.Since(start).Seconds()
	require.NoError(b, rt.Stop(ctx))
	return rate
}
