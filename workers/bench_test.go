package workers_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/platform/logging"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

// benchWriteSQL is the domain write of both sides of BenchmarkThroughput: one
// row's UPDATE per job (raw River) or per key (ours), in the transaction that
// completes it.
const benchWriteSQL = `UPDATE bench_items SET n = n + 1 WHERE key = $1`

// Both sides of BenchmarkThroughput poll alike and run as many jobs at once.
const (
	benchPoll = 100 * time.Millisecond // config.DefaultPollInterval
	// benchDrainSessions works the drain: 16 sessions, as pgbench -c 16. Ours:
	// 16 shards with one worker each; raw River: one queue with 16 workers.
	benchDrainSessions = 16
	// benchE2ESessions works the end-to-end run: ours 16 shards with 4 workers
	// each; raw River one queue with 64 workers.
	benchE2ESessions = 64
)

type benchWriteArgs struct {
	Key string `json:"key"`
}

func (benchWriteArgs) Kind() string { return "bench_write" }

// benchWriteWorker is raw River's peer of our reconciler: the domain write and
// the job's completion in one transaction (River's JobCompleteTx), as ours
// commits the write with its fence and finish.
type benchWriteWorker struct {
	river.WorkerDefaults[benchWriteArgs]
	db *pg.Pool
}

func (w *benchWriteWorker) Work(ctx context.Context, job *river.Job[benchWriteArgs]) error {
	return pg.InTx(ctx, w.db, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, benchWriteSQL, job.Args.Key); err != nil {
			return err
		}
		_, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job)
		return err
	})
}

const benchJobs = 5000

// BenchmarkThroughput runs, in one process on one database, the same work on
// both sides: each job (raw River) or key (ours) is one domain write, the
// UPDATE of one row committed with the job's completion, every side polls every
// 100 ms and runs as many jobs at once. It reports:
//
//   - the drain of 5,000 jobs inserted beforehand, 16 at once: raw River
//     (InsertMany) jobs/s, and our fenced reconciles/s (DirtyTx), batched (up
//     to 32 keys per commit, the default) and unbatched (Batch: 1), each ÷ raw
//     River;
//
//   - end to end, 64 at once, while 8 writers commit a change and the enqueue
//     (InsertTx or DirtyTx) per transaction: raw River, ours batched and ours
//     unbatched, each ÷ raw River;
//
//   - pgbench -N TPS on the same server as the machine's commit-rate limit, the
//     ratios to it, and this process's RSS idle and under load.
//
//     go test -run '^$' -bench Throughput -benchtime 1x ./workers/
func BenchmarkThroughput(b *testing.B) {
	db := pgtest.New(b, pgtest.Options{MaxConns: 80})
	db.MustExec(b, `CREATE TABLE bench_items (key text PRIMARY KEY, n bigint NOT NULL DEFAULT 0)`)
	db.MustExec(b, `INSERT INTO bench_items (key) SELECT 'k' || g FROM generate_series(1, $1) g`, benchJobs)
	idleRSS := rssKB()

	var rawRate, fencedRate, fencedRate1, rawE2E, e2eRate, e2eRate1, peakRSS float64
	for i := 0; i < b.N; i++ {
		rawRate = benchRawRiver(b, db)
		var rss float64
		fencedRate, rss = benchFenced(b, db, "bench", 0)
		peakRSS = max(peakRSS, rss)
		fencedRate1, rss = benchFenced(b, db, "bench_b1", 1)
		peakRSS = max(peakRSS, rss)
		rawE2E = benchRawRiverEndToEnd(b, db)
		e2eRate, rss = benchEndToEnd(b, db, "bench_e2e", 0)
		peakRSS = max(peakRSS, rss)
		e2eRate1, rss = benchEndToEnd(b, db, "bench_e2e_b1", 1)
		peakRSS = max(peakRSS, rss)
	}
	tps := pgtest.Pgbench(b, 16, 10*time.Second)
	b.ReportMetric(rawRate, "raw_river_jobs/s")
	b.ReportMetric(fencedRate, "fenced_reconciles/s")
	b.ReportMetric(fencedRate1, "fenced_unbatched_reconciles/s")
	b.ReportMetric(fencedRate/rawRate, "fenced/raw")
	b.ReportMetric(fencedRate1/rawRate, "fenced_unbatched/raw")
	b.ReportMetric(rawE2E, "raw_river_e2e_jobs/s")
	b.ReportMetric(e2eRate, "e2e_dirty+reconcile/s")
	b.ReportMetric(e2eRate1, "e2e_unbatched_dirty+reconcile/s")
	b.ReportMetric(e2eRate/rawE2E, "e2e/raw_e2e")
	b.ReportMetric(e2eRate1/rawE2E, "e2e_unbatched/raw_e2e")
	b.ReportMetric(tps, "pgbench_N_tps")
	b.ReportMetric(e2eRate/tps, "e2e/pgbench")
	b.ReportMetric(fencedRate/tps, "fenced/pgbench")
	b.ReportMetric(rawRate/tps, "raw/pgbench")
	b.ReportMetric(float64(idleRSS)/1024, "rss_idle_MB")
	b.ReportMetric(peakRSS/1024, "rss_load_MB")
}

