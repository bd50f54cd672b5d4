package cli_test

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/cmd/better-compute/cli"
	"github.com/bettercompute/bettercompute/cmd/better-compute/cli/clitest"
	"github.com/bettercompute/bettercompute/domain/workflow"
	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

// doctorChecks are the names of doctor's checks on a migrated database, in order: the
// core checks, then the built-in modules' (tenancy's held and limits).
var doctorChecks = []string{"connect", "postgres", "features", "btree_gist", "ledger", "clock",
	"snapshot", "shards", "leases", "workers", "takeovers", "running", "strays", "queues", "reconcilers", "workflows",
	"held", "limits"}

// requireAllOK asserts that doctor passed: exit 0, and one OK line per check.
func requireAllOK(t *testing.T, r clitest.Result) {
	t.Helper()
	require.Equal(t, 0, r.Code, r.Stdout+r.Stderr)
	lines := strings.Split(strings.TrimSpace(r.Stdout), "\n")
	require.Len(t, lines, len(doctorChecks), r.Stdout)
	for i, l := range lines {
		require.Regexp(t, `^OK\s+`+doctorChecks[i]+`\s`, l, "every line is OK, in order")
	}
}

// requireErrLine asserts the CLI contract for a failed command: exit 1, stderr's
// last line is one `CODE: message` line matching want, and no line of stderr is a
// continuation (starts with white space).
func requireErrLine(t *testing.T, r clitest.Result, want string) {
	t.Helper()
	require.Regexp(t, want, requireOneLineError(t, r, "", 1))
	if out := strings.TrimSpace(r.Stdout); out != "" {
		for _, l := range strings.Split(out, "\n") {
			require.Regexp(t, `^(OK  |FAIL) \S+\s+\S`, l, "one line per check")
		}
	}
}

func TestDoctorAllOK(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{Empty: true})
	require.Equal(t, 0, clitest.Run(t, ctx, cli.App{}, dbEnv(db), "migrate").Code)

	r := clitest.Run(t, ctx, cli.App{}, dbEnv(db), "doctor")
	requireAllOK(t, r)
	require.Regexp(t, `(?m)^OK\s+clock\s+mode system`, r.Stdout)
}

// TestDoctorAsANonSuperuserOwner: the deployment most production databases
// have. A role that owns its database and is nothing more runs migrate, and
// doctor finds everything OK: no probe needs a superuser.
func TestDoctorAsANonSuperuserOwner(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewOwned(t)
	var super, readsStats bool
	require.NoError(t, db.QueryRow(ctx, `SELECT rolsuper, pg_has_role(current_user, 'pg_read_all_stats', 'MEMBER')
		FROM pg_roles WHERE rolname = current_user`).Scan(&super, &readsStats))
	require.False(t, super)
	require.False(t, readsStats)

	require.Equal(t, 0, clitest.Run(t, ctx, cli.App{}, dbEnv(db), "migrate").Code)
	r := clitest.Run(t, ctx, cli.App{}, dbEnv(db), "doctor")
	requireAllOK(t, r)
	require.Regexp(t, `(?m)^OK\s+features\s+.*SKIP LOCKED`, r.Stdout)
}

