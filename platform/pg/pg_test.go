package pg_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/platform/embedded"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestCommitBecameRollbackIsInternalError(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{Empty: true})
	db.MustExec(t, "CREATE TABLE t (id int PRIMARY KEY)")

	err := pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO t VALUES (1)"); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "INSERT INTO t VALUES (1)") // unique violation, swallowed
		require.Equal(t, "23505", pg.SQLState(err))
		return nil
	})
	require.Error(t, err)
	require.Equal(t, fault.Internal, fault.CodeOf(err), "%v", err)
	require.ErrorIs(t, err, pgx.ErrTxCommitRollback)
	require.Equal(t, 0, db.MustCount(t, "SELECT count(*) FROM t"), "the first insert must have been rolled back")
}

func TestInTxCommitsAndRollsBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{Empty: true})
	db.MustExec(t, "CREATE TABLE t (id int PRIMARY KEY)")

	require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO t VALUES (1)")
		return err
	}))
	boom := errors.New("boom")
	err := pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO t VALUES (2)"); err != nil {
			return err
		}
		return boom
	})
	require.ErrorIs(t, err, boom, "fn's error is returned as is")
	require.Equal(t, 1, db.MustCount(t, "SELECT count(*) FROM t"))
	require.Equal(t, 1, db.MustCount(t, "SELECT id FROM t"))
}

func TestNestedInTxIsASavepoint(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{Empty: true})
	db.MustExec(t, "CREATE TABLE t (id int PRIMARY KEY)")

	inner := errors.New("inner failed")
	err := pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO t VALUES (1)"); err != nil {
			return err
		}
		// A failed statement inside the savepoint: only the savepoint is aborted.
		err := pg.InTx(ctx, tx, func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "INSERT INTO t VALUES (2)"); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "INSERT INTO t VALUES (1)")
			return err
		})
		require.Equal(t, "23505", pg.SQLState(err))
		// An error returned by fn: the savepoint's work is rolled back.
		err = pg.InTx(ctx, tx, func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "INSERT INTO t VALUES (3)"); err != nil {
				return err
			}
			return inner
		})
		require.ErrorIs(t, err, inner)
		// A nested success is kept, even two levels down.
		return pg.InTx(ctx, tx, func(ctx context.Context, tx pgx.Tx) error {
			return pg.InTx(ctx, tx, func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, "INSERT INTO t VALUES (4)")
				return err
			})
		})
	})
	require.NoError(t, err, "the outer transaction commits after the inner ones failed")
	rows, err := db.Query(ctx, "SELECT id FROM t ORDER BY id")
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	require.NoError(t, err)
	require.Equal(t, []int32{1, 4}, ids)
}

func TestPanicRollsBackAndRepanics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{Empty: true, MaxConns: 1})
	db.MustExec(t, "CREATE TABLE t (id int PRIMARY KEY)")

	require.PanicsWithValue(t, "kaboom", func() {
		_ = pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "INSERT INTO t VALUES (1)"); err != nil {
				return err
			}
			panic("kaboom")
		})
	})
	// With one connection, this also shows the connection went back to the pool
	// (a leaked one would make this wait, then fail).
	wait, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var n int
	require.NoError(t, db.QueryRow(wait, "SELECT count(*) FROM t").Scan(&n))
	require.Equal(t, 0, n)
	require.Equal(t, 0, idleInTx(t, db.Name), "no session is left inside a transaction")

	// A panic inside a savepoint rolls back the savepoint only if recovered above;
	// unrecovered, the whole transaction goes.
	require.Panics(t, func() {
		_ = pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "INSERT INTO t VALUES (2)"); err != nil {
				return err
			}
			return pg.InTx(ctx, tx, func(ctx context.Context, tx pgx.Tx) error { panic("inner") })
		})
	})
	require.Equal(t, 0, db.MustCount(t, "SELECT count(*) FROM t"))
	require.Equal(t, 0, idleInTx(t, db.Name))
}

