package cli_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/cmd/better-compute/cli"
	"github.com/bettercompute/bettercompute/cmd/better-compute/cli/clitest"
	"github.com/bettercompute/bettercompute/cmd/better-compute/demo"
	"github.com/bettercompute/bettercompute/platform/config"
	"github.com/bettercompute/bettercompute/platform/migrate"
	"github.com/bettercompute/bettercompute/platform/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func dbEnv(db *pgtest.DB) []string {
	return []string{"BETTER_COMPUTE_DATABASE_URL=" + db.URL, "BETTER_COMPUTE_LOG_LEVEL=warn"}
}

// builtinNames are the names of the built-in migration set, in order.
func builtinNames(t *testing.T) []string {
	t.Helper()
	set, err := migrate.Builtin()
	require.NoError(t, err)
	var out []string
	for _, m := range set.Migrations() {
		out = append(out, m.Name())
	}
	require.NotEmpty(t, out)
	return out
}

// binaryNames are the names of the better-compute binary's migrations, in
// order: the built-in set, then its demo application's.
func binaryNames(t *testing.T) []string {
	t.Helper()
	out := builtinNames(t)
	for _, m := range demo.Modules() {
		ms, err := migrate.FromFS(m.Name, m.Migrations)
		require.NoError(t, err)
		for _, mg := range ms {
			out = append(out, mg.Name())
		}
	}
	return out
}

func ledger(t *testing.T, db *pgtest.DB) []string {
	t.Helper()
	rows, err := db.Query(context.Background(), "SELECT name FROM compute_migrations ORDER BY name")
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return names
}

// count runs a count query, for conditions polled by require.Eventually (which
// must not fail the test from its own goroutine): -1 on error.
func count(db *pgtest.DB, sql string) int {
	var n int
	if err := db.QueryRow(context.Background(), sql).Scan(&n); err != nil {
		return -1
	}
	return n
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

var appliedLine = regexp.MustCompile(`(?m)^applied (\S+)$`)

func appliedIn(stdout string) []string {
	var out []string
	for _, m := range appliedLine.FindAllStringSubmatch(stdout, -1) {
		out = append(out, m[1])
	}
	return out
}

func TestMigrateTwice(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{Empty: true})
	want := builtinNames(t)

	r := clitest.Run(t, ctx, cli.App{}, dbEnv(db), "migrate")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Equal(t, want, appliedIn(r.Stdout), "prints each migration it applied, in order")
	require.Contains(t, r.Stdout, fmt.Sprintf("migrate: %d applied, 0 already current", len(want)))
	require.Equal(t, sorted(want), ledger(t, db))
	require.Equal(t, 1, db.MustCount(t, "SELECT count(*) FROM pg_extension WHERE extname = 'btree_gist'"), "migrate creates btree_gist")

	r = clitest.Run(t, ctx, cli.App{}, dbEnv(db), "migrate")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Empty(t, appliedIn(r.Stdout), "the second run applies nothing")
	require.Contains(t, r.Stdout, fmt.Sprintf("migrate: 0 applied, %d already current", len(want)))
	require.Equal(t, sorted(want), ledger(t, db))
}

func TestMigrateWithAnApplicationModule(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{Empty: true})
	app := cli.App{Modules: []cli.Module{{Name: "inventory", Migrations: fstest.MapFS{
		"0001_items.sql": {Data: []byte("CREATE TABLE inventory_items (id bigint PRIMARY KEY, at timestamptz NOT NULL DEFAULT compute_now())")},
	}}}}
	r := clitest.Run(t, ctx, app, dbEnv(db), "migrate")
	require.Equal(t, 0, r.Code, r.Stderr)
	applied := appliedIn(r.Stdout)
	require.Equal(t, "inventory/0001_items", applied[len(applied)-1], "application modules run last")
	require.Equal(t, 1, db.MustCount(t, "SELECT count(*) FROM compute_migrations WHERE name = 'inventory/0001_items'"))

	// A module with a badly named file fails before anything touches the store.
	db2 := pgtest.New(t, pgtest.Options{Empty: true})
	bad := cli.App{Modules: []cli.Module{{Name: "inventory", Migrations: fstest.MapFS{"1_items.sql": {Data: []byte("SELECT 1")}}}}}
	r = clitest.Run(t, ctx, bad, dbEnv(db2), "migrate")
	require.Equal(t, 1, r.Code)
	require.Contains(t, r.Stderr, "INVALID_CONFIG")
	require.Contains(t, r.Stderr, "inventory/1_items.sql")
	require.Equal(t, 0, db2.MustCount(t, "SELECT count(*) FROM pg_class WHERE relname = 'compute_migrations'"))
}