// TestDoctorNamesATransactionThatHoldsTheOutboxBack: an open write transaction
// in another database of the same server holds back every outbox reader (the
// snapshot's xmin is server-wide). doctor names its database and pid to a role
// that may see it, says that it cannot see it to one that may not, counts the
// events it holds back, and is OK again once it ends.
//
// Not parallel: while the transaction is open, every doctor run on the test
// server with a short --max-xact-age would see it.
func TestDoctorNamesATransactionThatHoldsTheOutboxBack(t *testing.T) {
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{Empty: true}) // as the superuser: sees every session
	require.Equal(t, 0, clitest.Run(t, ctx, cli.App{}, dbEnv(db), "migrate").Code)
	owned := pgtest.NewOwned(t) // sees only its own sessions
	require.Equal(t, 0, clitest.Run(t, ctx, cli.App{}, dbEnv(owned), "migrate").Code)
	other := pgtest.New(t, pgtest.Options{Empty: true})

	cfg, err := pgx.ParseConfig(other.URL)
	require.NoError(t, err)
	cfg.RuntimeParams["application_name"] = "held_open"
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "SELECT pg_current_xact_id()") // a write transaction: it has an id
	require.NoError(t, err)
	var pid int
	require.NoError(t, tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))

	// Events that commit after it took its transaction id wait for it.
	db.MustExec(t, "INSERT INTO compute_events (topic) VALUES ('doctor.test')")
	owned.MustExec(t, "INSERT INTO compute_events (topic) VALUES ('doctor.test')")
	require.Eventually(t, func() bool {
		return count(db, fmt.Sprintf(`SELECT count(*) FROM pg_stat_activity
			WHERE pid = %d AND backend_xid IS NOT NULL
			AND clock_timestamp() - xact_start > interval '300 milliseconds'`, pid)) == 1
	}, 30*time.Second, 10*time.Millisecond, "open longer than --max-xact-age")

	r := clitest.Run(t, ctx, cli.App{}, dbEnv(db), "doctor", "--max-xact-age", "200ms")
	require.Regexp(t, `(?m)^FAIL\s+snapshot\s+a write transaction open longer than 200ms holds back every outbox reader on this server: `+
		`open \S+, database `+regexp.QuoteMeta(other.Name)+`, pid `+strconv.Itoa(pid)+`, user postgres, application "held_open", state idle in transaction; `+
		`1 committed event of this database waits`, r.Stdout)
	require.Contains(t, r.Stdout, fmt.Sprintf("pg_terminate_backend(%d)", pid))
	requireErrLine(t, r, `^INVALID_CONFIG: doctor: 1 of 18 checks failed: snapshot$`)

	r = clitest.Run(t, ctx, cli.App{}, dbEnv(owned), "doctor", "--max-xact-age", "200ms")
	require.Regexp(t, `(?m)^FAIL\s+snapshot\s+1 committed event of this database waits, `+
		`held back by a transaction this role cannot see \(grant pg_read_all_stats to name it\)`, r.Stdout)
	requireErrLine(t, r, `^INVALID_CONFIG: doctor: 1 of 18 checks failed: snapshot$`)

	require.NoError(t, tx.Rollback(ctx))
	requireAllOK(t, clitest.Run(t, ctx, cli.App{}, dbEnv(db), "doctor", "--max-xact-age", "200ms"))
	requireAllOK(t, clitest.Run(t, ctx, cli.App{}, dbEnv(owned), "doctor", "--max-xact-age", "200ms"))
}

// TestDoctorFindsStrayRunningJobs: a running job of a shard queue attempted by
// a client that does not hold the shard's lease (a process that lost it, woke
// and fetched) is a stray. One younger than two renewal intervals is the
// holder's to hand back; an older one fails, naming the shard, the count, the
// client and what to do.
func TestDoctorFindsStrayRunningJobs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	// Renewals every 20 s: a stray is older than 40 s.
	env := append(dbEnv(db), "BETTER_COMPUTE_LEASE_TTL=60s", "BETTER_COMPUTE_LEASE_RENEW=20s")
	running := func(shard int, client string, attemptedAt time.Time) {
		t.Helper()
		db.MustExec(t, `INSERT INTO river_job (args, kind, max_attempts, queue, state, attempt, attempted_at, attempted_by)
			VALUES ('{}', 'reconcile', 25, $1, 'running', 1, $2, ARRAY[$3])`, jobs.ShardQueue(shard), attemptedAt, client)
	}
	db.MustExec(t, `INSERT INTO compute_leases (name, owner, expires_at)
		VALUES ($1, 'w1', compute_now() + interval '1 hour')`, workers.ShardLease(7))
	running(7, "w1", time.Now().Add(-2*time.Minute))    // the holder's own
	running(5, "ghost", time.Now())                     // a stray, but young
	running(3, "ghost", time.Now().Add(-2*time.Minute)) // a stray, old, and nobody holds shard 3

	r := clitest.Run(t, ctx, cli.App{}, env, "doctor")
	require.Regexp(t, `(?m)^FAIL\s+strays\s+running jobs not attempted by their shard's holder, for more than 40s: `+
		`shard 3: 1 running job attempted by ghost, the oldest 2m\d+s ago \(none holds shard 3: start a worker for it\); `+
		`the shard's holder hands them back within one renewal \(20s\)$`, r.Stdout)
	requireErrLine(t, r, `^INVALID_CONFIG: doctor: 1 of 18 checks failed: strays$`)

	// Held by another client: its holder should have handed it back by now.
	db.MustExec(t, `INSERT INTO compute_leases (name, owner, expires_at)
		VALUES ($1, 'w2', compute_now() + interval '1 hour')`, workers.ShardLease(3))
	r = clitest.Run(t, ctx, cli.App{}, env, "doctor")
	require.Regexp(t, `(?m)^FAIL\s+strays\s+.*shard 3: 1 running job attempted by ghost, .*\(held by w2, which has not handed them back`, r.Stdout)

	// Held by the client that attempted it: not a stray. The young one is noted.
	db.MustExec(t, `UPDATE compute_leases SET owner = 'ghost' WHERE name = $1`, workers.ShardLease(3))
	r = clitest.Run(t, ctx, cli.App{}, env, "doctor")
	requireAllOK(t, r)
	require.Regexp(t, `(?m)^OK\s+strays\s+1 running job attempted by a client that does not hold the shard, for less than 40s`, r.Stdout)
}

