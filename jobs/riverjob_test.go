package jobs

import (
	"context"
	"errors"
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

	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// riverJobStatements are every statement of riverjob.go, by name: each must
// prepare against River's schema as migrated.
func riverJobStatements() map[string]string {
	return map[string]string{
		"jobStateSQL":                jobStateSQL,
		"FenceSQL":                   FenceSQL,
		"countUnfinishedSQL":         countUnfinishedSQL,
		"ClaimDirtySQL":              ClaimDirtySQL,
		"BackfillProgressSQL (Get)":  BackfillProgressSQL + ` WHERE b.name = $1`,
		"BackfillProgressSQL (List)": BackfillProgressSQL + ` ORDER BY b.name`,
		"BackfillLockSQL":            BackfillLockSQL,
		"cancelWaitingSQL":           cancelWaitingSQL,
		"insertBackfillSQL":          insertBackfillSQL,
		"DueSinksSQL":                DueSinksSQL,
		"handBackStaleSinkJobsSQL":   handBackStaleSinkJobsSQL,
		"countRunningLongerSQL":      countRunningLongerSQL,
		"countRunningSQL":            countRunningSQL,
		"dueByQueueSQL":              dueByQueueSQL,
		"runningByAttempterSQL":      runningByAttempterSQL,
		"StartWorkflowsSQL":          StartWorkflowsSQL,
		"StepWorkflowSQL":            StepWorkflowSQL,
		"WakeWorkflowJobSQL":         WakeWorkflowJobSQL,
		"WakeWorkflowParentSQL":      WakeWorkflowParentSQL,
		"WakeDueWorkflowsSQL":        WakeDueWorkflowsSQL,
		"CancelWorkflowJobsSQL":      CancelWorkflowJobsSQL,
		"StuckWorkflowsSQL":          StuckWorkflowsSQL,
		"CancelTenantWorkSQL":        CancelTenantWorkSQL,
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
				if strings.HasSuffix(id.Name, "SQL") && id.Name != "LiveStatesSQL" { // a fragment, checked within DueSinksSQL
					n++
					require.True(t, checked[id.Name], "%s is not in riverJobStatements", id.Name)
				}
			}
		}
	}
	require.Equal(t, len(checked), n, "riverJobStatements names a statement riverjob.go does not declare")
}