func TestMigrateValidatesTheConfigurationFirst(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{Empty: true})
	r := clitest.Run(t, ctx, cli.App{}, append(dbEnv(db), "BETTER_COMPUTE_DB_MAX_CONNS=0"), "migrate")
	require.Equal(t, 1, r.Code)
	require.Contains(t, r.Stderr, "INVALID_CONFIG")
	require.Contains(t, r.Stderr, "BETTER_COMPUTE_DB_MAX_CONNS")
	require.Equal(t, 0, db.MustCount(t, "SELECT count(*) FROM pg_class WHERE relname = 'compute_migrations'"), "the store was not touched")

	// A flag overrides the bad variable.
	r = clitest.Run(t, ctx, cli.App{}, append(dbEnv(db), "BETTER_COMPUTE_DB_MAX_CONNS=0"), "migrate", "--db-max-conns", "3")
	require.Equal(t, 0, r.Code, r.Stderr)
}

func TestHelpListsEveryVariable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg, err := config.Load(nil)
	require.NoError(t, err)
	fields := cfg.Fields()
	require.NotEmpty(t, fields)

	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}, {"migrate", "--help"}, {"doctor", "--help"}, {"dev", "--help"}} {
		r := clitest.Run(t, ctx, cli.App{}, nil, args...)
		require.Equal(t, 0, r.Code, args)
		for _, f := range fields {
			def := f.Default
			if def == "" {
				def = "-"
			}
			require.Regexp(t, `(?m)^\s+`+f.Env+`\s+--`+regexp.QuoteMeta(f.Flag)+`\s+`+regexp.QuoteMeta(def)+`\s`, r.Stdout, "%v: %s", args, f.Env)
		}
	}
	r := clitest.Run(t, ctx, cli.App{}, nil, "--help")
	for _, c := range []string{"migrate", "doctor", "dev"} {
		require.Regexp(t, `(?m)^\s+`+c+`\s`, r.Stdout)
	}
	r = clitest.Run(t, ctx, cli.App{}, nil, "migrate", "--help")
	require.Contains(t, r.Stdout, "--dev")
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := clitest.Run(t, ctx, cli.App{}, nil, "frobnicate")
	require.Equal(t, 2, r.Code)
	require.Contains(t, r.Stderr, `unknown command "frobnicate"`)

	r = clitest.Run(t, ctx, cli.App{}, nil)
	require.Equal(t, 2, r.Code, "no command")
	require.Contains(t, r.Stdout, "Usage")

	r = clitest.Run(t, ctx, cli.App{}, nil, "migrate", "--no-such-flag")
	require.Equal(t, 2, r.Code)
	require.Contains(t, r.Stderr, "no-such-flag")
}

func TestEmbeddedNeedsDev(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "pg")
	for _, cmd := range []string{"migrate", "doctor"} {
		r := clitest.Run(t, ctx, cli.App{}, []string{"BETTER_COMPUTE_DATABASE_URL=embedded:" + dir}, cmd)
		require.Equal(t, 1, r.Code, cmd)
		require.Contains(t, r.Stdout+r.Stderr, "INVALID_CONFIG", cmd)
		require.Contains(t, r.Stdout+r.Stderr, "--dev", cmd)
	}
	require.NoDirExists(t, dir, "no cluster was created")
}