// TestDoctorFindsDirtyKeysNoReconcilerHandles: workers.DirtyTx accepts any valid
// kind; keys of a kind no registered reconciler handles wait forever, and
// doctor names the kind and its keys.
func TestDoctorFindsDirtyKeysNoReconcilerHandles(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	app := cli.App{Modules: []cli.Module{{Name: "things", Register: func(r *workers.Registry) error {
		return workers.AddReconciler(r, workers.Reconciler{Kind: "thing", Reconcile: func(context.Context, pgx.Tx, string) (workers.Result, error) {
			return workers.Result{}, nil
		}})
	}}}}
	require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		for _, k := range []struct{ kind, key string }{{"no_such_kind", "k"}, {"thing", "a"}, {"thing", "b"}} {
			if err := workers.DirtyTx(ctx, tx, k.kind, k.key, nil); err != nil {
				return err
			}
		}
		return nil
	}))

	r := clitest.Run(t, ctx, app, dbEnv(db), "doctor")
	require.Regexp(t, `(?m)^FAIL\s+reconcilers\s+no registered reconciler handles the dirty keys of no_such_kind \(1 key\): `+
		`a typo in workers.DirtyTx, or a module missing from this binary \(registered: thing\)$`, r.Stdout)
	// Nobody works the shards either: the keys' jobs wait.
	require.Regexp(t, `(?m)^FAIL\s+leases\s`, r.Stdout)
	requireErrLine(t, r, `^INVALID_CONFIG: doctor: 2 of 18 checks failed: leases, reconcilers$`)

	// A binary without the module handles neither kind.
	r = clitest.Run(t, ctx, cli.App{}, dbEnv(db), "doctor")
	require.Regexp(t, `(?m)^FAIL\s+reconcilers\s+no registered reconciler handles the dirty keys of no_such_kind \(1 key\), thing \(2 keys\): `, r.Stdout)
}

// TestDoctorSaysWhatFailedToConnect: a failed connection ends stderr with one
// line that carries its code and says what failed.
func TestDoctorSaysWhatFailedToConnect(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	port := refusedPort(t)

	r := clitest.Run(t, ctx, cli.App{}, []string{fmt.Sprintf("BETTER_COMPUTE_DATABASE_URL=postgres://bob@127.0.0.1:%d/db?connect_timeout=5", port)}, "doctor")
	require.Regexp(t, `^FAIL connect\s+\S`, r.Stdout)
	requireErrLine(t, r, `^UNAVAILABLE: doctor: connect failed: .*127\.0\.0\.1`)

	// A role the server does not know: the configuration is wrong.
	db := pgtest.New(t, pgtest.Options{Empty: true})
	r = clitest.Run(t, ctx, cli.App{}, []string{"BETTER_COMPUTE_DATABASE_URL=" + pgtest.WithUser(db.URL, "no_such_role", "")}, "doctor")
	requireErrLine(t, r, `^INVALID_CONFIG: doctor: connect failed: .*no_such_role`)

	// A bad threshold is a usage error.
	r = clitest.Run(t, ctx, cli.App{}, dbEnv(db), "doctor", "--max-xact-age", "0s")
	requireErrLine(t, r, `^INVALID_ARGUMENT: doctor: --max-xact-age must be positive`)
}

