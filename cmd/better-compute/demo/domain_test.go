package demo

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/cmd/better-compute/cli"
	"github.com/bettercompute/bettercompute/platform/migrate"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

// TestDomainDemoRegisters: the demo's quorum applier joins the built-in
// capacity and quorum modules' workers in one registry.
func TestDomainDemoRegisters(t *testing.T) {
	t.Parallel()
	_, err := cli.App{Modules: []cli.Module{demoDomainModule()}}.Registry()
	require.NoError(t, err)
	_, err = cli.App{Modules: []cli.Module{demoDomainModule(), demoDomainModule()}}.Registry()
	require.Error(t, err, "the applier of demo_change registered twice")
}

// TestDomainDemo runs dev's capacity and quorum demo on a worker with the
// built-in modules: its reservations expire through hold-expiry jobs, and its
// batches commit and are applied by apply jobs (or expire at their deadline).
func TestDomainDemo(t *testing.T) {
	t.Parallel()
	m := demoDomainModule()
	ms, err := migrate.FromFS(m.Name, m.Migrations)
	require.NoError(t, err)
	db := pgtest.New(t, pgtest.Options{Groups: []migrate.Group{{Owner: m.Name, Migrations: ms}}})
	reg, err := cli.App{Modules: []cli.Module{m}}.Registry()
	require.NoError(t, err)
	rt := workertest.Start(t, db.Pool, reg, nil)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		runDomainDemo(ctx, rt.Log(), db.Pool, domainDemo{Every: 50 * time.Millisecond, HoldTTL: 500 * time.Millisecond, VoteWindow: time.Second})
	}()
	defer func() { cancel(); <-done }()
	workertest.WaitFor(t, 60*time.Second, "holds expired by their job, batches applied and expired", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM capacity_reservations WHERE state = 'expired'`) > 0 &&
			db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'capacity_hold_expiry' AND state = 'completed'`) > 0 &&
			db.MustCount(t, `SELECT count(*) FROM quorum_batches WHERE state = 'applied'`) > 0 &&
			db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'quorum_apply' AND state = 'completed'`) > 0 &&
			db.MustCount(t, `SELECT count(*) FROM quorum_batches WHERE state IN ('expired', 'rejected')`) > 0
	})
	cancel()
	<-done
	require.Equal(t, 2*db.MustCount(t, `SELECT count(*) FROM quorum_batches WHERE state = 'applied'`),
		db.MustCount(t, `SELECT count(*) FROM demo_domain_changes`), "each applied batch's two items, once")
	require.Equal(t, 2, db.MustCount(t, `SELECT count(*) FROM capacity_quota_usage WHERE pool_id = $1`, DemoPool))
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM capacity_quota_usage q WHERE q.pool_id = $1 AND q.used <> (
		SELECT count(*) FROM capacity_bookings b WHERE b.tenant = q.tenant AND b.pool_id = q.pool_id AND b.state IN ('hold', 'confirmed'))`, DemoPool),
		"quota usage equals a recount")
}
