package cli

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/domain/backfill"
	"github.com/bettercompute/bettercompute/domain/outbox"
	"github.com/bettercompute/bettercompute/domain/outbox/outboxtest"
	"github.com/bettercompute/bettercompute/domain/workflow"
	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/config"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/outboxworker"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

// The metrics tests' application (mx): a reconciler, a fenced task whose first
// attempt finds its lease taken (a FENCED refusal), a sink, a dispatcher whose
// key "bad" never publishes, a backfill over 50 rows and a one-step workflow.

type mxTask struct{}

func (mxTask) Kind() string { return "mx_task" }

type mxTaskWorker struct {
	river.WorkerDefaults[mxTask]
	db      *pg.Pool
	stolen  atomic.Bool
	attempt atomic.Int32
}

// Work takes its shard's lease away from under itself once (as a takeover
// would, by moving the epoch), so its fenced transaction is refused.
func (w *mxTaskWorker) Work(ctx context.Context, job *river.Job[mxTask]) error {
	w.attempt.Add(1)
	if w.db != nil && w.stolen.CompareAndSwap(false, true) {
		n, _ := strconv.Atoi(strings.TrimPrefix(job.Queue, jobs.ShardQueuePrefix))
		if _, err := w.db.Exec(ctx, `UPDATE compute_leases SET epoch = epoch + 1 WHERE name = $1`, workers.ShardLease(n)); err != nil {
			return err
		}
	}
	// Not cancelled when the keeper notices the loss first (that attempt would end
	// FENCED without reaching its fence): the fenced transaction itself is refused.
	return workers.InTx(context.WithoutCancel(ctx), job, func(context.Context, pgx.Tx) error { return nil })
}

type mxRow struct {
	ID int64  `json:"id"`
	K  string `json:"k"`
}

func mxFill() workers.Backfill {
	return workers.Backfill{
		Name: "mx_fill",
		Batch: func(ctx context.Context, tx pgx.Tx, n int) (int, error) {
			tag, err := tx.Exec(ctx, `UPDATE mx_items SET done = true WHERE id = ANY (ARRAY(
				SELECT id FROM mx_items WHERE NOT done ORDER BY id LIMIT $1 FOR UPDATE))`, n)
			return int(tag.RowsAffected()), err
		},
		Estimate: func(ctx context.Context, db pg.DBTX) (int64, error) {
			var n int64
			err := db.QueryRow(ctx, `SELECT count(*) FROM mx_items WHERE NOT done`).Scan(&n)
			return n, err
		},
	}
}

func mxFlow() *workflow.Workflow[struct{}, struct{}, string] {
	return &workflow.Workflow[struct{}, struct{}, string]{
		Kind: "mx_flow",
		Steps: []workflow.Step[struct{}]{{Name: "first", Tx: func(context.Context, pgx.Tx, *workflow.Call[struct{}]) (workflow.Next, error) {
			return workflow.Finish("done"), nil
		}}},
	}
}

// mxApp is the application; task, if not nil, works mx_task.
func mxApp(task *mxTaskWorker) *App {
	if task == nil {
		task = &mxTaskWorker{}
	}
	return &App{Name: "mx", Modules: []Module{{
		Name: "mx",
		Migrations: fstest.MapFS{"0001_mx.sql": {Data: []byte(`
CREATE TABLE mx_outbox (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, k text NOT NULL,
    attempts int NOT NULL DEFAULT 0, next_attempt_at timestamptz NOT NULL DEFAULT compute_now(),
    claimed_until timestamptz, last_error text);
CREATE INDEX mx_outbox_busy ON mx_outbox (k) WHERE claimed_until IS NOT NULL OR attempts > 0;
CREATE TABLE mx_items (id bigint PRIMARY KEY, done bool NOT NULL DEFAULT false);
INSERT INTO mx_items (id) SELECT g FROM generate_series(1, 50) g;`)}},
		Register: func(r *workers.Registry) error {
			d, err := outboxworker.NewDispatcher(outboxworker.DispatcherOptions[mxRow]{
				Name: "mx_disp", Table: "mx_outbox", OrderBy: "k", Sequence: "id",
				Publish: func(_ context.Context, row mxRow) error {
					if row.K == "bad" {
						return errors.New("the receiver refuses key bad")
					}
					return nil
				},
			})
			if err != nil {
				return err
			}
			return errors.Join(
				workers.AddReconciler(r, workers.Reconciler{Kind: "mx_item", Reconcile: func(context.Context, pgx.Tx, string) (workers.Result, error) {
					return workers.Result{}, nil
				}}),
				workers.AddWorker(r, task),
				workers.AddSink(r, workers.Sink{Name: "mx_sink", Handle: func(context.Context, []outbox.Event) error { return nil }}),
				outboxworker.AddDispatcher(r, d),
				workers.AddBackfill(r, mxFill()),
				workers.AddWorkflow(r, mxFlow()),
			)
		},
	}}}
}