func TestMigrateWithDevOnAnEmbeddedCluster(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := clitest.Run(t, ctx, cli.App{}, []string{"BETTER_COMPUTE_DATABASE_URL=embedded:memory", "BETTER_COMPUTE_LOG_LEVEL=warn"}, "migrate", "--dev")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Equal(t, builtinNames(t), appliedIn(r.Stdout))
}

func TestErrorsNeverShowThePassword(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	port := refusedPort(t)
	const secret = "Cli-s3cret-pw"
	for _, u := range []string{
		fmt.Sprintf("postgres://bob:%s@127.0.0.1:%d/db?connect_timeout=5", secret, port),
		"postgres://bob:" + secret + "@127.0.0.1:notaport/db",
	} {
		for _, cmd := range []string{"migrate", "doctor"} {
			r := clitest.Run(t, ctx, cli.App{}, []string{"BETTER_COMPUTE_DATABASE_URL=" + u, "BETTER_COMPUTE_LOG_LEVEL=debug"}, cmd)
			require.Equal(t, 1, r.Code)
			require.NotContains(t, r.Stdout+r.Stderr, secret)
			require.Regexp(t, `UNAVAILABLE|INVALID_CONFIG`, r.Stdout+r.Stderr)
		}
	}
}

// TestInterruptedMigrateRollsBack cancels migrate's context (what SIGINT does in
// cli.Main) while an application migration runs: that migration rolls back, the
// command fails with UNAVAILABLE, and the next run finishes the job.
func TestInterruptedMigrateRollsBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{Empty: true})
	// It sleeps while go_slow exists: the same module is slow, then fast.
	db.MustExec(t, "CREATE TABLE go_slow ()")
	app := cli.App{Modules: []cli.Module{{Name: "slowapp", Migrations: fstest.MapFS{
		"0001_slow.sql": {Data: []byte("CREATE TABLE slowapp_t (id int); SELECT pg_sleep(CASE WHEN to_regclass('go_slow') IS NULL THEN 0 ELSE 60 END)")},
	}}}}

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan clitest.Result, 1)
	go func() { done <- clitest.Run(t, runCtx, app, dbEnv(db), "migrate") }()
	require.Eventually(t, func() bool {
		return count(db, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event = 'PgSleep'") > 0
	}, 60*time.Second, 10*time.Millisecond)
	cancel()
	var r clitest.Result
	select {
	case r = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("migrate did not stop after its context was cancelled")
	}
	require.Equal(t, 1, r.Code)
	require.Contains(t, r.Stderr, "UNAVAILABLE")
	require.Contains(t, r.Stderr, "slowapp/0001_slow")
	require.Equal(t, 0, db.MustCount(t, "SELECT count(*) FROM compute_migrations WHERE name LIKE 'slowapp/%'"))
	require.Equal(t, 0, db.MustCount(t, "SELECT count(*) FROM pg_class WHERE relname = 'slowapp_t'"))
	require.Equal(t, sorted(builtinNames(t)), ledger(t, db), "the migrations before it stay applied")

	db.MustExec(t, "DROP TABLE go_slow")
	r = clitest.Run(t, ctx, app, dbEnv(db), "migrate")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Equal(t, []string{"slowapp/0001_slow"}, appliedIn(r.Stdout))
}

// build builds cmd/better-compute into dir.
func build(t *testing.T, dir string) string {
	t.Helper()
	return buildPkg(t, dir, "github.com/bettercompute/bettercompute/cmd/better-compute")
}

// buildPkg builds the main package pkg into dir and returns the binary's path.
func buildPkg(t *testing.T, dir, pkg string) string {
	t.Helper()
	bin := filepath.Join(dir, filepath.Base(pkg))
	out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput()
	require.NoError(t, err, "go build:\n%s", out)
	return bin
}