func TestTxOptions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{Empty: true})
	db.MustExec(t, "CREATE TABLE t (id int)")

	iso := func(db pg.DBTX, opts pg.TxOptions) (level string, readOnly string) {
		t.Helper()
		require.NoError(t, pg.InTxWith(ctx, db, opts, func(ctx context.Context, tx pgx.Tx) error {
			return tx.QueryRow(ctx, "SELECT current_setting('transaction_isolation'), current_setting('transaction_read_only')").Scan(&level, &readOnly)
		}))
		return level, readOnly
	}
	// Both the *pg.Pool and a type embedding it (the test DB) honour the options.
	for name, d := range map[string]pg.DBTX{"pool": db.Pool, "embedding": db} {
		t.Run(name, func(t *testing.T) {
			lvl, ro := iso(d, pg.TxOptions{})
			require.Equal(t, "read committed", lvl)
			require.Equal(t, "off", ro)
			lvl, _ = iso(d, pg.TxOptions{Isolation: pg.RepeatableRead})
			require.Equal(t, "repeatable read", lvl)
			lvl, _ = iso(d, pg.TxOptions{Isolation: pg.Serializable})
			require.Equal(t, "serializable", lvl)
			lvl, ro = iso(d, pg.TxOptions{ReadOnly: true})
			require.Equal(t, "read committed", lvl)
			require.Equal(t, "on", ro)

			err := pg.InTxWith(ctx, d, pg.TxOptions{ReadOnly: true}, func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, "INSERT INTO t VALUES (1)")
				return err
			})
			require.Equal(t, "25006", pg.SQLState(err), "a write in a read-only transaction fails: %v", err)

			// The statement timeout is set with the options too.
			var timeout string
			require.NoError(t, pg.InTxWith(ctx, d, pg.TxOptions{Isolation: pg.Serializable, ReadOnly: true}, func(ctx context.Context, tx pgx.Tx) error {
				return tx.QueryRow(ctx, "SHOW statement_timeout").Scan(&timeout)
			}))
			require.Equal(t, "15s", timeout)
		})
	}
	require.Equal(t, 0, db.MustCount(t, "SELECT count(*) FROM t"))
}

func TestApplicationNameIsSetLocal(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{Empty: true})
	pool, err := pg.Open(ctx, pg.Options{URL: db.URL, MaxConns: 1, ApplicationName: "bc-o'test"})
	require.NoError(t, err)
	defer pool.Close()
	for _, opts := range []pg.TxOptions{{}, {Isolation: pg.RepeatableRead}, {ReadOnly: true}} {
		var name string
		require.NoError(t, pg.InTxWith(ctx, pool, opts, func(ctx context.Context, tx pgx.Tx) error {
			return tx.QueryRow(ctx, "SELECT current_setting('application_name')").Scan(&name)
		}))
		require.Equal(t, "bc-o'test", name, "options %+v", opts)
	}
	// Outside a transaction the session keeps nothing (PgBouncer safety).
	var name string
	require.NoError(t, pool.QueryRow(ctx, "SELECT current_setting('application_name')").Scan(&name))
	require.NotEqual(t, "bc-o'test", name)
}