// TestDoctorReportIsOneLinePerCheck: a driver error that lists several
// addresses tried (here the two hosts of a multi-host URL, both refusing; a
// localhost that resolves to ::1 and 127.0.0.1 does the same) is one line of
// the report, each attempt separated by "; " rather than run into the next,
// and so is the command's error line.
func TestDoctorReportIsOneLinePerCheck(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	port := refusedPort(t)
	url := fmt.Sprintf("postgres://bob@127.0.0.1:%[1]d,127.0.0.2:%[1]d/db?connect_timeout=5", port)

	r := clitest.Run(t, ctx, cli.App{}, []string{"BETTER_COMPUTE_DATABASE_URL=" + url}, "doctor")
	lines := strings.Split(strings.TrimSuffix(r.Stdout, "\n"), "\n")
	for _, l := range lines {
		require.Regexp(t, `^(OK  |FAIL) \S+\s+\S`, l, "every line of the report is a check's")
	}
	require.Len(t, lines, 1, r.Stdout)
	attempt := func(host string) string {
		return regexp.QuoteMeta(fmt.Sprintf("%s:%d (%s): dial error: dial tcp %s:%d: connect: connection refused", host, port, host, host, port))
	}
	both := "`: " + attempt("127.0.0.1") + "; (" + attempt("127.0.0.1") + "; )?" + attempt("127.0.0.2")
	require.Regexp(t, `^FAIL connect\s+cannot reach the database: failed to connect to .*`+both, lines[0])
	requireErrLine(t, r, `^UNAVAILABLE: doctor: connect failed: .*`+both)
}

func TestDoctorFailsOnATamperedLedger(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{Empty: true})
	require.Equal(t, 0, clitest.Run(t, ctx, cli.App{}, dbEnv(db), "migrate").Code)
	db.MustExec(t, "INSERT INTO compute_migrations (name, applied_at) VALUES ('core/9999_future', compute_now())")

	r := clitest.Run(t, ctx, cli.App{}, dbEnv(db), "doctor")
	require.NotEqual(t, 0, r.Code)
	require.Regexp(t, `(?m)^FAIL\s+ledger\s+.*core/9999_future`, r.Stdout)
	require.Regexp(t, `(?m)^OK\s+connect`, r.Stdout, "the other checks still run")
	require.Contains(t, r.Stderr, "INVALID_CONFIG")

	// migrate refuses it too, and applies nothing.
	before := ledger(t, db)
	r = clitest.Run(t, ctx, cli.App{}, dbEnv(db), "migrate")
	require.Equal(t, 1, r.Code)
	require.Contains(t, r.Stderr, "INVALID_CONFIG")
	require.Contains(t, r.Stderr, "core/9999_future")
	require.Equal(t, before, ledger(t, db))
}

func TestDoctorFailsOnAMissingExtension(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{Empty: true})
	r := clitest.Run(t, ctx, cli.App{}, dbEnv(db), "doctor")
	require.NotEqual(t, 0, r.Code)
	require.Regexp(t, `(?m)^FAIL\s+btree_gist\s`, r.Stdout)
	require.Regexp(t, `(?m)^FAIL\s+ledger\s+.*pending`, r.Stdout)
	require.Regexp(t, `(?m)^FAIL\s+clock\s+.*missing`, r.Stdout)
	require.Regexp(t, `(?m)^OK\s+connect`, r.Stdout)
}

