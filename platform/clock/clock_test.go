package clock_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/platform/clock"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// serverNow reads the server's real clock (not compute_now()).
func serverNow(t *testing.T, db pg.DBTX) time.Time {
	t.Helper()
	var at time.Time
	require.NoError(t, db.QueryRow(context.Background(), "SELECT clock_timestamp()").Scan(&at))
	return at
}

func requireNow(t *testing.T, db pg.DBTX, want time.Time) {
	t.Helper()
	got, err := clock.Now(context.Background(), db)
	require.NoError(t, err)
	require.True(t, want.Equal(got), "compute_now() = %s, want %s", got, want)
}

func TestSimClock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)

	mode, err := clock.ModeOf(ctx, db)
	require.NoError(t, err)
	require.Equal(t, clock.System, mode)

	// Not on yet: moving it is refused.
	err = clock.Set(ctx, db, time.Now())
	require.Equal(t, fault.InvalidArgument, fault.CodeOf(err), "%v", err)
	_, err = clock.Advance(ctx, db, time.Second)
	require.Equal(t, fault.InvalidArgument, fault.CodeOf(err), "%v", err)

	start := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	require.NoError(t, clock.UseSim(ctx, db, start))
	mode, err = clock.ModeOf(ctx, db)
	require.NoError(t, err)
	require.Equal(t, clock.Sim, mode)
	requireNow(t, db, start)
	time.Sleep(20 * time.Millisecond)
	requireNow(t, db, start) // it stands still until moved

	// Forward.
	later := start.Add(90 * time.Minute)
	require.NoError(t, clock.Set(ctx, db, later))
	requireNow(t, db, later)
	at, err := clock.Advance(ctx, db, 30*time.Second)
	require.NoError(t, err)
	require.True(t, later.Add(30*time.Second).Equal(at), "Advance returned %s", at)
	requireNow(t, db, at)
	require.NoError(t, clock.Set(ctx, db, at), "setting the same instant is not moving back")

	// Never back: refused, and the clock does not move.
	err = clock.Set(ctx, db, at.Add(-time.Microsecond))
	require.Equal(t, fault.InvalidArgument, fault.CodeOf(err), "%v", err)
	_, err = clock.Advance(ctx, db, -time.Second)
	require.Equal(t, fault.InvalidArgument, fault.CodeOf(err), "%v", err)
	requireNow(t, db, at)

	// It is database-wide: other connections, transactions and column defaults
	// that use compute_now() follow it.
	db.MustExec(t, "CREATE TABLE ev (id int, at timestamptz NOT NULL DEFAULT compute_now())")
	require.NoError(t, pg.InTxWith(ctx, db.Pool, pg.TxOptions{Isolation: pg.RepeatableRead}, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO ev (id) VALUES (1)")
		return err
	}))
	var stored time.Time
	require.NoError(t, db.QueryRow(ctx, "SELECT at FROM ev WHERE id = 1").Scan(&stored))
	require.True(t, at.Equal(stored), "default compute_now() stored %s, want %s", stored, at)
	other, err := pgx.Connect(ctx, db.URL)
	require.NoError(t, err)
	defer other.Close(ctx)
	requireNow(t, other, at)

	// Switching on again may pick any instant, even an earlier one.
	require.NoError(t, clock.UseSim(ctx, db, start))
	requireNow(t, db, start)

	// Back to the system clock: compute_now() is the server's clock again.
	require.NoError(t, clock.UseSystem(ctx, db))
	mode, err = clock.ModeOf(ctx, db)
	require.NoError(t, err)
	require.Equal(t, clock.System, mode)
	before := serverNow(t, db)
	var now time.Time
	require.NoError(t, db.QueryRow(ctx, "SELECT compute_now()").Scan(&now))
	after := serverNow(t, db)
	require.False(t, now.Before(before.Truncate(time.Microsecond)), "compute_now() %s before the server clock %s", now, before)
	require.False(t, now.After(after), "compute_now() %s after the server clock %s", now, after)
	err = clock.Set(ctx, db, now.Add(time.Hour))
	require.Equal(t, fault.InvalidArgument, fault.CodeOf(err), "the sim clock is off again")

	// In system mode compute_now() is the transaction's start, like the server's
	// own clock function: stable within a transaction.
	require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		var a, b time.Time
		if err := tx.QueryRow(ctx, "SELECT compute_now()").Scan(&a); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "SELECT pg_sleep(0.01)"); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, "SELECT compute_now()").Scan(&b); err != nil {
			return err
		}
		require.True(t, a.Equal(b))
		return nil
	}))
}

