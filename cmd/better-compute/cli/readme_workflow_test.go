package cli_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

// TestReadmeWorkflowProgramBuildsAndRuns extracts the README's `checkout`
// program (its durable workflow and its migration), builds it against this
// module and runs it as a user would: buy (twice: one checkout; another item:
// CONFLICT), a worker process that reserves and waits, pay (its signal
// resumes the workflow, which records the sale once), a cancel whose
// compensation gives the unit back, and workflow show.
func TestReadmeWorkflowProgramBuildsAndRuns(t *testing.T) {
	t.Parallel()
	bin := buildReadmeProgram(t, "checkout", "main.go", "migrations/0001_stock.sql")
	db := pgtest.New(t, pgtest.Options{Empty: true})
	env := processEnv(dbEnv(db)...)
	run := programRunner(t, bin, env)
	code, _, stderr := run("migrate")
	require.Equal(t, 0, code, stderr)
	code, stdout, stderr := run("buy", "o-1", "widget")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "o-1\n", stdout)
	code, _, stderr = run("buy", "o-1", "widget")
	require.Equal(t, 0, code, "buying again is the same checkout: %s", stderr)
	code, _, stderr = run("buy", "o-1", "gadget")
	require.Equal(t, 1, code)
	require.Regexp(t, `^CONFLICT: `, stderr)
	code, _, stderr = run("buy", "o-2", "widget")
	require.Equal(t, 0, code, stderr)
	code, _, stderr = run("pay", "o-9", "100")
	require.Equal(t, 1, code)
	require.Regexp(t, `^NOT_FOUND: `, stderr)

	worker := startProgramWorker(t, bin, env)
	workertest.WaitFor(t, 60*time.Second, "both orders reserved their unit and wait for payment", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM compute_workflows WHERE status = 'waiting'`) == 2 &&
			db.MustCount(t, `SELECT count(*) FROM stock WHERE item = 'widget' AND available = 8`) == 1
	})
	code, _, stderr = run("pay", "o-1", "1250")
	require.Equal(t, 0, code, stderr)
	code, _, stderr = run("pay", "o-1", "1250")
	require.Equal(t, 0, code, "a repeated payment counts once: %s", stderr)
	code, _, stderr = run("workflow", "cancel", "o-2")
	require.Equal(t, 0, code, stderr)
	workertest.WaitFor(t, 60*time.Second, "o-1 sold, o-2 cancelled and its unit back", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM compute_workflows WHERE id = 'o-1' AND status = 'completed'
				AND result->>'status' = 'sold'`) == 1 &&
			db.MustCount(t, `SELECT count(*) FROM compute_workflows WHERE id = 'o-2' AND status = 'cancelled'`) == 1
	})
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM sales WHERE order_id = 'o-1' AND cents = 1250`))
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM sales`))
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM stock WHERE item = 'widget' AND available = 9`))

	code, stdout, stderr = run("workflow", "show", "o-1")
	require.Equal(t, 0, code, stderr)
	for _, want := range []string{"o-1", "completed", "reserve", "confirm", "sold"} {
		require.Contains(t, stdout, want)
	}

	worker.stop(t)
}
