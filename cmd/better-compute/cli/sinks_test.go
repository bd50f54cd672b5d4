package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/cmd/better-compute/cli"
	"github.com/bettercompute/bettercompute/cmd/better-compute/cli/clitest"
	"github.com/bettercompute/bettercompute/domain/outbox"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers"
)

// runSinks runs `better-compute sinks args…` in-process with app against db.
func runSinks(t *testing.T, app cli.App, db *pgtest.DB, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := cli.Run(context.Background(), app, append([]string{"sinks"}, args...), cli.Env{
		Stdout: &stdout, Stderr: &stderr,
		Environ: clitest.WithStatementCache([]string{"BETTER_COMPUTE_DATABASE_URL=" + db.URL, "BETTER_COMPUTE_LOG_LEVEL=warn"}),
	})
	t.Logf("sinks %s: exit %d\n%s%s", strings.Join(args, " "), code, stdout.String(), stderr.String())
	return code, stdout.String(), stderr.String()
}

func TestSinksVerbs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	// An application module registers a sink; no worker has run yet.
	app := billingApp()
	appendUsage(t, db, 3)
	var firstID string
	require.NoError(t, db.QueryRow(ctx, `SELECT txid::text || ':' || seq FROM compute_events ORDER BY txid, seq LIMIT 1`).Scan(&firstID))
	first, err := outbox.ParseCursor(firstID)
	require.NoError(t, err)

	code, out, _ := runSinks(t, app, db, "list")
	require.Zero(t, code)
	require.Regexp(t, `NAME\s+CURSOR\s+LAG ROWS\s+LAG AGE\s+PAUSED`, out)
	require.Regexp(t, `billing\s+0:0\s+3\s+\S+\s+false`, out)

	code, out, _ = runSinks(t, app, db, "pause", "billing")
	require.Zero(t, code)
	require.Equal(t, "sink billing paused\n", out)
	code, out, _ = runSinks(t, app, db, "list", "--json")
	require.Zero(t, code)
	var listed []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &listed))
	require.Len(t, listed, 1)
	require.Equal(t, true, listed[0]["paused"])
	require.EqualValues(t, 3, listed[0]["lag_rows"])
	code, _, _ = runSinks(t, app, db, "resume", "billing")
	require.Zero(t, code)

	// reset NAME --to …: flags after the name work.
	code, out, _ = runSinks(t, app, db, "reset", "billing", "--to", first.String())
	require.Zero(t, code)
	require.Contains(t, out, "sink billing reset to "+first.String()+" (was 0:0)")
	s, err := outbox.GetSink(ctx, db.Pool, "billing")
	require.NoError(t, err)
	require.EqualValues(t, 2, s.LagRows)
	require.False(t, s.Paused)
	// end is the snapshot's xmin at the reset: cluster-wide, so a transaction of
	// another test may hold it below this test's events, which then stay ahead.
	xmin := func() uint64 {
		var x uint64
		require.NoError(t, db.QueryRow(ctx, `SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint`).Scan(&x))
		return x
	}
	lo := xmin()
	code, _, _ = runSinks(t, app, db, "--to", "end", "reset", "billing")
	require.Zero(t, code)
	hi := xmin()
	s, err = outbox.GetSink(ctx, db.Pool, "billing")
	require.NoError(t, err)
	require.Zero(t, s.Cursor.Seq)
	require.True(t, lo <= s.Cursor.Txid && s.Cursor.Txid <= hi, "end is the snapshot's xmin at the reset: %d not in [%d, %d]", s.Cursor.Txid, lo, hi)
	code, _, _ = runSinks(t, app, db, "reset", "billing")
	require.Zero(t, code, "the default is start")
	s, err = outbox.GetSink(ctx, db.Pool, "billing")
	require.NoError(t, err)
	require.True(t, s.Cursor.IsZero())

	// Errors: unknown sink, bad position, bad verbs.
	code, _, errOut := runSinks(t, app, db, "pause", "nope")
	require.Equal(t, 1, code)
	require.Equal(t, "NOT_FOUND: unknown sink \"nope\": known sinks: billing\n", errOut)
	code, _, errOut = runSinks(t, cli.App{}, db, "reset", "nope", "--to", "end")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, `NOT_FOUND: unknown sink "nope"`)
	code, _, errOut = runSinks(t, app, db, "reset", "billing", "--to", "yesterday")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, `INVALID_ARGUMENT: sinks reset --to "yesterday": want start, end or TXID:SEQ`)
	for _, args := range [][]string{{}, {"frob"}, {"pause"}, {"pause", "a", "b"}, {"list", "x"}} {
		code, _, errOut = runSinks(t, app, db, args...)
		require.Equal(t, 1, code, args)
		require.Contains(t, errOut, "INVALID_ARGUMENT: sinks", args)
	}
}