// TestRiverJobSchema fails when River's schema changes under our statements:
// every column they name, with the type they assume; every state they use;
// the sequence DirtyTx draws job ids from.
func TestRiverJobSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)

	rows, err := db.Query(ctx, `SELECT a.attname::text, format_type(a.atttypid, a.atttypmod)
FROM pg_attribute a WHERE a.attrelid = 'river_job'::regclass AND a.attnum > 0 AND NOT a.attisdropped`)
	require.NoError(t, err)
	cols := map[string]string{}
	for rows.Next() {
		var name, typ string
		require.NoError(t, rows.Scan(&name, &typ))
		cols[name] = typ
	}
	require.NoError(t, rows.Err())
	for col, typ := range map[string]string{
		"id":           "bigint",
		"args":         "jsonb",
		"kind":         "text",
		"max_attempts": "smallint",
		"priority":     "smallint",
		"queue":        "text",
		"scheduled_at": "timestamp with time zone",
		"state":        "river_job_state",
		"tags":         "character varying(255)[]",
		"metadata":     "jsonb",
		"attempt":      "smallint",
		"attempted_at": "timestamp with time zone",
		"attempted_by": "text[]",
		"errors":       "jsonb[]",
		"finalized_at": "timestamp with time zone",
	} {
		require.Equal(t, typ, cols[col], "river_job.%s", col)
	}

	var labels []string
	require.NoError(t, db.QueryRow(ctx, `SELECT array_agg(enumlabel::text) FROM pg_enum
WHERE enumtypid = 'river_job_state'::regtype`).Scan(&labels))
	require.Subset(t, labels, []string{"available", "cancelled", "completed", "pending", "retryable", "running", "scheduled"})

	// DirtyTx draws the id of its job from the sequence of River's id column.
	var seq *string
	require.NoError(t, db.QueryRow(ctx, `SELECT pg_get_serial_sequence('river_job', 'id')`).Scan(&seq))
	require.NotNil(t, seq, "river_job.id has no sequence")
	var ownSeq string
	require.NoError(t, db.QueryRow(ctx, `SELECT $1::regclass::text`, *seq).Scan(&ownSeq))
	require.Equal(t, "river_job_id_seq", ownSeq)
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
// attempts, priority and queue River exports, and the jobs our statements
// insert match it, in the shard queue jobs promises.
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
		res, err := InsertTx(ctx, tx, testArgs{Key: "by-river"}, nil)
		if err == nil {
			riverID = res.Job.ID
		}
		return err
	})
	byRiver := read(t, `id = $1`, riverID)
	require.Equal(t, river.MaxAttemptsDefault, byRiver.MaxAttempts)
	require.Equal(t, river.PriorityDefault, byRiver.Priority)
	require.Equal(t, river.QueueDefault, byRiver.Queue)

	// DirtyTx puts the key in its shard (SQL and Go agree); a claim by the
	// shard's holder inserts the batch's job running under it, with River's
	// defaults (a key failing alone gets its own job: workers/internal/riverjob
	// checks FailKeySQL).
	inTx(t, func(tx pgx.Tx) error {
		if err := dirtyTx(ctx, tx, "item", "now", 0); err != nil {
			return err
		}
		return dirtyTx(ctx, tx, "item", "later", time.Hour)
	})
	for _, key := range []string{"now", "later"} {
		require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM compute_dirty WHERE key = $1 AND shard = $2 AND job_id IS NULL`,
			key, ShardOf(key, pgtest.DefaultShardCount)), "SQL and Go disagree on the shard of %q", key)
	}
	shard := ShardOf("now", pgtest.DefaultShardCount)
	db.MustExec(t, `INSERT INTO compute_leases (name, owner, epoch, expires_at) VALUES ($1, 'w#1', 3, compute_now() + interval '1 hour')`,
		fmt.Sprintf("shard/%d", shard))
	var batchID, gen int64
	var kind, key string
	require.NoError(t, db.QueryRow(ctx, ClaimDirtySQL, shard, fmt.Sprintf("shard/%d", shard), "w#1", int64(3),
		[]string{"item"}, []int{32}, 32, time.Now(), ShardQueue(shard)).Scan(&batchID, &kind, &key, &gen))
	require.Equal(t, []any{"item", "now", int64(1)}, []any{kind, key, gen}, "only the due key is claimed")
	j := read(t, `id = $1`, batchID)
	require.Equal(t, job{ID: batchID, MaxAttempts: byRiver.MaxAttempts, Priority: byRiver.Priority, Queue: ShardQueue(shard),
		State: "running", Tags: []string{"item"}}, j)
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM river_job WHERE id = $1 AND kind = $2 AND attempt = 1
		AND attempted_by = '{w#1}' AND args = '{"reconciler": "item", "keys": ["now"]}'`, batchID, ReconcileBatchKind))

	// A backfill batch.
	var soon, late int64
	inTx(t, func(tx pgx.Tx) error {
		var err error
		if soon, err = InsertBackfillTx(ctx, tx, BackfillBatch{Name: "fill", Epoch: 1}, ShardQueue(3), 0); err != nil {
			return err
		}
		late, err = InsertBackfillTx(ctx, tx, BackfillBatch{Name: "fill", Epoch: 1, Batch: 1}, ShardQueue(3), ScheduledAfter+time.Second)
		return err
	})
	for id, state := range map[int64]string{soon: "available", late: "scheduled"} {
		j := read(t, `id = $1`, id)
		require.Equal(t, job{ID: id, MaxAttempts: byRiver.MaxAttempts, Priority: byRiver.Priority, Queue: "shard_3", State: state, Tags: []string{backfillTag}}, j)
	}
}

