package workers_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/domain/tenancy"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

type tenantTaskArgs struct {
	Key string `json:"key"`
}

func (tenantTaskArgs) Kind() string { return "test_tenant_task" }

// tenantTaskWorker records each run of a task in its fenced transaction.
type tenantTaskWorker struct {
	river.WorkerDefaults[tenantTaskArgs]
}

func (w *tenantTaskWorker) Work(ctx context.Context, job *river.Job[tenantTaskArgs]) error {
	return workers.InTx(ctx, job, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO tenant_runs (what, key, tenant) VALUES ('task', $1, $2)`, job.Args.Key, workers.TenantOf(ctx))
		return err
	})
}

// TestSuspendingATenantHoldsItsReconcilesAndJobs, directly and behind
// PgBouncer: a tenant is suspended while one of its reconciles is in its
// transaction. That reconcile commits; the tenant's key dirtied again
// meanwhile, its other dirty keys and its fenced jobs (enqueued while it is
// suspended: accepted and held) do not start while another tenant's all run;
// after resume every one runs, exactly once, with the tenant in its context.
func TestSuspendingATenantHoldsItsReconcilesAndJobs(t *testing.T) {
	t.Parallel()
	for _, bouncer := range []bool{false, true} {
		t.Run(map[bool]string{false: "direct", true: "pgbouncer"}[bouncer], func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			if bouncer {
				url := pgtest.PgBouncer(t, db)
				via, err := pg.Open(context.Background(), pg.Options{URL: url, MaxConns: 20})
				require.NoError(t, err)
				t.Cleanup(via.Close)
				db = &pgtest.DB{Pool: via, Name: db.Name, URL: url}
			}
			testSuspendHolds(t, db)
		})
	}
}

func testSuspendHolds(t *testing.T, db *pgtest.DB) {
	ctx := context.Background()
	db.MustExec(t, `CREATE TABLE tenant_runs (what text, key text, tenant text, at timestamptz DEFAULT clock_timestamp())`)
	entered, release := make(chan struct{}, 1), make(chan struct{})
	var hold atomic.Bool
	hold.Store(true)
	reg := workers.NewRegistry()
	require.NoError(t, workers.AddWorker(reg, &tenantTaskWorker{}))
	require.NoError(t, workers.AddReconciler(reg, workers.Reconciler{Kind: "account",
		Reconcile: func(ctx context.Context, tx pgx.Tx, key string) (workers.Result, error) {
			if key == "acme-k0" && hold.CompareAndSwap(true, false) {
				entered <- struct{}{}
				<-release
			}
			_, err := tx.Exec(ctx, `INSERT INTO tenant_runs (what, key, tenant) VALUES ('reconcile', $1, $2)`, key, workers.TenantOf(ctx))
			return workers.Result{}, err
		}}))
	workertest.Start(t, db.Pool, reg, nil)

	enqueue := func(tenant string, from, to int) {
		t.Helper()
		require.NoError(t, pg.InTx(workers.WithTenant(ctx, tenant), db.Pool, func(ctx context.Context, tx pgx.Tx) error {
			for i := from; i < to; i++ {
				key := fmt.Sprintf("%s-k%d", tenant, i)
				if err := workers.DirtyTx(ctx, tx, "account", key, nil); err != nil {
					return err
				}
				if _, err := workers.InsertForKeyTx(ctx, tx, key, tenantTaskArgs{Key: key}, nil); err != nil {
					return err
				}
			}
			return nil
		}))
	}
	// acme-k0: its reconcile starts and is held in its transaction (its task
	// runs).
	require.NoError(t, pg.InTx(workers.WithTenant(ctx, "acme"), db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		return workers.DirtyTx(ctx, tx, "account", "acme-k0", nil)
	}))
	<-entered
	require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		return tenancy.SuspendTx(ctx, tx, "acme", "unpaid")
	}))
	enqueue("acme", 0, 10) // acme-k0 again, and nine more keys; ten tasks
	enqueue("globex", 0, 10)
	close(release)

	count := func(where string, args ...any) int {
		return db.MustCount(t, `SELECT count(*) FROM tenant_runs WHERE `+where, args...)
	}
	workertest.WaitFor(t, 30*time.Second, "globex's reconciles and tasks all run", func() bool {
		return count(`tenant = 'globex'`) == 20
	})
	workertest.WaitFor(t, 10*time.Second, "the reconcile in flight commits", func() bool {
		return count(`tenant = 'acme'`) == 1
	})
	time.Sleep(time.Second) // polls, wakes and takes go by
	require.Equal(t, 1, count(`tenant = 'acme'`), "nothing of a suspended tenant's starts")
	require.Equal(t, 10, db.MustCount(t, `SELECT count(*) FROM compute_dirty WHERE tenant = 'acme'`), "its keys are held, not lost")
	require.Equal(t, 10, db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'test_tenant_task' AND state = 'available'
		AND metadata->>'tenant' = 'acme'`), "its tasks are held, not lost")

	require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		return tenancy.ResumeTx(ctx, tx, "acme")
	}))
	workertest.WaitFor(t, 30*time.Second, "acme's work all runs after resume", func() bool {
		return count(`tenant = 'acme'`) == 21
	})
	time.Sleep(300 * time.Millisecond) // room for a second (wrong) run
	require.Equal(t, 2, count(`what = 'reconcile' AND key = 'acme-k0'`), "the key dirtied while in flight is reconciled again, once")
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM (SELECT what, key FROM tenant_runs WHERE key <> 'acme-k0' OR what = 'task'
		GROUP BY what, key HAVING count(*) <> 1) x`), "every other reconcile and task ran exactly once")
	require.Equal(t, 41, count(`true`))
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM compute_dirty`))
}