func TestSinksListWithoutSinks(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	code, out, _ := runSinks(t, cli.App{}, db, "list")
	require.Zero(t, code)
	require.Contains(t, out, "no sinks")
}

// TestSinksResetRefusesAPrunedPosition: `sinks reset NAME --to TXID:SEQ` behind
// the retention horizon exits 1 with one INVALID_ARGUMENT line that says what to
// do, and leaves the cursor; the horizon itself is accepted.
func TestSinksResetRefusesAPrunedPosition(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	app := billingApp()
	appendUsage(t, db, 3)
	rows, err := db.Query(ctx, `SELECT txid::text || ':' || seq FROM compute_events ORDER BY txid, seq`)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Len(t, ids, 3)

	// The sink moves past the second event and retention deletes the first two.
	code, _, _ := runSinks(t, app, db, "reset", "billing", "--to", ids[1])
	require.Zero(t, code)
	var (
		deleted  int
		pruneErr error
	)
	require.Eventually(t, func() bool {
		n, err := outbox.Prune(ctx, db.Pool, outbox.PruneOptions{})
		deleted += n
		pruneErr = err
		return err != nil || deleted >= 2
	}, 20*time.Second, 10*time.Millisecond, "retention deletes the two events the sink passed")
	require.NoError(t, pruneErr)
	require.Equal(t, 2, deleted)

	code, out, errOut := runSinks(t, app, db, "reset", "billing", "--to", ids[0])
	require.Equal(t, 1, code)
	require.Empty(t, out)
	lines := strings.Split(strings.TrimRight(errOut, "\n"), "\n")
	require.Equal(t, "INVALID_ARGUMENT: sink billing cannot be reset to "+ids[0]+
		": retention has deleted the events after it through "+ids[1]+" (the earliest available is "+ids[2]+
		"); reset it to start (--to start) to deliver every retained event, or to "+ids[1]+" (--to "+ids[1]+
		") to deliver what follows the deleted ones", lines[len(lines)-1])
	s, err := outbox.GetSink(ctx, db.Pool, "billing")
	require.NoError(t, err)
	require.Equal(t, ids[1], s.Cursor.String(), "the cursor is unchanged")

	code, out, _ = runSinks(t, app, db, "reset", "billing", "--to", ids[1])
	require.Zero(t, code)
	require.Contains(t, out, "sink billing reset to "+ids[1])
	code, _, _ = runSinks(t, app, db, "reset", "billing", "--to", "start")
	require.Zero(t, code, "start is never refused")
}

// billingApp is an application whose module registers the sink billing.
func billingApp() cli.App {
	return cli.App{Modules: []cli.Module{{Name: "billing", Register: func(r *workers.Registry) error {
		return workers.AddSink(r, workers.Sink{Name: "billing", Handle: func(context.Context, []outbox.Event) error { return nil }})
	}}}}
}

// appendUsage appends n events of topic usage, one transaction each.
func appendUsage(t *testing.T, db *pgtest.DB, n int) {
	t.Helper()
	ctx := context.Background()
	for range n {
		require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
			return outbox.AppendTx(ctx, tx, outbox.Message{Topic: "usage", Key: "k"})
		}))
	}
}
