package cli_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/cmd/better-compute/cli"
	"github.com/bettercompute/bettercompute/cmd/better-compute/cli/clitest"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers"
)

func TestShardSet(t *testing.T) {
	t.Parallel()
	for spec, want := range map[string][]int{
		"all":       {0, 1, 2, 3},
		"0-3":       {0, 1, 2, 3},
		"1,3":       {1, 3},
		"0-1,3,1":   {0, 1, 3},
		" 2 - 2 ":   nil, // malformed: spaces inside a range are not a number
		"":          nil,
		"4":         nil, // out of range
		"2-1":       nil,
		"a":         nil,
		"-1":        nil,
		"0-9999999": nil,
	} {
		got, err := cli.ShardSet(spec, 4)
		if want == nil {
			require.Truef(t, fault.Has(err, fault.InvalidConfig), "%q: want INVALID_CONFIG, got %v %v", spec, got, err)
			continue
		}
		require.NoError(t, err, spec)
		require.Equal(t, want, got, spec)
	}
}

// TestWorkerBadShards: a malformed --shards fails before anything starts (here,
// against a database that does not exist), and an out-of-range one fails with
// INVALID_CONFIG naming the deployment's shard count.
func TestWorkerBadShards(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := clitest.Run(t, ctx, cli.App{}, []string{"BETTER_COMPUTE_DATABASE_URL=postgres://nobody@127.0.0.1:1/none"}, "worker", "--shards", "0-x")
	require.Equal(t, 1, r.Code)
	require.Contains(t, r.Stderr, "INVALID_CONFIG")
	require.Contains(t, r.Stderr, `--shards "0-x"`)

	db := pgtest.New(t)
	r = clitest.Run(t, ctx, cli.App{}, dbEnv(db), "worker", "--no-migrate", "--shards", "3,16")
	require.Equal(t, 1, r.Code)
	require.Contains(t, r.Stderr, "INVALID_CONFIG")
	require.Contains(t, r.Stderr, "16 shards (0-15)")
}

// TestWorkerRunsAndStops: the worker command works its shards until its context
// ends, then stops gracefully and releases its leases. The leases live a
// minute, so only a release, not their expiry, frees them right after the stop.
func TestWorkerRunsAndStops(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan clitest.Result, 1)
	go func() {
		done <- clitest.Run(t, ctx, cli.App{}, append(dbEnv(db), "BETTER_COMPUTE_LEASE_RENEW=5s", "BETTER_COMPUTE_LEASE_TTL=60s"),
			"worker", "--shards", "0-3")
	}()
	deadline := time.Now().Add(30 * time.Second)
	for db.MustCount(t, `SELECT count(*) FROM compute_leases WHERE expires_at > compute_now()`) < 4 {
		require.True(t, time.Now().Before(deadline), "the worker did not take shards 0-3")
		time.Sleep(20 * time.Millisecond)
	}
	require.Equal(t, 4, db.MustCount(t, `SELECT count(*) FROM compute_leases WHERE name IN ('shard/0','shard/1','shard/2','shard/3')
		AND expires_at > compute_now() + interval '30 seconds'`), "the worker holds shards 0-3 for a minute")
	cancel()
	r := <-done
	require.Equal(t, 0, r.Code, r.Stderr)
	rows, err := db.Pool.Query(context.Background(), `SELECT format('%s owner %s epoch %s expires %s acquired %s', name, owner, epoch, expires_at, acquired_at)
		FROM compute_leases WHERE expires_at > compute_now() ORDER BY name`)
	require.NoError(t, err)
	held, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Empty(t, held, "leases released on stop; the worker's log:\n%s", r.Stderr)
	require.Equal(t, 4, db.MustCount(t, `SELECT count(*) FROM compute_leases WHERE name LIKE 'shard/%'`))
}

// TestMigrateValidatesModulesFirst: a module that registers something invalid
// (here a reconciler without a Reconcile function) makes migrate fail with
// INVALID_CONFIG before it touches the database.
func TestMigrateValidatesModulesFirst(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, pgtest.Options{Empty: true})
	bad := cli.App{Modules: []cli.Module{{Name: "bad", Register: func(r *workers.Registry) error {
		return workers.AddReconciler(r, workers.Reconciler{Kind: "broken"})
	}}}}
	r := clitest.Run(t, context.Background(), bad, dbEnv(db), "migrate")
	require.Equal(t, 1, r.Code)
	require.Contains(t, r.Stderr, "INVALID_CONFIG")
	require.Contains(t, r.Stderr, "broken")
	require.Equal(t, 0, db.MustCount(t, `SELECT count(*) FROM pg_tables WHERE tablename = 'compute_migrations'`), "nothing touched")
}