// TestDoctorFindsAWorkflowWithoutAStepJob: a workflow whose step job an
// operator cancelled never advances: doctor FAILs naming it, and workflow
// retry gives it a new job (then doctor is OK).
func TestDoctorFindsAWorkflowWithoutAStepJob(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	db.MustExec(t, `INSERT INTO compute_workflow_kinds (kind, steps) VALUES ('order', '{reserve}')`)
	require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		_, err := startKind(ctx, tx, "order", map[string]string{"id": "o-1"}, &workflow.StartOpts{ID: "o-1"})
		return err
	}))
	app := cli.App{}
	// (No worker runs: leases FAILs for the waiting job; this test reads the
	// workflows line.)
	r := clitest.Run(t, ctx, app, dbEnv(db), "doctor")
	require.Regexp(t, `(?m)^OK\s+workflows\s+1 unfinished workflow, each with a live step job$`, r.Stdout)

	db.MustExec(t, `UPDATE river_job SET state = 'cancelled', finalized_at = clock_timestamp() WHERE kind = 'workflow_step'`)
	r = clitest.Run(t, ctx, app, dbEnv(db), "doctor")
	requireErrLine(t, r, `^INVALID_CONFIG: doctor: 1 of 18 checks failed: workflows$`)
	require.Regexp(t, `(?m)^FAIL\s+workflows\s+1 unfinished workflow have no live step job and will never advance: o-1 \(order at step reserve, job \d+ cancelled\)`, r.Stdout)

	require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error { return workflow.RetryTx(ctx, tx, "o-1") }))
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'workflow_step' AND state = 'available' AND args->>'seq' = '2'`))
	r = clitest.Run(t, ctx, app, dbEnv(db), "doctor")
	require.Regexp(t, `(?m)^OK\s+workflows\s+1 unfinished workflow, each with a live step job$`, r.Stdout)
	// A workflow whose job is live has nothing to retry.
	err := pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error { return workflow.RetryTx(ctx, tx, "o-1") })
	require.True(t, fault.Has(err, fault.Conflict), "%v", err)
}

// TestShardCountFixedAtFirstMigrate: the first migrate stores the configured
// shard count; a later migrate, worker or doctor configured with another count
// does not change it. migrate and worker warn and use the stored count, and
// doctor fails its shards check, naming both counts, until the configuration
// agrees.
func TestShardCountFixedAtFirstMigrate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{Empty: true})
	four := append(dbEnv(db), "BETTER_COMPUTE_SHARD_COUNT=4")
	eight := append(dbEnv(db), "BETTER_COMPUTE_SHARD_COUNT=8")
	require.Equal(t, 0, clitest.Run(t, ctx, cli.App{}, four, "migrate").Code)
	require.Equal(t, 4, db.MustCount(t, `SELECT shard_count FROM compute_settings`))

	r := clitest.Run(t, ctx, cli.App{}, eight, "migrate")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stderr, "BETTER_COMPUTE_SHARD_COUNT differs from the shard count fixed at the first migrate")
	require.Equal(t, 4, db.MustCount(t, `SELECT shard_count FROM compute_settings`), "a later migrate changed the shard count")
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM compute_settings`))

	// A worker configured with 8 shards works the stored 4: shard 7 does not exist.
	r = clitest.Run(t, ctx, cli.App{}, eight, "worker", "--no-migrate", "--shards", "0-7")
	require.Equal(t, 1, r.Code, r.Stderr)
	require.Contains(t, r.Stderr, "differs from the stored shard count; using the stored one")
	require.Contains(t, r.Stderr, "4 shards (0-3)")

	r = clitest.Run(t, ctx, cli.App{}, eight, "doctor")
	require.Regexp(t, `(?m)^FAIL\s+shards\s+the database has 4 shards, BETTER_COMPUTE_SHARD_COUNT says 8: the count is fixed at the first migrate; set it to 4$`, r.Stdout)
	requireErrLine(t, r, `^INVALID_CONFIG: doctor: 1 of 18 checks failed: shards$`)
	requireAllOK(t, clitest.Run(t, ctx, cli.App{}, four, "doctor"))
	require.Equal(t, 4, db.MustCount(t, `SELECT shard_count FROM compute_settings`))
}