// TestStatementCache: with Options.StatementCache a statement run twice on one
// connection, in two transactions as InTx runs them, is prepared once (one
// named statement on the server, executed twice), and a Sibling pool keeps
// the setting; by default nothing is
// prepared, so PgBouncer in transaction mode has nothing to lose.
func TestStatementCache(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{Empty: true})
	const stmt = "SELECT $1::int + 1"
	for _, tc := range []struct {
		name     string
		cache    bool
		prepared int
	}{{"default", false, 0}, {"cache", true, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			pool, err := pg.Open(ctx, pg.Options{URL: db.URL, MaxConns: 1, StatementCache: tc.cache})
			require.NoError(t, err)
			defer pool.Close()
			sib, err := pool.Sibling(1)
			require.NoError(t, err)
			defer sib.Close()
			for _, p := range []*pg.Pool{pool, sib} {
				want := pgx.QueryExecModeExec
				if tc.cache {
					want = pgx.QueryExecModeCacheStatement
				}
				require.Equal(t, want, p.Config().ConnConfig.DefaultQueryExecMode)
			}

			for i := 1; i <= 2; i++ {
				var n int
				require.NoError(t, pg.InTx(ctx, pool, func(ctx context.Context, tx pgx.Tx) error {
					return tx.QueryRow(ctx, stmt, i).Scan(&n)
				}))
				require.Equal(t, i+1, n)
			}
			// The pool's one connection: the one both transactions ran on.
			conn, err := pool.Acquire(ctx)
			require.NoError(t, err)
			defer conn.Release()
			var prepared, runs, all int
			require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE statement = $1),
	coalesce(sum(generic_plans + custom_plans) FILTER (WHERE statement = $1), 0),
	count(*) FILTER (WHERE statement <> $1 AND statement NOT LIKE '%pg_prepared_statements%')
FROM pg_prepared_statements`, stmt).Scan(&prepared, &runs, &all))
			require.Equal(t, tc.prepared, prepared, "prepared statements of %q on the connection", stmt)
			require.Equal(t, 0, all, "no other statement was prepared")
			if tc.cache {
				require.Equal(t, 2, runs, "the one prepared statement served both runs")
			} else {
				var n int
				require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM pg_prepared_statements").Scan(&n))
				require.Zero(t, n, "nothing is prepared by default")
			}
		})
	}
}

func TestStatementTimeoutFiresAndDoesNotOutliveTheTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// One connection, so the SHOW below runs on the connection that timed out.
	db := pgtest.New(t, pgtest.Options{Empty: true, MaxConns: 1, StatementTimeout: 200 * time.Millisecond})
	require.Equal(t, 200*time.Millisecond, db.Pool.StatementTimeout())

	var serverDefault string
	require.NoError(t, db.QueryRow(ctx, "SELECT reset_val FROM pg_settings WHERE name = 'statement_timeout'").Scan(&serverDefault))

	var inside string
	err := pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, "SHOW statement_timeout").Scan(&inside); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "SELECT pg_sleep(5)")
		return err
	})
	require.Equal(t, "200ms", inside)
	require.Equal(t, "57014", pg.SQLState(err), "%v", err)
	require.Equal(t, fault.Unavailable, fault.CodeOf(pg.Translate(err)))

	var after string
	require.NoError(t, db.QueryRow(ctx, "SHOW statement_timeout").Scan(&after))
	require.Equal(t, "0", serverDefault)
	require.Equal(t, "0", after, "the timeout was SET LOCAL and must not stay on the connection")

	// The same connection is still usable by the next transaction.
	require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "SELECT pg_sleep(0.01)")
		return err
	}))
	require.Equal(t, int32(1), db.Stat().TotalConns())
}

// TestCancelledContextCancelsTheStatement: cancelling the context (SIGINT in the
// CLI) stops the statement on the server, so its transaction rolls back at once
// and releases its locks, instead of running on behind a dropped connection.
// TestCancelledContextEndsTheStatement: a cancelled context ends the statement
// and its transaction on the server. By default it closes the connection and
// sends no cancel request (a pooler may crash on one), and the server notices
// the closed connection within a second or so; with CancelRequests it sends a
// cancel request and keeps the connection.
func TestCancelledContextEndsTheStatement(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name           string
		cancelRequests bool
	}{{"default: close, no cancel request", false}, {"cancel requests on", true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := pgtest.New(t, pgtest.Options{Empty: true})
			db.MustExec(t, "CREATE TABLE t (id int)")
			proxy := pgtest.StartCancelCounter(t, db.URL)
			pool, err := pg.Open(ctx, pg.Options{URL: proxy.URL(db.URL), MaxConns: 1, CancelRequests: tc.cancelRequests})
			require.NoError(t, err)
			defer pool.Close()
			var pid uint32
			require.NoError(t, pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))

			admin, err := pgx.Connect(ctx, pgtest.AdminURL(t))
			require.NoError(t, err)
			defer admin.Close(ctx)
			// -1 on error: it runs in require.Eventually's goroutine, which must
			// not fail the test.
			sleeping := func() int {
				var n int
				if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
					WHERE datname = $1 AND (wait_event = 'PgSleep' OR state LIKE 'idle in transaction%')`, db.Name).Scan(&n); err != nil {
					return -1
				}
				return n
			}

			runCtx, cancel := context.WithCancel(ctx)
			defer cancel()
			done := make(chan error, 1)
			go func() {
				done <- pg.InTx(runCtx, pool, func(ctx context.Context, tx pgx.Tx) error {
					if _, err := tx.Exec(runCtx, "INSERT INTO t VALUES (1)"); err != nil {
						return err
					}
					_, err := tx.Exec(runCtx, "SELECT pg_sleep(60)")
					return err
				})
			}()
			require.Eventually(t, func() bool { return sleeping() > 0 }, 30*time.Second, 10*time.Millisecond)
			cancel()
			select {
			case err = <-done:
			case <-time.After(30 * time.Second):
				t.Fatal("InTx did not return after its context was cancelled")
			}
			require.Error(t, err)
			// The statement ends on the server well before the statement timeout
			// (15 s) and the 60 s sleep; its transaction rolls back.
			ended := time.Now()
			require.Eventually(t, func() bool { return sleeping() == 0 }, 10*time.Second, 20*time.Millisecond, "the statement still runs on the server")
			t.Logf("the server ended the statement %s after InTx returned", time.Since(ended).Round(time.Millisecond))
			require.Equal(t, 0, db.MustCount(t, "SELECT count(*) FROM t"))

			var after uint32
			require.NoError(t, pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&after), "the pool reconnects")
			if tc.cancelRequests {
				require.GreaterOrEqual(t, proxy.Cancels(), int64(1), "a cancel request was sent")
				require.Equal(t, pid, after, "the connection survived the cancel")
			} else {
				require.Zero(t, proxy.Cancels(), "no cancel request may be sent")
				require.NotEqual(t, pid, after, "the cancelled connection was closed")
			}
		})
	}
}