// benchRawClient returns a River client whose one queue runs workers
// benchWriteWorkers at once, polling every benchPoll.
func benchRawClient(b *testing.B, db *pgtest.DB, queue string, workers int) *river.Client[pgx.Tx] {
	ws := river.NewWorkers()
	river.AddWorker(ws, &benchWriteWorker{db: db.Pool})
	client, err := river.NewClient(riverpgxv5.New(db.Pool.Pool), &river.Config{
		Queues:            map[string]river.QueueConfig{queue: {MaxWorkers: workers}},
		Workers:           ws,
		PollOnly:          true,
		FetchPollInterval: benchPoll,
		FetchCooldown:     benchPoll,
		Logger:            logging.Slog(zerolog.Nop()),
	})
	require.NoError(b, err)
	return client
}

// benchRawRiver is benchFenced's peer on raw River: the jobs inserted first
// (InsertMany), then drained by benchDrainSessions workers.
func benchRawRiver(b *testing.B, db *pgtest.DB) float64 {
	ctx := context.Background()
	client := benchRawClient(b, db, "raw", benchDrainSessions)
	params := make([]river.InsertManyParams, benchJobs)
	for i := range params {
		params[i] = river.InsertManyParams{Args: benchWriteArgs{Key: "k" + strconv.Itoa(i+1)}, InsertOpts: &river.InsertOpts{Queue: "raw"}}
	}
	_, err := client.InsertMany(ctx, params)
	require.NoError(b, err)
	start := time.Now()
	require.NoError(b, client.Start(ctx))
	workertest.WaitFor(b, 5*time.Minute, "raw jobs done", func() bool {
		return db.MustCount(b, `SELECT count(*) FROM river_job WHERE queue = 'raw' AND state <> 'completed'`) == 0
	})
	rate := benchJobs / time.Since(start).Seconds()
	require.NoError(b, client.Stop(ctx))
	return rate
}

// write plays the application of the end-to-end benchmarks: 8 writers each
// commit, per transaction, a one-row change and then enqueue(tx, j, key).
func write(b *testing.B, db *pgtest.DB, enqueue func(tx pgx.Tx, j int, key string) error) {
	ctx := context.Background()
	const writers = 8
	errs := make(chan error, writers)
	for w := 0; w < writers; w++ {
		go func() {
			for j := w; j < benchJobs; j += writers {
				key := "k" + strconv.Itoa(j+1)
				err := pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, `UPDATE bench_items SET n = n + 1 WHERE key = $1`, key); err != nil {
						return err
					}
					return enqueue(tx, j, key)
				})
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for w := 0; w < writers; w++ {
		require.NoError(b, <-errs)
	}
}

// benchRawRiverEndToEnd is benchEndToEnd's peer on raw River: 8 writers each
// commit a one-row change and an InsertTx of a job per transaction, the job
// does the domain write, and the clock stops when every job is completed.
func benchRawRiverEndToEnd(b *testing.B, db *pgtest.DB) float64 {
	ctx := context.Background()
	client := benchRawClient(b, db, "raw_e2e", benchE2ESessions)
	require.NoError(b, client.Start(ctx))
	start := time.Now()
	write(b, db, func(tx pgx.Tx, _ int, key string) error {
		_, err := client.InsertTx(ctx, tx, benchWriteArgs{Key: key}, &river.InsertOpts{Queue: "raw_e2e"})
		return err
	})
	workertest.WaitFor(b, 5*time.Minute, "raw e2e jobs done", func() bool {
		return db.MustCount(b, `SELECT count(*) FROM river_job WHERE queue = 'raw_e2e' AND state <> 'completed'`) == 0
	})
	rate := benchJobs / time.Since(start).Seconds()
	require.NoError(b, client.Stop(ctx))
	return rate
}

// benchReconciler is our side's reconciler kind: the domain write per key, up
// to batch keys per commit (0: the default, workers.DefaultBatch).
func benchReconciler(b *testing.B, kind string, batch int) *workers.Registry {
	reg := workers.NewRegistry()
	require.NoError(b, workers.AddReconciler(reg, workers.Reconciler{Kind: kind, Batch: batch,
		Reconcile: func(ctx context.Context, tx pgx.Tx, key string) (workers.Result, error) {
			_, err := tx.Exec(ctx, benchWriteSQL, key)
			return workers.Result{}, err
		}}))
	return reg
}