// TestRiverJobFunctions runs every function of riverjob.go on jobs in the
// states it looks for.
func TestRiverJobFunctions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	queue := ShardQueue(ShardOf("k", pgtest.DefaultShardCount))
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
		res, err := InsertTx(ctx, tx, testArgs{Key: "k"}, &river.InsertOpts{Queue: queue})
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
	// A suspended tenant's job is held, not due.
	inTx(t, func(tx pgx.Tx) error {
		_, err := InsertTx(WithTenant(ctx, "held"), tx, testArgs{Key: "k"}, &river.InsertOpts{Queue: queue})
		return err
	})
	db.MustExec(t, `UPDATE compute_tenants SET state = 'suspended' WHERE name = 'held'`)
	depths, err := DueByQueue(ctx, db)
	require.NoError(t, err)
	require.Len(t, depths, 1)
	require.Equal(t, queue, depths[0].Queue)
	require.Equal(t, 1, depths[0].Jobs)
	db.MustExec(t, `DELETE FROM river_job WHERE metadata->>'tenant' = 'held'`)
	counts, err := CountUnfinished(ctx, db)
	require.NoError(t, err)
	require.Equal(t, []QueueCount{{Queue: queue, State: "available", Jobs: 1}}, counts)

	// Running for ten minutes under w#1.
	run(t, id, "w#1", 10*time.Minute)
	n, err := CountRunning(ctx, db)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	n, oldest, err := CountRunningLonger(ctx, db, 5*time.Minute)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.NotNil(t, oldest)
	n, _, err = CountRunningLonger(ctx, db, time.Hour)
	require.NoError(t, err)
	require.Zero(t, n)
	groups, err := RunningByAttempter(ctx, db, time.Now().Add(-time.Minute))
	require.NoError(t, err)
	require.Len(t, groups, 1)
	require.Equal(t, RunningGroup{Queue: queue, Client: "w#1", Jobs: 1, Old: 1, OldestAttempt: groups[0].OldestAttempt}, groups[0])
	require.NotNil(t, groups[0].OldestAttempt)

	stale, err := HandBackStaleSinkJobs(ctx, db, []string{"nosuch"}, OutboxDeliverKind, time.Now(), time.Now())
	require.NoError(t, err)
	require.Zero(t, stale)

	// A waiting job cancelled.
	var waitingID int64
	inTx(t, func(tx pgx.Tx) error {
		res, err := InsertTx(ctx, tx, testArgs{Key: "d"}, &river.InsertOpts{Queue: MaintenanceQueue})
		require.NoError(t, err)
		waitingID = res.Job.ID
		cancelled, err := CancelWaitingTx(ctx, tx, waitingID, time.Now(), "a test")
		require.NoError(t, err)
		require.EqualValues(t, 1, cancelled)
		return nil
	})
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM river_job WHERE id = $1 AND state = 'cancelled'`, waitingID))
}

// TestShardOf: a key's shard is FNV-1a(key) mod the count, and its queue
// shard_<n>, as the package doc promises (TestRiverDefaults checks that DirtyTx's
// SQL agrees).
func TestShardOf(t *testing.T) {
	t.Parallel()
	require.Equal(t, uint32(0x811c9dc5), KeyHash(""))
	require.Equal(t, uint32(0xe40c292c), KeyHash("a"))
	require.Equal(t, 0xe40c292c%16, ShardOf("a", 16))
	require.Equal(t, 0, ShardOf("a", 1))
	require.Equal(t, "shard_0", ShardQueue(0))
	require.Equal(t, "shard_12", ShardQueue(12))
}

// TestWorkflowFunctionsWriteTheJobsGoExpects: compute_workflow_start and
// compute_workflow_advance (migrations/workflow/0004) spell the step job's
// kind, attempts, priority, queue and cause in SQL; they are the ones the Go
// side names (WorkflowStepKind, river.MaxAttemptsDefault,
// river.PriorityDefault, ShardQueue, TraceparentKey). compute_workflow_step
// (0005) writes the history row of the step it moves, and none when no
// outcome is named.
func TestWorkflowFunctionsWriteTheJobsGoExpects(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	db.MustExec(t, `INSERT INTO compute_workflow_kinds (kind, steps) VALUES ('order', '{a,b}')`)
	const cause = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	var shards int
	require.NoError(t, db.QueryRow(ctx, `SELECT shard_count FROM compute_settings`).Scan(&shards))
	err := pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		rows, err := tx.Query(ctx, StartWorkflowsSQL, []string{"w1", "w2"}, []string{"order", "nope"},
			[]string{`{}`, `{}`}, []int64{int64(KeyHash("w1")), int64(KeyHash("w2"))}, nil, nil, time.Now(), cause, nil)
		if err != nil {
			return err
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		require.Equal(t, []string{"w1"}, ids, "an unknown kind inserts nothing")
		var seq int64
		var jobID *int64
		if err := tx.QueryRow(ctx, StepWorkflowSQL, "w1", int64(1), "running", "b", nil, nil, nil, nil, nil,
			true, "shard_0", time.Now(), "available", 7, cause, nil,
			"a", "goto", "b", 3, int64(41), int64(9), nil, nil).Scan(&seq, &jobID); err != nil {
			return err
		}
		require.EqualValues(t, 2, seq)
		require.NotNil(t, jobID)
		if err := tx.QueryRow(ctx, StepWorkflowSQL, "w1", int64(2), "running", "b", nil, nil, nil, nil, nil,
			false, "", time.Now(), "available", 7, nil, *jobID,
			nil, nil, nil, 0, nil, nil, nil, nil).Scan(&seq, &jobID); err != nil {
			return err
		}
		require.EqualValues(t, 3, seq)
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = $1 AND max_attempts = $2
		AND priority = $3 AND queue = $4 AND metadata->>$5 = $6 AND args->>'step' = 'a'`,
		WorkflowStepKind, river.MaxAttemptsDefault, river.PriorityDefault, ShardQueue(ShardOf("w1", shards)), TraceparentKey, cause))
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = $1 AND max_attempts = 7
		AND priority = $2 AND queue = 'shard_0' AND metadata->>$3 = $4 AND args->>'step' = 'b' AND (args->>'seq')::int = 2`,
		WorkflowStepKind, river.PriorityDefault, TraceparentKey, cause))
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM compute_workflow_history WHERE workflow_id = 'w1' AND seq = 1
		AND step = 'a' AND outcome = 'goto' AND next_step = 'b' AND attempt = 3 AND job_id = 41 AND lease_epoch = 9
		AND error IS NULL`))
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM compute_workflow_history WHERE workflow_id = 'w1'`),
		"a move with no outcome writes no history row")
}

// TestTheStepLockFencesAsFenceSQLDoes: compute_workflow_lock (migrations/
// workflow/0005) holds or refuses as FenceSQL does, and FenceRaised reads its
// refusals: a lease at another epoch or expired is FenceLeaseLost, a job not
// running the attempt FenceJobStale; when both hold it returns the workflow's
// row, and no row for a workflow that is gone.
func TestTheStepLockFencesAsFenceSQLDoes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	db.MustExec(t, `INSERT INTO compute_leases (name, owner, epoch, expires_at) VALUES
		('shard/1', 'w#1', 3, compute_now() + interval '1 hour'), ('shard/2', 'w#1', 3, compute_now() - interval '1 second')`)
	db.MustExec(t, `INSERT INTO compute_workflows (id, kind, status, step, input) VALUES ('w1', 'order', 'running', 'a', '{}')`)
	var job int64
	require.NoError(t, db.QueryRow(ctx, `INSERT INTO river_job (args, kind, max_attempts, queue, state, attempt)
		VALUES ('{}', 'workflow_step', 25, 'shard_1', 'running', 2) RETURNING id`).Scan(&job))
	const lock = `SELECT id, seq FROM compute_workflow_lock($1, $2, $3, $4, $5, $6)`
	errRefused := errors.New("refused")
	for _, c := range []struct {
		name    string
		lease   string
		epoch   int64
		attempt int
		id      string
		want    int
		found   bool
	}{
		{"both hold", "shard/1", 3, 2, "w1", FenceHeld, true},
		{"the workflow is gone", "shard/1", 3, 2, "nope", FenceHeld, false},
		{"another epoch", "shard/1", 4, 2, "w1", FenceLeaseLost, false},
		{"an expired lease", "shard/2", 3, 2, "w1", FenceLeaseLost, false},
		{"another attempt", "shard/1", 3, 1, "w1", FenceJobStale, false},
	} {
		err := pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
			var id string
			var seq int64
			err := tx.QueryRow(ctx, lock, c.lease, "w#1", c.epoch, job, c.attempt, c.id).Scan(&id, &seq)
			if errors.Is(err, pgx.ErrNoRows) {
				require.False(t, c.found, c.name)
				return nil
			}
			got, err := FenceRaised(err)
			require.Equal(t, c.want, got, c.name)
			if got != FenceHeld {
				require.NoError(t, err, c.name)
				return errRefused // the raise aborted the transaction
			}
			require.NoError(t, err, c.name)
			require.True(t, c.found, c.name)
			require.Equal(t, []any{"w1", int64(1)}, []any{id, seq}, c.name)
			return nil
		})
		if c.want != FenceHeld {
			require.ErrorIs(t, err, errRefused, c.name)
			continue
		}
		require.NoError(t, err, c.name)
	}
	got, err := FenceRaised(fmt.Errorf("wrapped: %w", pgx.ErrNoRows))
	require.Equal(t, FenceHeld, got)
	require.ErrorIs(t, err, pgx.ErrNoRows, "an error that is no fence's is returned as it is")
}

// dirtyTx marks key of kind dirty after delay, as workers.DirtyTx does (which
// this package's tests cannot import).
func dirtyTx(ctx context.Context, tx pgx.Tx, kind, key string, delay time.Duration) error {
	_, err := tx.Exec(ctx, `SELECT compute_mark_dirty($1, $2, $3::float8, $4::bigint, NULL)`, kind, key, delay.Seconds(), int64(KeyHash(key)))
	return err
}

// testArgs are the args of a job of no kind of this module's, that River
// inserts with its defaults.
type testArgs struct {
	Key string `json:"key"`
}

func (testArgs) Kind() string { return "test_job" }
