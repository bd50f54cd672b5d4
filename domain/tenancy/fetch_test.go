package tenancy_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/domain/tenancy"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
)

// insertJobs puts n available jobs of tenant (or none, "") in queue shard_0.
func insertJobs(t *testing.T, db *pgtest.DB, tenant string, n int) {
	t.Helper()
	if tenant != "" {
		db.MustExec(t, `SELECT compute_tenant_use($1)`, tenant)
	}
	db.MustExec(t, `INSERT INTO river_job (args, kind, max_attempts, priority, queue, scheduled_at, state, metadata)
SELECT '{}', 'k', 25, 1, 'shard_0', clock_timestamp() - interval '1 hour' + g * interval '1 ms', 'available',
       CASE WHEN $1 = '' THEN '{}'::jsonb ELSE jsonb_build_object('tenant', $1::text) END
FROM generate_series(1, $2) g`, tenant, n)
}

// fetch runs compute_fetch_jobs for up to max jobs and returns their tenants, in order.
func fetch(t *testing.T, db *pgtest.DB, max int) []string {
	t.Helper()
	rows, err := db.Query(context.Background(), `SELECT coalesce(metadata->>'tenant', '') FROM compute_fetch_jobs('shard_0', $1, $2, 'me', 100, NULL) ORDER BY id`, max, time.Now())
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return out
}

// TestTheFetchTakesTenantsRoundRobinWithinTheirLimits: tenant a's backlog of
// 1,000 jobs, older than b's 3 and the 2 of no tenant, does not keep them
// waiting: one fetch of 8 takes b's and the plain ones with a's first; a
// never runs more than its limit; a suspended tenant's jobs are left, and
// run after resume.
func TestTheFetchTakesTenantsRoundRobinWithinTheirLimits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	insertJobs(t, db, "a", 1000)
	insertJobs(t, db, "b", 3)
	insertJobs(t, db, "", 2)
	got := fetch(t, db, 8)
	require.Len(t, got, 8)
	count := map[string]int{}
	for _, g := range got {
		count[g]++
	}
	require.Equal(t, map[string]int{"a": 3, "b": 3, "": 2}, count, "round-robin: every group's first jobs before a's backlog")

	// a's limit: 10 units at once (the default), 3 running already.
	got = fetch(t, db, 100)
	require.Len(t, got, 7, "a takes its limit less what runs, and nothing else is left")
	require.Equal(t, 10, db.MustCount(t, `SELECT count(*) FROM river_job WHERE state = 'running' AND metadata->>'tenant' = 'a'`))
	require.Empty(t, fetch(t, db, 100), "a at its limit takes nothing")

	// A running unit ends: one more starts.
	db.MustExec(t, `UPDATE river_job SET state = 'completed', finalized_at = clock_timestamp() WHERE id = (SELECT min(id) FROM river_job WHERE state = 'running' AND metadata->>'tenant' = 'a')`)
	require.Equal(t, []string{"a"}, fetch(t, db, 100))

	// Suspended: held; resumed: runs.
	require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		if err := tenancy.SetLimitTx(ctx, tx, "a", 20); err != nil {
			return err
		}
		return tenancy.SuspendTx(ctx, tx, "a", "unpaid")
	}))
	require.Empty(t, fetch(t, db, 100), "a suspended tenant's jobs do not start")
	require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error { return tenancy.ResumeTx(ctx, tx, "a") }))
	require.Len(t, fetch(t, db, 100), 10, "after resume a runs up to its new limit")

	ten, err := tenancy.Get(ctx, db, "a")
	require.NoError(t, err)
	require.Equal(t, tenancy.Active, ten.State)
	require.EqualValues(t, 20, ten.Running)
	require.EqualValues(t, 20, ten.MaxRunning)
}

// TestARunSlotCountsAgainstTheLimitUntilItsTransactionEnds: batches hold run
// slots (compute_tenant_slot) for their transaction; with the River jobs
// running they never exceed the limit, and a slot comes back when its
// transaction ends.
func TestARunSlotCountsAgainstTheLimitUntilItsTransactionEnds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	insertJobs(t, db, "c", 5)
	require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error { return tenancy.SetLimitTx(ctx, tx, "c", 3) }))
	require.Len(t, fetch(t, db, 1), 1, "one job of c runs")

	var txs []pgx.Tx
	defer func() {
		for _, tx := range txs {
			_ = tx.Rollback(ctx)
		}
	}()
	slot := func() bool {
		tx, err := db.Begin(ctx)
		require.NoError(t, err)
		txs = append(txs, tx)
		var ok bool
		require.NoError(t, tx.QueryRow(ctx, `SELECT compute_tenant_slot('c', 3)`).Scan(&ok))
		return ok
	}
	require.True(t, slot())
	require.True(t, slot())
	require.False(t, slot(), "1 job and 2 batches: c is at its limit of 3")
	require.Empty(t, fetch(t, db, 10), "the fetch counts the batches' slots too")
	var running int64
	require.NoError(t, db.QueryRow(ctx, `SELECT compute_tenant_running('c')`).Scan(&running))
	require.EqualValues(t, 3, running)
	require.NoError(t, txs[0].Rollback(ctx))
	require.Len(t, fetch(t, db, 10), 1, "a batch's end gives its slot back")
}