// processEnv is this process's environment without any BETTER_COMPUTE_
// variable, plus env.
func processEnv(env ...string) []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, config.Prefix) {
			out = append(out, kv)
		}
	}
	return append(out, env...)
}

// TestMigrateProcesses runs the built binary: two migrate processes at once on
// one fresh database, then a migrate interrupted with SIGINT.
func TestMigrateProcesses(t *testing.T) {
	t.Parallel()
	bin := build(t, t.TempDir())
	want := binaryNames(t)

	t.Run("two at once", func(t *testing.T) {
		db := pgtest.New(t, pgtest.Options{Empty: true})
		var cmds []*exec.Cmd
		var outs []*bytes.Buffer
		for range 2 {
			var out bytes.Buffer
			cmd := exec.Command(bin, "migrate")
			cmd.Env = processEnv(dbEnv(db)...)
			cmd.Stdout = &out
			cmd.Stderr = &out
			cmds = append(cmds, cmd)
			outs = append(outs, &out)
		}
		for _, c := range cmds {
			require.NoError(t, c.Start())
		}
		var applied []string
		for i, c := range cmds {
			require.NoError(t, c.Wait(), "process %d:\n%s", i, outs[i])
			t.Logf("process %d:\n%s", i, outs[i])
			got := appliedIn(outs[i].String())
			require.Contains(t, outs[i].String(), fmt.Sprintf("migrate: %d applied, %d already current", len(got), len(want)-len(got)))
			applied = append(applied, got...)
		}
		require.Equal(t, sorted(want), sorted(applied), "each migration applied by exactly one process")
		require.Equal(t, sorted(want), ledger(t, db))
	})

	t.Run("SIGINT", func(t *testing.T) {
		ctx := context.Background()
		db := pgtest.New(t, pgtest.Options{Empty: true})
		// The ledger and the extension exist; a session holding the migration lock
		// keeps the first migration waiting inside its transaction.
		require.NoError(t, migrate.EnsureExtensions(ctx, db.Pool))
		empty, err := migrate.NewSet()
		require.NoError(t, err)
		_, err = empty.Apply(ctx, db.Pool, nil)
		require.NoError(t, err)
		holder, err := pgx.Connect(ctx, db.URL)
		require.NoError(t, err)
		defer holder.Close(ctx)
		lock, err := holder.Begin(ctx)
		require.NoError(t, err)
		_, err = lock.Exec(ctx, "SELECT pg_advisory_xact_lock($1, $2)", migrate.LockKey1, migrate.LockKey2)
		require.NoError(t, err)

		var out bytes.Buffer
		cmd := exec.Command(bin, "migrate")
		cmd.Env = processEnv(dbEnv(db)...)
		cmd.Stdout = &out
		cmd.Stderr = &out
		require.NoError(t, cmd.Start())
		require.Eventually(t, func() bool {
			return count(db, `SELECT count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND wait_event_type = 'Lock' AND wait_event = 'advisory'`) > 0
		}, 60*time.Second, 10*time.Millisecond)
		require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
		err = cmd.Wait()
		t.Logf("interrupted migrate:\n%s", out.String())
		var exit *exec.ExitError
		require.ErrorAs(t, err, &exit)
		require.Equal(t, 1, exit.ExitCode())
		require.Contains(t, out.String(), "UNAVAILABLE")
		require.Contains(t, out.String(), want[0], "names the migration in flight")
		require.Empty(t, ledger(t, db))
		require.Equal(t, 0, db.MustCount(t, "SELECT count(*) FROM pg_proc WHERE proname = 'compute_now'"))

		require.NoError(t, lock.Commit(ctx))
		out.Reset()
		cmd = exec.Command(bin, "migrate")
		cmd.Env = processEnv(dbEnv(db)...)
		cmd.Stdout = &out
		cmd.Stderr = &out
		require.NoError(t, cmd.Run(), out.String())
		require.Equal(t, want, appliedIn(out.String()))
		require.Equal(t, sorted(want), ledger(t, db))
	})
}