func TestSQLStateAndTranslate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{Empty: true})
	db.MustExec(t, `CREATE TABLE u (id int PRIMARY KEY);
		CREATE TABLE x (during tstzrange, EXCLUDE USING gist (during WITH &&));
		INSERT INTO u VALUES (1);
		INSERT INTO x VALUES (tstzrange('2020-01-01', '2020-01-03'))`)

	raise := func(state string) string {
		return fmt.Sprintf("DO $$ BEGIN RAISE EXCEPTION 'raised' USING ERRCODE = '%s'; END $$", state)
	}
	for _, c := range []struct {
		name  string
		sql   string
		state string
		code  fault.Code
	}{
		{"unique", "INSERT INTO u VALUES (1)", "23505", fault.Conflict},
		{"exclusion", "INSERT INTO x VALUES (tstzrange('2020-01-02', '2020-01-04'))", "23P01", fault.Conflict},
		{"serialization", raise("40001"), "40001", fault.Conflict},
		{"deadlock", raise("40P01"), "40P01", fault.Conflict},
		{"timeout", "SET LOCAL statement_timeout = 10; SELECT pg_sleep(1)", "57014", fault.Unavailable},
		{"admin shutdown", raise("57P01"), "57P01", fault.Unavailable},
		{"too many connections", raise("53300"), "53300", fault.Unavailable},
		{"division by zero", "SELECT 1/0", "22012", fault.Internal},
		{"syntax", "SELEC 1", "42601", fault.Internal},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, c.sql)
				return fmt.Errorf("wrapped: %w", err)
			})
			require.Error(t, err)
			require.Equal(t, c.state, pg.SQLState(err))
			tr := pg.Translate(err)
			require.Equal(t, c.code, fault.CodeOf(tr), "%v", tr)
			require.Equal(t, c.state, pg.SQLState(tr), "Translate keeps the cause")
		})
	}

	t.Run("no rows", func(t *testing.T) {
		var id int
		err := db.QueryRow(ctx, "SELECT id FROM u WHERE id = 42").Scan(&id)
		tr := pg.Translate(err)
		require.Equal(t, fault.NotFound, fault.CodeOf(tr))
		require.ErrorIs(t, tr, pgx.ErrNoRows)
		require.Equal(t, "", pg.SQLState(err))
	})
	t.Run("missing database", func(t *testing.T) {
		_, err := pg.Open(ctx, pg.Options{URL: pgtest.WithDatabase(db.URL, "bct_no_such_database")})
		require.Equal(t, fault.InvalidConfig, fault.CodeOf(err), "%v", err)
	})
	t.Run("passthrough", func(t *testing.T) {
		require.NoError(t, pg.Translate(nil))
		require.Equal(t, "", pg.SQLState(nil))
		coded := fault.New(fault.Fenced, "lost the lease")
		require.Same(t, coded, pg.Translate(coded))
		plain := errors.New("plain")
		require.Equal(t, plain, pg.Translate(plain))
		require.Equal(t, fault.Internal, fault.CodeOf(pg.Translate(plain)))
	})
}