// TestDoctorShowsWorkersHeartbeatsAndTakeovers: the workers check names each
// running worker with its last heartbeat and what it holds, and fails for a
// worker silent past its dead_after that still holds leases (no standby took
// them); the takeovers check counts the leases that changed hands, by reason.
func TestDoctorShowsWorkersHeartbeatsAndTakeovers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	a := workertest.Claim(t, db.Pool, "host-a/0", "host-a")
	workertest.HoldLeases(t, db.Pool, a, time.Hour, workers.ShardLease(0), workers.ShardLease(1))
	b := workertest.Claim(t, db.Pool, "host-b/0", "host-b")

	r := clitest.Run(t, ctx, cli.App{}, dbEnv(db), "doctor")
	require.Regexp(t, `(?m)^OK\s+workers\s+2 live: host-a/0#1 on host-a \(beat \d+(\.\d)?m?s ago, 2 leases\), host-b/0#1 on host-b \(beat \d+(\.\d)?m?s ago, standby\)$`, r.Stdout)
	require.Regexp(t, `(?m)^OK\s+takeovers\s+no lease has changed hands$`, r.Stdout)

	// a stops beating; b has not taken its shards yet.
	db.MustExec(t, `UPDATE compute_workers SET seen_at = compute_now() - interval '30 seconds' WHERE identity = 'host-a/0'`)
	r = clitest.Run(t, ctx, cli.App{}, dbEnv(db), "doctor")
	require.Regexp(t, `(?m)^FAIL\s+workers\s+host-a/0#1 \(host host-a, pid \d+\) holds 2 leases but has not beaten for 3\d(\.\d)?s \(dead after 2s\): no standby has taken them`, r.Stdout)

	// b takes them: the workers check passes, the takeovers check counts them.
	workertest.HoldLeases(t, db.Pool, b, time.Hour, workers.ShardLease(0), workers.ShardLease(1))
	// b beats as its keeper would (no keeper runs here: on a loaded machine the
	// test may outlast b's 2 s of life since its claim).
	db.MustExec(t, `UPDATE compute_workers SET seen_at = compute_now() WHERE identity = 'host-b/0'`)
	r = clitest.Run(t, ctx, cli.App{}, dbEnv(db), "doctor")
	require.Regexp(t, `(?m)^OK\s+workers\s+1 live: host-a/0#1 on host-a \(silent for 3\ds, taken for dead, standby\), host-b/0#1 on host-b \(beat .* ago, 2 leases\)$`, r.Stdout)
	require.Regexp(t, `(?m)^OK\s+takeovers\s+leases changed hands: 2 after the holder's heartbeat stopped \(last \S+: shard/0 from host-a/0#1 to host-b/0#1\)$`, r.Stdout)
}

// TestAModuleBringsItsOwnDoctorChecks: doctor prints an application module's
// checks after the built-in ones, and one that fails fails doctor with its code.
func TestAModuleBringsItsOwnDoctorChecks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{Empty: true})
	open := 0
	app := cli.App{Name: "shop", Modules: []cli.Module{{Name: "shop",
		Checks: func(ctx context.Context, _ *cli.Session, db *pg.Pool) []cli.Check {
			var n int
			if err := db.QueryRow(ctx, `SELECT count(*) FROM compute_leases`).Scan(&n); err != nil {
				return []cli.Check{{Name: "orders", Detail: err.Error(), Code: fault.Unavailable}}
			}
			return []cli.Check{{Name: "orders", OK: open == 0, Detail: fmt.Sprintf("%d orders open too long, %d leases", open, n), Code: fault.Conflict}}
		}}}}
	require.Equal(t, 0, clitest.Run(t, ctx, app, dbEnv(db), "migrate").Code)

	r := clitest.Run(t, ctx, app, dbEnv(db), "doctor")
	require.Equal(t, 0, r.Code, r.Stdout+r.Stderr)
	lines := strings.Split(strings.TrimSpace(r.Stdout), "\n")
	require.Len(t, lines, len(doctorChecks)+1)
	require.Regexp(t, `^OK\s+orders\s+0 orders open too long, 0 leases$`, lines[len(lines)-1], "after the built-in checks")

	open = 3
	r = clitest.Run(t, ctx, app, dbEnv(db), "doctor")
	requireErrLine(t, r, `^CONFLICT: doctor: orders failed: 3 orders open too long`)
}