// mxSession is a Session of app on a fresh database, migrated.
func mxSession(t *testing.T, app *App) (*Session, *pgtest.DB) {
	t.Helper()
	db := pgtest.New(t)
	cfg, err := config.Load([]string{"BETTER_COMPUTE_DATABASE_URL=" + db.URL, "BETTER_COMPUTE_LOG_LEVEL=warn"})
	require.NoError(t, err)
	s := &Session{App: app, Config: cfg, Env: Env{Stdout: &lockedBuffer{}, Stderr: &lockedBuffer{}}}
	t.Cleanup(s.close)
	_, err = s.Migrate(context.Background())
	require.NoError(t, err)
	return s, db
}

// sample is one gathered value: its family's type and its labels' values,
// joined by "," in label name order.
type sample struct {
	typ    dto.MetricType
	values map[string]float64
}

// gatherAll gathers g and returns every family by name, and the error of the
// gathering (an invalid metric's, say).
func gatherAll(g prometheus.Gatherer) (map[string]sample, error) {
	mfs, err := g.Gather()
	out := map[string]sample{}
	for _, mf := range mfs {
		s := sample{typ: mf.GetType(), values: map[string]float64{}}
		for _, m := range mf.GetMetric() {
			var key []string
			for _, l := range m.GetLabel() {
				key = append(key, l.GetValue())
			}
			v := 0.0
			switch {
			case m.Gauge != nil:
				v = m.GetGauge().GetValue()
			case m.Counter != nil:
				v = m.GetCounter().GetValue()
			case m.Histogram != nil:
				v = float64(m.GetHistogram().GetSampleCount())
			}
			s.values[strings.Join(key, ",")] = v
		}
		out[mf.GetName()] = s
	}
	return out, err
}