// idleInTx counts the sessions of database name left inside a transaction.
func idleInTx(t *testing.T, name string) int {
	t.Helper()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, pgtest.AdminURL(t))
	require.NoError(t, err)
	defer admin.Close(ctx)
	var n int
	require.NoError(t, admin.QueryRow(ctx,
		"SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND state LIKE 'idle in transaction%'", name).Scan(&n))
	return n
}

// TestTerminatedConnectionsAreReplaced kills every pooled connection from another
// session; the next transaction runs on a fresh connection.
func TestTerminatedConnectionsAreReplaced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const size = 4
	db := pgtest.New(t, pgtest.Options{Empty: true, MaxConns: size})

	// Fill the pool: size connections checked out at once, then all released.
	pids := map[uint32]bool{}
	var conns []interface{ Release() }
	for range size {
		c, err := db.Pool.Acquire(ctx)
		require.NoError(t, err)
		pids[c.Conn().PgConn().PID()] = true
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
	require.Len(t, pids, size)
	require.Equal(t, int32(size), db.Stat().IdleConns())

	admin, err := pgx.Connect(ctx, pgtest.AdminURL(t))
	require.NoError(t, err)
	defer admin.Close(ctx)
	var killed int
	require.NoError(t, admin.QueryRow(ctx,
		"SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 10000)) FROM pg_stat_activity WHERE datname = $1",
		db.Name).Scan(&killed))
	require.Equal(t, size, killed)

	// Every pooled connection is now dead; several transactions in a row (and at
	// once) all succeed on fresh ones.
	var wg sync.WaitGroup
	errs := make(chan error, 2*size)
	newPIDs := make(chan uint32, 2*size)
	for range 2 * size {
		wg.Go(func() {
			errs <- pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
				var pid uint32
				if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
					return err
				}
				newPIDs <- pid
				return nil
			})
		})
	}
	wg.Wait()
	close(errs)
	close(newPIDs)
	for err := range errs {
		require.NoError(t, err)
	}
	for pid := range newPIDs {
		require.False(t, pids[pid], "ran on a terminated backend %d", pid)
	}

	// Pool.Begin (the helper's begin, used by River-facing code) recovers too.
	var alive int
	require.NoError(t, admin.QueryRow(ctx,
		"SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 10000)) FROM pg_stat_activity WHERE datname = $1",
		db.Name).Scan(&alive))
	require.Positive(t, alive)
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	var one int
	require.NoError(t, tx.QueryRow(ctx, "SELECT 1").Scan(&one))
	require.NoError(t, tx.Commit(ctx))
}