// TestBadInputChangesNothing: an unknown tenant, a bad name, a limit of 0, a
// verb on a deleted tenant.
func TestBadInputChangesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	insertJobs(t, db, "d", 1)
	do := func(fn func(ctx context.Context, tx pgx.Tx) error) error { return pg.InTx(ctx, db.Pool, fn) }
	require.ErrorContains(t, do(func(ctx context.Context, tx pgx.Tx) error { return tenancy.SuspendTx(ctx, tx, "nobody", "") }), "NOT_FOUND")
	require.ErrorContains(t, do(func(ctx context.Context, tx pgx.Tx) error { return tenancy.SuspendTx(ctx, tx, "bad name", "") }), "INVALID_ARGUMENT")
	require.ErrorContains(t, do(func(ctx context.Context, tx pgx.Tx) error { return tenancy.SetLimitTx(ctx, tx, "d", 0) }), "INVALID_ARGUMENT")
	var del *tenancy.Deletion
	require.NoError(t, do(func(ctx context.Context, tx pgx.Tx) error {
		var err error
		del, err = tenancy.DeleteTx(ctx, tx, "d", "")
		return err
	}))
	require.EqualValues(t, 1, del.Jobs, "its waiting job is cancelled")
	require.ErrorContains(t, do(func(ctx context.Context, tx pgx.Tx) error { return tenancy.ResumeTx(ctx, tx, "d") }), "CONFLICT")
	_, err := db.Exec(ctx, `SELECT compute_tenant_use('d')`)
	require.ErrorContains(t, pg.Translate(err), "CONFLICT", "a deleted tenant takes no new work")
}

// TestAFetchWaitsForNoBackloggedTenantsGate: while another transaction holds
// a tenant's gate, a fetch leaves that tenant's backlog (its limit of jobs
// available in the queue, or more) to it and takes the other groups' jobs at
// once; a tenant with fewer jobs there is waited for, and its job taken when
// the gate is let go.
func TestAFetchWaitsForNoBackloggedTenantsGate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	insertJobs(t, db, "a", 100)
	insertJobs(t, db, "b", 1)
	holder, err := db.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(ctx) }()
	_, err = holder.Exec(ctx, `SELECT pg_advisory_xact_lock(compute_tenant_key('a'), -1), pg_advisory_xact_lock(compute_tenant_key('b'), -1)`)
	require.NoError(t, err)

	type result struct {
		tenants []string
		err     error
	}
	got := make(chan result, 1)
	go func() {
		rows, err := db.Query(ctx, `SELECT coalesce(metadata->>'tenant', '') FROM compute_fetch_jobs('shard_0', 8, $1, 'me', 100, NULL) ORDER BY id`, time.Now())
		if err != nil {
			got <- result{err: err}
			return
		}
		ts, err := pgx.CollectRows(rows, pgx.RowTo[string])
		got <- result{ts, err}
	}()
	select {
	case r := <-got:
		t.Fatalf("the fetch did not wait for b's gate (b has one job): %v %v", r.tenants, r.err)
	case <-time.After(500 * time.Millisecond):
	}
	require.NoError(t, holder.Rollback(ctx))
	r := <-got
	require.NoError(t, r.err)
	require.Equal(t, []string{"b"}, r.tenants, "once the gates are let go: b's job; a's backlog was left to the holder")

	// a's gate held: the fetch leaves a's backlog and takes no tenant's job at once.
	insertJobs(t, db, "", 1)
	holder, err = db.Begin(ctx)
	require.NoError(t, err)
	_, err = holder.Exec(ctx, `SELECT pg_advisory_xact_lock(compute_tenant_key('a'), -1)`)
	require.NoError(t, err)
	start := time.Now()
	require.Equal(t, []string{""}, fetch(t, db, 8), "a's backlog is left to the gate's holder")
	require.Less(t, time.Since(start), 5*time.Second)
	require.NoError(t, holder.Rollback(ctx))
}
