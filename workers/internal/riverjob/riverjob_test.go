package riverjob

import (
	"context"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// riverJobStatements are every statement of riverjob.go, by name: each must
// prepare against River's schema as migrated (whose columns and states
// jobs' TestRiverJobSchema pins).
func riverJobStatements() map[string]string {
	return map[string]string{
		"anotherAttemptRunningSQL":     anotherAttemptRunningSQL,
		"handBackShardJobsSQL":         handBackShardJobsSQL,
		"handBackOwnRunningSQL":        handBackOwnRunningSQL,
		"handBackEarlierSQL":           handBackEarlierSQL,
		"ReadClaimedSQL":               ReadClaimedSQL,
		"DueWorkSQL":                   DueWorkSQL,
		"FinishBatchSQL":               FinishBatchSQL,
		"TakeDirtySQL":                 TakeDirtySQL,
		"FinishTakenSQL":               FinishTakenSQL,
		"FailKeySQL":                   FailKeySQL,
		"outboxDispatchWaitingSQL":     outboxDispatchWaitingSQL,
		"OverdueHoldsSQL":              OverdueHoldsSQL,
		"countWaitingInShardQueuesSQL": countWaitingInShardQueuesSQL,
		"oldestRunningSQL":             oldestRunningSQL,
		"CompleteJobSQL":               CompleteJobSQL,
		"HandOverWorkflowSQL":          HandOverWorkflowSQL,
	}
}

// TestEveryStatementIsChecked: every …SQL declared in riverjob.go is in
// riverJobStatements, so a new statement cannot skip the checks below.
func TestEveryStatementIsChecked(t *testing.T) {
	t.Parallel()
	f, err := parser.ParseFile(token.NewFileSet(), "riverjob.go", nil, 0)
	require.NoError(t, err)
	checked := map[string]bool{}
	for name := range riverJobStatements() {
		name, _, _ = strings.Cut(name, " (")
		checked[name] = true
	}
	n := 0
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || (g.Tok != token.CONST && g.Tok != token.VAR) {
			continue
		}
		for _, spec := range g.Specs {
			for _, id := range spec.(*ast.ValueSpec).Names {
				if strings.HasSuffix(id.Name, "SQL") {
					n++
					require.True(t, checked[id.Name], "%s is not in riverJobStatements", id.Name)
				}
			}
		}
	}
	require.Equal(t, len(checked), n, "riverJobStatements names a statement riverjob.go does not declare")
}

// TestRiverJobStatementsPrepare: every statement parses and plans against the
// migrated schema, so a renamed column, table, type or state fails here.
func TestRiverJobStatementsPrepare(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	conn, err := db.Acquire(ctx)
	require.NoError(t, err)
	t.Cleanup(conn.Release)
	for name, sql := range riverJobStatements() {
		t.Run(name, func(t *testing.T) {
			// Parse and describe only, outside a transaction: nothing runs,
			// and one failure does not hide the next.
			_, err := conn.Conn().PgConn().Prepare(ctx, "", sql, nil)
			require.NoError(t, err, "%s does not prepare against River's schema:\n%s", name, sql)
		})
	}
}

// TestRiverDefaults: a job River inserts with default options has the
// attempts, priority and queue River exports, and the job FailKeySQL inserts
// for a key a claim (jobs.ClaimDirtySQL) took matches it, in the shard queue
// jobs promises.
func TestRiverDefaults(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)

	type job struct {
		ID          int64
		MaxAttempts int
		Priority    int
		Queue       string
		State       string
		Tags        []string
	}
	read := func(t *testing.T, where string, args ...any) job {
		t.Helper()
		var j job
		require.NoError(t, db.QueryRow(ctx, `SELECT id, max_attempts, priority, queue, state::text, tags FROM river_job WHERE `+where, args...).
			Scan(&j.ID, &j.MaxAttempts, &j.Priority, &j.Queue, &j.State, &j.Tags))
		return j
	}
	inTx := func(t *testing.T, fn func(tx pgx.Tx) error) {
		t.Helper()
		require.NoError(t, pg.InTx(ctx, db.Pool, func(_ context.Context, tx pgx.Tx) error { return fn(tx) }))
	}

	var riverID int64
	inTx(t, func(tx pgx.Tx) error {
		res, err := jobs.InsertTx(ctx, tx, Reconcile{Reconciler: "item", Key: "by-river"}, nil)
		if err == nil {
			riverID = res.Job.ID
		}
		return err
	})
	byRiver := read(t, `id = $1`, riverID)
	require.Equal(t, river.MaxAttemptsDefault, byRiver.MaxAttempts)
	require.Equal(t, river.PriorityDefault, byRiver.Priority)
	require.Equal(t, river.QueueDefault, byRiver.Queue)

	// A claim by the shard's holder (jobs.ClaimDirtySQL, which jobs checks)
	// takes the due key; failing alone, it gets its own job, retryable.
	inTx(t, func(tx pgx.Tx) error {
		if err := dirtyTx(ctx, tx, "item", "now", 0); err != nil {
			return err
		}
		return dirtyTx(ctx, tx, "item", "later", time.Hour)
	})
	shard := jobs.ShardOf("now", pgtest.DefaultShardCount)
	db.MustExec(t, `INSERT INTO compute_leases (name, owner, epoch, expires_at) VALUES ($1, 'w#1', 3, compute_now() + interval '1 hour')`,
		fmt.Sprintf("shard/%d", shard))
	var batchID, gen int64
	var kind, key string
	require.NoError(t, db.QueryRow(ctx, jobs.ClaimDirtySQL, shard, fmt.Sprintf("shard/%d", shard), "w#1", int64(3),
		[]string{"item"}, []int{32}, 32, time.Now(), jobs.ShardQueue(shard)).Scan(&batchID, &kind, &key, &gen))
	require.Equal(t, []any{"item", "now", int64(1)}, []any{kind, key, gen}, "only the due key is claimed")
	db.MustExec(t, FailKeySQL, batchID, "item", "now", jobs.ShardQueue(shard), `{"reconciler":"item","key":"now"}`, "it failed",
		time.Now().Add(time.Second), time.Now(), "w#1", 1.0)
	var ownID int64
	require.NoError(t, db.QueryRow(ctx, `SELECT job_id FROM compute_dirty WHERE key = 'now'`).Scan(&ownID))
	j := read(t, `id = $1`, ownID)
	require.Equal(t, job{ID: ownID, MaxAttempts: byRiver.MaxAttempts, Priority: byRiver.Priority, Queue: jobs.ShardQueue(shard),
		State: "retryable", Tags: []string{"item"}}, j)
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM river_job WHERE id = $1 AND kind = $2 AND attempt = 1
		AND errors[1]->>'error' = 'it failed'`, ownID, ReconcileKind))
}

// TestRiverJobFunctions runs every function of riverjob.go on jobs in the
// states it looks for.
func TestRiverJobFunctions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	queue := jobs.ShardQueue(jobs.ShardOf("k", pgtest.DefaultShardCount))
	inTx := func(t *testing.T, fn func(tx pgx.Tx) error) {
		t.Helper()
		require.NoError(t, pg.InTx(ctx, db.Pool, func(_ context.Context, tx pgx.Tx) error { return fn(tx) }))
	}
	// run marks job id running, attempted by owner at.
	run := func(t *testing.T, id int64, owner string, at time.Duration) {
		t.Helper()
		db.MustExec(t, `UPDATE river_job SET state = 'running', attempt = attempt + 1,