// TestServerRestart restarts the shared embedded cluster, so it must not overlap
// with any other test of this binary: it does not call t.Parallel, and Go runs
// the parallel tests only after every sequential one has finished.
func TestServerRestart(t *testing.T) {
	c := pgtest.Cluster(t)
	if c == nil {
		t.Skip("TEST_DATABASE_URL is set: the server is not ours to restart")
	}
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{Empty: true, MaxConns: 3})
	var before uint32
	require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		return tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&before)
	}))
	_, err := db.Exec(ctx, "SELECT 1")
	require.NoError(t, err)

	require.NoError(t, c.Restart(ctx, embedded.Options{Fast: true}))

	var after uint32
	require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		return tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&after)
	}))
	require.NotEqual(t, before, after)
	// The cluster keeps serving new databases too.
	db2 := pgtest.New(t, pgtest.Options{Empty: true})
	require.Equal(t, 1, db2.MustCount(t, "SELECT 1"))
}

// The password used in the error tests; it must never appear in an error.
const secret = "Sup3r-s3cret-pw"

func requireNoSecret(t *testing.T, err error) {
	t.Helper()
	require.Error(t, err)
	require.NotContains(t, err.Error(), secret)
	require.NotContains(t, err.Error(), strings.ToLower(secret))
}

func TestOpenErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("malformed", func(t *testing.T) {
		for _, u := range []string{
			"postgres://bob:" + secret + "@127.0.0.1:notaport/db",
			"postgres://bob:" + secret + "@127.0.0.1:5432/db?sslmode=bogus",
			"postgres://bob:" + secret + "@[::1/db",
			"host=127.0.0.1 port=notaport user=bob password=" + secret + " dbname=db",
			"host=127.0.0.1 user=bob password='" + secret + "' dbname=db sslmode=bogus",
		} {
			_, err := pg.Open(ctx, pg.Options{URL: u})
			requireNoSecret(t, err)
			require.Equal(t, fault.InvalidConfig, fault.CodeOf(err), "%s: %v", pg.RedactURL(u), err)
		}
	})

	t.Run("unreachable", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		port := l.Addr().(*net.TCPAddr).Port
		require.NoError(t, l.Close())
		for _, u := range []string{
			fmt.Sprintf("postgres://bob:%s@127.0.0.1:%d/db?connect_timeout=5", secret, port),
			fmt.Sprintf("host=127.0.0.1 port=%d user=bob password=%s dbname=db connect_timeout=5", port, secret),
		} {
			_, err := pg.Open(ctx, pg.Options{URL: u})
			requireNoSecret(t, err)
			require.Equal(t, fault.Unavailable, fault.CodeOf(err), "%v", err)
		}
	})

	t.Run("redact", func(t *testing.T) {
		u := "postgres://bob:" + secret + "@db.example:5432/app"
		require.NotContains(t, pg.RedactURL(u), secret)
		require.Contains(t, pg.RedactURL(u), "bob:xxxxx@db.example")
		require.Equal(t, "error near xxxxx", pg.Redact("error near "+secret, u))
		esc := "postgres://bob:p%40ss%2Fw0rd@db.example/app"
		require.NotContains(t, pg.RedactURL(esc), "p@ss/w0rd")
		require.NotContains(t, pg.Redact("a p@ss/w0rd b p%40ss%2Fw0rd", esc), "w0rd")
		kv := "host=db user=bob password=" + secret + " dbname=app"
		require.NotContains(t, pg.RedactURL(kv), secret)
	})

	// Secrets: what a worker removes from errors it stores in job rows, for
	// every way a connection string can give the password.
	t.Run("secrets", func(t *testing.T) {
		require.Empty(t, pg.Secrets("postgres://bob@db.example/app"))
		require.Equal(t, []string{secret}, pg.Secrets("postgres://bob:"+secret+"@db.example/app"))
		require.Equal(t, []string{secret}, pg.Secrets("host=db user=bob password="+secret+" dbname=app"))
		require.Equal(t, []string{"it's a s3cret", "it%27s+a+s3cret", "it%27s%20a%20s3cret"},
			pg.Secrets(`host=db user=bob password='it\'s a s3cret' dbname=app`))
		require.Equal(t, []string{"p@ss/w0rd", "p%40ss%2Fw0rd", "p@ss%2Fw0rd"}, pg.Secrets("postgres://bob:p%40ss%2Fw0rd@db.example/app"))
	})
}