func TestModeOf(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("missing", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t, pgtest.Options{Empty: true})
		mode, err := clock.ModeOf(ctx, db)
		require.NoError(t, err)
		require.Equal(t, clock.Missing, mode)
	})
	t.Run("missing compute_now only", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t)
		db.MustExec(t, "DROP FUNCTION compute_now() CASCADE")
		mode, err := clock.ModeOf(ctx, db)
		require.NoError(t, err)
		require.Equal(t, clock.Missing, mode)
	})
	t.Run("custom", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t)
		db.MustExec(t, `CREATE OR REPLACE FUNCTION compute_now() RETURNS timestamptz
			LANGUAGE sql STABLE AS $$ SELECT timestamptz '2030-01-01 00:00:00Z' $$`)
		mode, err := clock.ModeOf(ctx, db)
		require.NoError(t, err)
		require.Equal(t, clock.Custom, mode)
		requireNow(t, db, time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
		// A custom clock is not the sim clock: it cannot be moved.
		err = clock.Set(ctx, db, time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC))
		require.Equal(t, fault.InvalidArgument, fault.CodeOf(err), "%v", err)
		// UseSystem restores the real one.
		require.NoError(t, clock.UseSystem(ctx, db))
		mode, err = clock.ModeOf(ctx, db)
		require.NoError(t, err)
		require.Equal(t, clock.System, mode)
	})
	t.Run("system and sim", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t)
		mode, err := clock.ModeOf(ctx, db)
		require.NoError(t, err)
		require.Equal(t, clock.System, mode)
		require.NoError(t, clock.UseSim(ctx, db, time.Now()))
		mode, err = clock.ModeOf(ctx, db)
		require.NoError(t, err)
		require.Equal(t, clock.Sim, mode)
	})
}