// benchFenced marks every key of kind dirty (100 keys per transaction), then
// starts the workers, benchDrainSessions of them, and times the drain.
func benchFenced(b *testing.B, db *pgtest.DB, kind string, batch int) (rate, peakRSS float64) {
	ctx := context.Background()
	reg := benchReconciler(b, kind, batch)
	// Mark every key dirty first (100 keys per transaction), then start the
	// workers and time the drain.
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
	rt := workertest.Start(b, db.Pool, reg, &workers.Options{WorkersPerShard: benchDrainSessions / pgtest.DefaultShardCount, PollInterval: benchPoll})
	workertest.WaitFor(b, 5*time.Minute, "reconciles done", func() bool {
		peakRSS = max(peakRSS, float64(rssKB()))
		return db.MustCount(b, `SELECT count(*) FROM compute_dirty WHERE kind = $1`, kind) == 0
	})
	rate = benchJobs / time.Since(start).Seconds()
	require.NoError(b, rt.Stop(ctx))
	return rate, peakRSS
}

// benchEndToEnd times the whole path with the workers running (benchE2ESessions
// of them): 8 writers each commit one change-and-DirtyTx per transaction (the
// application's side), and the clock stops when every key is reconciled.
func benchEndToEnd(b *testing.B, db *pgtest.DB, kind string, batch int) (rate, peakRSS float64) {
	ctx := context.Background()
	reg := benchReconciler(b, kind, batch)
	rt := workertest.Start(b, db.Pool, reg, &workers.Options{WorkersPerShard: benchE2ESessions / pgtest.DefaultShardCount, PollInterval: benchPoll})
	start := time.Now()
	write(b, db, func(tx pgx.Tx, _ int, key string) error {
		return workers.DirtyTx(ctx, tx, kind, key, nil)
	})
	workertest.WaitFor(b, 5*time.Minute, "reconciles done", func() bool {
		peakRSS = max(peakRSS, float64(rssKB()))
		return db.MustCount(b, `SELECT count(*) FROM compute_dirty WHERE kind = $1`, kind) == 0
	})
	rate = benchJobs / time.Since(start).Seconds()
	require.NoError(b, rt.Stop(ctx))
	return rate, peakRSS
}

func rssKB() int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if rest, ok := strings.CutPrefix(s.Text(), "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.Fields(rest)[0], 10, 64)
			return n
		}
	}
	return 0
}

// noopArgs are the insert-only jobs of BenchmarkDirtyVsInsertTx.
type noopArgs struct {
	N int `json:"n"`
}

func (noopArgs) Kind() string { return "bench_noop" }

// BenchmarkDirtyVsInsertTx: the cost of DirtyTx inside a caller's transaction
// against a plain River InsertTx, each in its own transaction.
//
//	go test -run '^$' -bench DirtyVsInsertTx ./workers/
func BenchmarkDirtyVsInsertTx(b *testing.B) {
	ctx := context.Background()
	db := pgtest.New(b)
	client, err := river.NewClient(riverpgxv5.New(db.Pool.Pool), &river.Config{Logger: logging.Slog(zerolog.Nop())})
	require.NoError(b, err)
	var insertNs, dirtyNs float64
	b.Run("InsertTx", func(b *testing.B) {
		start := time.Now()
		for i := 0; i < b.N; i++ {
			require.NoError(b, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
				_, err := client.InsertTx(ctx, tx, noopArgs{N: i}, &river.InsertOpts{Queue: "shard_0"})
				return err
			}))
		}
		insertNs = float64(time.Since(start).Nanoseconds()) / float64(b.N)
	})
	// The trigger that keeps fenced kinds in shard queues runs its look-up for
	// an insert into any other queue (not for shard queues, above and below).
	b.Run("InsertTxOtherQueue", func(b *testing.B) {
		start := time.Now()
		for i := 0; i < b.N; i++ {
			require.NoError(b, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
				_, err := client.InsertTx(ctx, tx, noopArgs{N: i}, &river.InsertOpts{Queue: "bench_other"})
				return err
			}))
		}
		if insertNs > 0 {
			b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(b.N)/insertNs, "other/inserttx")
		}
	})
	// InsertForKeyTx reads the shard count in the transaction, then inserts.
	b.Run("InsertForKeyTx", func(b *testing.B) {
		start := time.Now()
		for i := 0; i < b.N; i++ {
			require.NoError(b, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
				_, err := workers.InsertForKeyTx(ctx, tx, fmt.Sprintf("key-%d", i), noopArgs{N: i}, nil)
				return err
			}))
		}
		if insertNs > 0 {
			b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(b.N)/insertNs, "forkey/inserttx")
		}
	})
	b.Run("Dirty", func(b *testing.B) {
		start := time.Now()
		for i := 0; i < b.N; i++ {
			require.NoError(b, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
				return workers.DirtyTx(ctx, tx, "bench", fmt.Sprintf("key-%d", i), nil)
			}))
		}
		dirtyNs = float64(time.Since(start).Nanoseconds()) / float64(b.N)
		if insertNs > 0 {
			b.ReportMetric(dirtyNs/insertNs, "dirty/inserttx")
		}
	})
	b.Run("DirtyCoalesced", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			require.NoError(b, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
				return workers.DirtyTx(ctx, tx, "bench", "hot-key", nil)
			}))
		}
	})
}