attempted_at = clock_timestamp() - make_interval(secs => $2), attempted_by = array_append(attempted_by, $3) WHERE id = $1`,
			id, at.Seconds(), owner)
	}

	var id int64
	inTx(t, func(tx pgx.Tx) error {
		res, err := jobs.InsertTx(ctx, tx, Reconcile{Reconciler: "item", Key: "k"}, &river.InsertOpts{Queue: queue})
		if err != nil {
			return err
		}
		id = res.Job.ID
		// A due dirty key waits for the shard's holder too; a later one not yet.
		if err := dirtyTx(ctx, tx, "item", "k", 0); err != nil {
			return err
		}
		return dirtyTx(ctx, tx, "item", "later", time.Hour)
	})
	waiting, err := CountWaitingInShardQueues(ctx, db)
	require.NoError(t, err)
	require.Equal(t, map[string]int{queue: 2}, waiting, "the job and the due dirty key")

	// Running for ten minutes under w#1.
	run(t, id, "w#1", 10*time.Minute)
	ages, err := OldestRunning(ctx, db)
	require.NoError(t, err)
	require.Len(t, ages, 1)
	require.Equal(t, queue, ages[0].Queue)
	require.Equal(t, Reconcile{}.Kind(), ages[0].Kind)
	require.Equal(t, 1, ages[0].Jobs)
	require.InDelta(t, (10 * time.Minute).Seconds(), ages[0].Oldest.Seconds(), 60, "attempted ten minutes ago")

	// Hand-backs: each returns a running job to available.
	back := func(t *testing.T, owner string, fn func() (int64, error)) {
		t.Helper()
		db.MustExec(t, `UPDATE river_job SET state = 'available', finalized_at = NULL WHERE id = $1`, id)
		run(t, id, owner, time.Hour)
		n, err := fn()
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
		require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM river_job WHERE id = $1 AND state = 'available'`, id))
	}
	back(t, "w#1", func() (int64, error) { return HandBackOwnRunning(ctx, db, []string{queue}, "w#1") })
	back(t, "w#1", func() (int64, error) {
		db.MustExec(t, `INSERT INTO compute_leases (name, owner, epoch, expires_at) VALUES ('shard/x', 'w#2', 7, compute_now() + interval '1 hour')`)
		queues, err := HandBackShardJobs(ctx, db, &HandBackParams{Leases: []string{"shard/x"}, Epochs: []int64{7}, Queues: []string{queue},
			Owner: "w#2", At: time.Now(), When: "in a test", Working: []int64{}, OwnAfter: time.Minute})
		return int64(len(queues)), err
	})
	db.MustExec(t, `UPDATE river_job SET queue = $2 WHERE id = $1`, id, jobs.MaintenanceQueue)
	back(t, "ident#1", func() (int64, error) { return HandBackEarlierIncarnation(ctx, db, "ident", "ident#2", time.Now()) })

	// A waiting dispatch job.
	inTx(t, func(tx pgx.Tx) error {
		_, err := jobs.InsertTx(ctx, tx, OutboxDispatch{Dispatcher: "d"}, &river.InsertOpts{Queue: jobs.MaintenanceQueue})
		require.NoError(t, err)
		for name, want := range map[string]bool{"d": true, "e": false} {
			waiting, err := OutboxDispatchWaitingTx(ctx, tx, name)
			require.NoError(t, err)
			require.Equal(t, want, waiting, name)
		}
		return nil
	})
}

// dirtyTx marks key of kind dirty after delay, as workers.DirtyTx does (which
// this package's tests cannot import).
func dirtyTx(ctx context.Context, tx pgx.Tx, kind, key string, delay time.Duration) error {
	_, err := tx.Exec(ctx, `SELECT compute_mark_dirty($1, $2, $3::float8, $4::bigint, NULL)`, kind, key, delay.Seconds(), int64(jobs.KeyHash(key)))
	return err
}