func TestAnchor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("system", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t)
		var a clock.Anchor
		before := time.Now()
		require.NoError(t, a.Sample(ctx, db))
		skew, mode := a.Skew()
		require.Equal(t, clock.System, mode)
		require.Less(t, skew.Abs(), clock.MaxSkew, "same machine, same clock")
		now := a.Now()
		// Business time is the database's clock moved on by this process's own.
		require.WithinRange(t, now, before.Add(-clock.MaxSkew), time.Now().Add(clock.MaxSkew))
		require.NoError(t, a.Sample(ctx, db), "a re-sample on the same clock finds no drift")
		require.False(t, a.Now().Before(now.Add(-clock.MaxSkew)))
	})

	t.Run("sim", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t)
		at := time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)
		require.NoError(t, clock.UseSim(ctx, db, at))
		var a clock.Anchor
		require.NoError(t, a.Sample(ctx, db), "a sim clock far from the wall clock is not skew")
		sampled := time.Now()
		skew, mode := a.Skew()
		require.Equal(t, clock.Sim, mode)
		require.Zero(t, skew)
		now := a.Now()
		require.False(t, now.Before(at), "Now %s before the sim clock %s", now, at)
		require.False(t, now.After(at.Add(time.Since(sampled)+time.Second)), "Now %s ran ahead of %s", now, at)

		// Moving the sim clock moves the anchor at the next sample.
		next := at.Add(24 * time.Hour)
		require.NoError(t, clock.Set(ctx, db, next))
		require.NoError(t, a.Sample(ctx, db), "moving the sim clock is not skew")
		require.False(t, a.Now().Before(next))
		require.True(t, a.Now().Before(next.Add(time.Hour)))
	})

	// A database clock that reads as system but is off this process's clock is
	// CLOCK_SKEW. A schema ahead on the search path stands in for a server whose
	// clock is off: its compute_now() is the real clock plus an offset.
	skewed := func(t *testing.T, offset string) *pgx.Conn {
		t.Helper()
		db := pgtest.New(t)
		db.MustExec(t, `CREATE SCHEMA skew;
			CREATE TABLE skew.offset_by (d interval NOT NULL);
			INSERT INTO skew.offset_by VALUES (interval '`+offset+`');
			CREATE FUNCTION skew.compute_now() RETURNS timestamptz LANGUAGE sql VOLATILE
				AS $$ SELECT clock_timestamp() + (SELECT d FROM skew.offset_by) $$;
			CREATE FUNCTION skew.compute_clock_mode() RETURNS text LANGUAGE sql STABLE AS $$ SELECT 'system' $$`)
		conn, err := pgx.Connect(ctx, db.URL)
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close(context.Background()) })
		_, err = conn.Exec(ctx, "SET search_path = skew, public")
		require.NoError(t, err)
		return conn
	}
	t.Run("wall skew", func(t *testing.T) {
		t.Parallel()
		for _, offset := range []string{"5 seconds", "-5 seconds"} {
			conn := skewed(t, offset)
			var a clock.Anchor
			err := a.Sample(ctx, conn)
			require.Equal(t, fault.ClockSkew, fault.CodeOf(err), "offset %s: %v", offset, err)
			skew, _ := a.Skew()
			require.Greater(t, skew.Abs(), 4*time.Second)
			// The anchor follows the database even so.
			require.Greater(t, a.Now().Sub(time.Now()).Abs(), 4*time.Second)
		}
	})
	t.Run("drift", func(t *testing.T) {
		t.Parallel()
		conn := skewed(t, "0 seconds")
		var a clock.Anchor
		require.NoError(t, a.Sample(ctx, conn))
		// The database's clock jumps by 3 s between two samples.
		_, err := conn.Exec(ctx, "UPDATE skew.offset_by SET d = interval '3 seconds'")
		require.NoError(t, err)
		err = a.Sample(ctx, conn)
		require.Equal(t, fault.ClockSkew, fault.CodeOf(err), "%v", err)
		require.Contains(t, err.Error(), "drifted")
	})
}

// TestConcurrentAdvancesAddUp: advances from many goroutines at once all land.
func TestConcurrentAdvancesAddUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	start := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
	require.NoError(t, clock.UseSim(ctx, db.Pool, start))
	var wg sync.WaitGroup
	for i := 1; i <= 10; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := clock.Advance(ctx, db.Pool, time.Duration(i)*time.Second)
			assert.NoError(t, err)
		}()
	}
	wg.Wait()
	now, err := clock.Now(ctx, db.Pool)
	require.NoError(t, err)
	require.True(t, now.Equal(start.Add(55*time.Second)), "got %s", now)
}

// TestSampleTimesOnlyTheRoundTrip: a sample taken from a pool whose only
// connection is busy for 3 s is not CLOCK_SKEW: the wait for the connection is
// not part of the measured round trip (it would move the estimate of when the
// server read its clock by half the wait, 1.5 s).
func TestSampleTimesOnlyTheRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	pool, err := pg.Open(ctx, pg.Options{URL: db.URL, MaxConns: 1})
	require.NoError(t, err)
	defer pool.Close()

	var a clock.Anchor
	require.NoError(t, a.Sample(ctx, pool))
	busy, err := pool.Acquire(ctx)
	require.NoError(t, err)
	sampled := make(chan error, 1)
	go func() { sampled <- a.Sample(ctx, pool) }()
	waitFor(t, 30*time.Second, "the sample waiting for the pool's connection", func() bool {
		return pool.Stat().EmptyAcquireCount() > 0
	})
	// The pool stays busy this long: the condition under test, not a wait for
	// an event.
	time.Sleep(3 * time.Second)
	busy.Release()
	err = <-sampled
	require.NoError(t, err, "a sample that waited 3 s for a connection")
	skew, _ := a.Skew()
	require.Less(t, skew.Abs(), clock.MaxSkew)
}

// waitFor polls cond every 10 ms until it holds, failing with msg after
// timeout.
func waitFor(t *testing.T, timeout time.Duration, msg string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for: %s", timeout, msg)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