// TestServeMetricsReportTheDatabase: each gauge serve reads from the database
// reports a constructed state: a job waiting 10 minutes and one running 7, an
// unheld shard with work and a held one, a sink 3 events behind and paused, a
// dispatcher table with 4 rows and one failing key, an open write transaction
// holding events back, a backfill's progress and its stall, a workflow due on
// its step for 15 minutes and then without a job; and a query that fails makes
// its metrics invalid, which the scrape reports by name.
func TestServeMetricsReportTheDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, db := mxSession(t, mxApp(nil))
	reg, err := s.serveRegistry(db.Pool)
	require.NoError(t, err)
	gather := func() map[string]sample {
		t.Helper()
		got, err := gatherAll(reg)
		require.NoError(t, err)
		return got
	}

	// Jobs and shards: shard 3 has a job due 10 minutes ago and one running for
	// 7; nobody holds it. Someone holds shard 5.
	db.MustExec(t, `INSERT INTO river_job (args, kind, max_attempts, queue, state, scheduled_at)
		VALUES ('{}', 'mx_waiting', 25, 'shard_3', 'available', clock_timestamp() - interval '10 minutes')`)
	db.MustExec(t, `INSERT INTO river_job (args, kind, max_attempts, queue, state, scheduled_at, attempt, attempted_at, attempted_by)
		VALUES ('{}', 'mx_long', 25, 'shard_3', 'running', clock_timestamp() - interval '8 minutes', 1,
		        clock_timestamp() - interval '7 minutes', ARRAY['gone#1'])`)
	db.MustExec(t, `INSERT INTO compute_leases (name, owner, epoch, expires_at) VALUES ('shard/5', 'other#1', 1, compute_now() + interval '1 hour')`)
	db.MustExec(t, `INSERT INTO river_job (args, kind, max_attempts, queue, state) VALUES ('{}', 'mx_waiting', 25, 'shard_5', 'available')`)
	got := gather()
	const slack = 60 // seconds: a loaded machine between the insert and the scrape
	require.InDelta(t, 600, got["bettercompute_queue_oldest_seconds"].values["shard_3"], slack, "the job due 10 minutes ago")
	require.InDelta(t, 420, got["bettercompute_running_oldest_seconds"].values["mx_long,shard_3"], slack, "the job running for 7 minutes")
	require.Equal(t, float64(pgtest.DefaultShardCount), got["bettercompute_shards"].values[""])
	require.Equal(t, 0.0, got["bettercompute_shard_held"].values["shard_3"])
	require.Equal(t, 1.0, got["bettercompute_shard_held"].values["shard_5"])
	require.Len(t, got["bettercompute_shard_held"].values, pgtest.DefaultShardCount, "every shard")
	require.Equal(t, 1.0, got["bettercompute_shard_waiting"].values["shard_3"], "the available job")
	require.Equal(t, 1.0, got["bettercompute_shards_unheld_waiting"].values[""], "shard 3 only: shard 5 has work and a holder, the others nothing waiting")

	// Workers: one beat 4 s ago and may be silent 2 s; it held shard 6, which
	// another took when its heartbeat stopped.
	db.MustExec(t, `INSERT INTO compute_workers (identity, incarnation, host, pid, seen_at, dead_after)
		VALUES ('mx-host/0', 1, 'mx-host', 1, compute_now() - interval '4 seconds', interval '2 seconds')`)
	db.MustExec(t, `INSERT INTO compute_leases (name, owner, epoch, expires_at) VALUES ('shard/6', 'mx-host/0#1', 1, compute_now() + interval '1 hour')`)
	workertest.HoldLeases(t, db.Pool, "mx-standby#1", time.Minute, "shard/6")
	got = gather()
	require.InDelta(t, 4, got["bettercompute_worker_heartbeat_age_seconds"].values["mx-host/0"], slack)
	require.Equal(t, 2.0, got["bettercompute_worker_dead_after_seconds"].values["mx-host/0"])
	require.Equal(t, 1.0, got["bettercompute_lease_changes_total"].values["heartbeat_lost"])

	// The sink: three events behind, the first two minutes old; paused.
	require.NoError(t, outbox.EnsureSink(ctx, db.Pool, "mx_sink", outbox.Start))
	for i := range 3 {
		outboxtest.Append(t, db.Pool, "mx", "k", map[string]int{"n": i})
	}
	db.MustExec(t, `UPDATE compute_events SET created_at = created_at - interval '2 minutes'`)
	require.NoError(t, outbox.PauseSink(ctx, db.Pool, "mx_sink"))

	// The dispatcher's table: 4 rows, key bad's head failed once.
	db.MustExec(t, `INSERT INTO mx_outbox (k) VALUES ('good'), ('good'), ('bad'), ('bad')`)
	db.MustExec(t, `UPDATE mx_outbox SET attempts = 1, next_attempt_at = compute_now() + interval '1 hour'
		WHERE id = (SELECT min(id) FROM mx_outbox WHERE k = 'bad')`)

	// The backfill: started (its batch job waits, no worker runs), 20 of 50 done.
	_, err = backfill.Start(ctx, db.Pool, mxFill().Name, mxFill().Estimate)
	require.NoError(t, err)
	db.MustExec(t, `UPDATE compute_backfills SET rows_done = 20, rows_estimate = 50 WHERE name = 'mx_fill'`)

	// The workflow: on step first for 15 minutes.
	var wfID string
	require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		wfID, err = startKind(ctx, tx, "mx_flow", struct{}{}, nil)
		return err
	}))
	db.MustExec(t, `UPDATE compute_workflows SET updated_at = updated_at - interval '15 minutes' WHERE id = $1`, wfID)

	// An event is readable once every older transaction of the cluster has
	// ended (another test's may still be open): until then its age is not the lag.
	pollUntil(t, 30*time.Second, "the sink's lag age (its events readable)", func() bool {
		got = gather()
		return got["bettercompute_outbox_sink_lag_seconds"].values["mx_sink"] > 0
	})
	require.Equal(t, 3.0, got["bettercompute_outbox_sink_lag_events"].values["mx_sink"])
	require.InDelta(t, 120, got["bettercompute_outbox_sink_lag_seconds"].values["mx_sink"], slack)
	require.Equal(t, 1.0, got["bettercompute_outbox_sink_paused"].values["mx_sink"])
	require.Equal(t, 0.0, got["bettercompute_outbox_sink_failures"].values["mx_sink"])
	require.Equal(t, 4.0, got["bettercompute_outbox_dispatcher_backlog"].values["mx_disp"])
	require.Equal(t, 1.0, got["bettercompute_outbox_dispatcher_failing_keys"].values["mx_disp"])

	require.Equal(t, 20.0, got["bettercompute_backfill_rows_done"].values["mx_fill,running"])
	require.Equal(t, 50.0, got["bettercompute_backfill_rows_estimate"].values["mx_fill"])
	require.Equal(t, 0.0, got["bettercompute_backfill_stalled"].values["mx_fill"], "its batch job is live")

	require.InDelta(t, 900, got["bettercompute_workflow_step_oldest_seconds"].values["first,mx_flow"], slack)
	require.Equal(t, 1.0, got["bettercompute_workflow_steps_due"].values["first,mx_flow"])
	require.Equal(t, 0.0, got["bettercompute_workflows_without_job"].values[""])

	// Their jobs gone, the backfill has stalled and the workflow has no job.
	db.MustExec(t, `DELETE FROM river_job WHERE kind IN ($1, $2)`, jobs.BackfillBatch{Name: "mx_fill"}.Kind(), jobs.WorkflowStepKind)
	got = gather()
	require.Equal(t, 1.0, got["bettercompute_backfill_stalled"].values["mx_fill"])
	require.Equal(t, 1.0, got["bettercompute_workflows_without_job"].values[""])

	// A write transaction open in another connection holds back the events
	// committed after it began.
	long, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = long.Rollback(ctx) }()
	_, err = long.Exec(ctx, `SELECT pg_current_xact_id()`)
	require.NoError(t, err)
	outboxtest.Append(t, db.Pool, "mx", "k", 3)
	outboxtest.Append(t, db.Pool, "mx", "k", 4)
	var last map[string]sample
	pollUntil(t, 30*time.Second, "the open transaction's age reaching 1 s", func() bool {
		last = gather()
		return last["bettercompute_outbox_oldest_write_transaction_seconds"].values[""] >= 1
	})
	require.GreaterOrEqual(t, last["bettercompute_outbox_events_held_back"].values[""], 2.0, "the two events committed after it began")
	require.NoError(t, long.Rollback(ctx))

	// A query that fails: its metrics are invalid and the scrape says which.
	for table, families := range map[string][]string{
		"river_job":               {"bettercompute_queue_oldest_seconds", "bettercompute_running_oldest_seconds", "bettercompute_shards_unheld_waiting"},
		"compute_leases":          {"bettercompute_shard_held", "bettercompute_shards_unheld_waiting", "bettercompute_worker_heartbeat_age_seconds"},
		"compute_workers":         {"bettercompute_worker_heartbeat_age_seconds", "bettercompute_worker_dead_after_seconds"},
		"compute_lease_takeovers": {"bettercompute_lease_changes_total"},
		"compute_sinks":           {"bettercompute_outbox_sink_lag_events", "bettercompute_outbox_sink_paused"},
		"mx_outbox":               {"bettercompute_outbox_dispatcher_backlog", "bettercompute_outbox_dispatcher_failing_keys"},
		"compute_events":          {"bettercompute_outbox_events_held_back"},
		"compute_backfills":       {"bettercompute_backfill_rows_done", "bettercompute_backfill_stalled"},
		"compute_workflows":       {"bettercompute_workflow_step_oldest_seconds", "bettercompute_workflows_without_job"},
	} {
		db.MustExec(t, `ALTER TABLE `+table+` RENAME TO mx_renamed`)
		_, err := gatherAll(reg)
		db.MustExec(t, `ALTER TABLE mx_renamed RENAME TO `+table)
		require.Error(t, err, "with %s renamed", table)
		for _, f := range families {
			require.Contains(t, err.Error(), `"`+f+`"`, "with %s renamed, the scrape names %s", table, f)
		}
	}
	gather() // all well again
}