// TestWrongPassword runs a cluster of its own that asks for passwords (the
// shared test cluster trusts every login), and checks that a refused login is
// INVALID_CONFIG (a configuration error, not an outage) saying that
// authentication failed, and that the password is not echoed.
func TestWrongPassword(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := pgtest.NewPasswordServer(t, "bob", secret)
	pool, err := pg.Open(ctx, pg.Options{URL: srv.URL(secret)})
	require.NoError(t, err, "the right password logs in")
	pool.Close()

	for _, u := range []string{
		srv.URL("wrong-" + secret),
		fmt.Sprintf("host=127.0.0.1 port=%d user=bob password=wrong-%s dbname=postgres sslmode=disable", srv.Port, secret),
	} {
		_, err := pg.Open(ctx, pg.Options{URL: u})
		requireNoSecret(t, err)
		require.Equal(t, fault.InvalidConfig, fault.CodeOf(err), "%v", err)
		require.Contains(t, err.Error(), "authentication failed")
	}
}

// TestFailedSavepointsLeaveTheDepth: a chain of failures inside one
// transaction (errors returned, failed statements, failures two levels down)
// leaves the transaction at the depth it had. A row's xmin is the
// (sub)transaction that wrote it: rows written at the top level before and
// after the chain share the top-level xid; had a rolled-back savepoint stayed
// open (pgx's nested transaction sends only ROLLBACK TO SAVEPOINT), the row
// after it would carry a subtransaction's xid. A savepoint that succeeded
// inside the chain writes at one level down, under a subtransaction xid.
func TestFailedSavepointsLeaveTheDepth(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{Empty: true})
	db.MustExec(t, "CREATE TABLE t (id int PRIMARY KEY)")
	failed := errors.New("failed")
	xmin := func(tx pgx.Tx, id int) (x uint32) {
		require.NoError(t, tx.QueryRow(ctx, "INSERT INTO t VALUES ($1) RETURNING xmin::text::bigint", id).Scan(&x))
		return x
	}
	err := pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		var top uint32
		require.NoError(t, tx.QueryRow(ctx, "SELECT pg_current_xact_id()::text::bigint").Scan(&top))
		require.Equal(t, top, xmin(tx, 1), "the first row is written at the top level")
		for i := range 5 {
			err := pg.InTx(ctx, tx, func(ctx context.Context, tx pgx.Tx) error {
				xmin(tx, 100+i)
				switch i % 3 {
				case 0:
					return failed
				case 1: // a failed statement
					_, err := tx.Exec(ctx, "INSERT INTO t VALUES (1)")
					return err
				default: // a failure two levels down, then one here
					require.Error(t, pg.InTx(ctx, tx, func(ctx context.Context, tx pgx.Tx) error {
						xmin(tx, 200+i)
						return failed
					}))
					require.NotEqual(t, top, xmin(tx, 300+i))
					return failed
				}
			})
			require.Error(t, err)
		}
		var inner uint32
		require.NoError(t, pg.InTx(ctx, tx, func(ctx context.Context, tx pgx.Tx) error {
			inner = xmin(tx, 2)
			return nil
		}))
		require.NotEqual(t, top, inner, "a savepoint writes under a subtransaction")
		require.Equal(t, top, xmin(tx, 3), "after five failed savepoints and a released one, the top level again")
		// pgx's own nested transaction, for contrast (what InTx used): rolled
		// back, its savepoint stays open and what follows runs one level down.
		nested, err := tx.Begin(ctx)
		require.NoError(t, err)
		require.NoError(t, nested.Rollback(ctx))
		require.NotEqual(t, top, xmin(tx, 4), "pgx's rolled-back savepoint is still open")
		return nil
	})
	require.NoError(t, err)
	rows, err := db.Query(ctx, "SELECT id FROM t ORDER BY id")
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	require.NoError(t, err)
	require.Equal(t, []int32{1, 2, 3, 4}, ids, "no row of a failed savepoint")
}