// pollUntil polls cond every 20 ms until it holds, failing with what was
// awaited (and detail's last word, if given) after timeout.
func pollUntil(t *testing.T, timeout time.Duration, what string, cond func() bool, detail ...func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			more := ""
			for _, d := range detail {
				more += "\n" + d()
			}
			t.Fatalf("timed out after %s waiting for %s%s", timeout, what, more)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestAModuleBringsItsOwnMetrics: an application's Module.Metrics collectors
// are in serve's registry beside the built-in modules', and one that collides
// with a name already there is INVALID_CONFIG naming the module.
func TestAModuleBringsItsOwnMetrics(t *testing.T) {
	t.Parallel()
	orders := prometheus.NewGauge(prometheus.GaugeOpts{Name: "shop_orders_open", Help: "Orders not shipped yet."})
	orders.Set(3)
	app := mxApp(nil)
	app.Modules = append(app.Modules, Module{Name: "shop",
		Metrics: func(*pg.Pool, *workers.Registry) ([]prometheus.Collector, error) {
			return []prometheus.Collector{orders}, nil
		}})
	s, db := mxSession(t, app)
	reg, err := s.serveRegistry(db.Pool)
	require.NoError(t, err)
	got, err := gatherAll(reg)
	require.NoError(t, err)
	require.Equal(t, 3.0, got["shop_orders_open"].values[""])
	require.Contains(t, got, "bettercompute_workflows_without_job", "the built-in modules' collectors too")

	app.Modules = append(app.Modules, Module{Name: "again",
		Metrics: func(*pg.Pool, *workers.Registry) ([]prometheus.Collector, error) {
			return []prometheus.Collector{orders}, nil
		}})
	s, db = mxSession(t, app)
	_, err = s.serveRegistry(db.Pool)
	require.Equal(t, fault.InvalidConfig, fault.CodeOf(err))
	require.ErrorContains(t, err, "module again")
}
