package backfillworker

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/domain/backfill"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

// The child process of TestKillMidBatch: the test binary re-executed with
// childEnv set. It works every shard, runs batches normally until call
// childHangAt, and inside that batch's transaction, after its update, prints
// HANGING and blocks until it is killed.
const (
	childEnv    = "BACKFILL_TEST_CHILD"
	childURLEnv = "BACKFILL_TEST_URL"
	childHangAt = 3
	killRows    = 1000
	killSize    = 100
)

func killBackfill(before hook) Backfill {
	b := fillBackfill("kill_fill", "kill_items", before, nil)
	b.BatchSize = killSize
	b.Timeout = 10 * time.Minute
	return b
}

func runChild(mode string) int {
	ctx := context.Background()
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "child:", err); return 1 }
	if mode != "kill" {
		return fail(fmt.Errorf("unknown mode %q", mode))
	}
	db, err := pg.Open(ctx, pg.Options{URL: os.Getenv(childURLEnv), MaxConns: 8})
	if err != nil {
		return fail(err)
	}
	var stdout sync.Mutex
	say := func(line string) {
		stdout.Lock()
		defer stdout.Unlock()
		fmt.Fprintln(os.Stdout, line)
	}
	b := killBackfill(nil)
	inner := b.Batch
	b.Batch = func(ctx context.Context, tx pgx.Tx, n int) (int, error) {
		rows, err := inner(ctx, tx, n)
		if err != nil {
			return rows, err
		}
		var done int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM bf_handled`).Scan(&done); err != nil {
			return 0, err
		}
		if done >= childHangAt*killSize { // the third batch, inside its transaction
			say("HANGING")
			select {} // until SIGKILL
		}
		return rows, nil
	}
	reg := workers.NewRegistry()
	if err := Add(reg, b); err != nil {
		return fail(err)
	}
	shards := make([]int, testShards)
	for i := range shards {
		shards[i] = i
	}
	o := workertest.Fast
	o.Pool, o.Registry, o.Work, o.Shards = db, reg, true, shards
	// A lease with room (the test's own worker takes over once it expires,
	// after the kill): a renewal starved on a loaded machine must not give the
	// shard away before the hang.
	o.LeaseTTL, o.LeaseRenew = 5*time.Second, 500*time.Millisecond
	o.Log = zerolog.New(os.Stderr).Level(zerolog.WarnLevel)
	rt, err := workers.Start(ctx, o)
	if err != nil {
		return fail(err)
	}
	for len(rt.HeldShards()) < len(shards) {
		time.Sleep(10 * time.Millisecond)
	}
	say("READY " + rt.Owner())
	select {}
}

// A worker process killed with SIGKILL in the middle of a batch (its
// transaction open, its rows updated) loses nothing and repeats nothing that
// committed: another worker takes the shard over, runs the batch again, and
// the backfill finishes with counters equal to a recount.
func TestKillMidBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newDB(t)
	makeTable(t, db, "kill_items", killRows)

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=kill", childURLEnv+"="+db.URL)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	killed := false
	t.Cleanup(func() {
		if !killed {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		if stderr.Len() > 0 {
			t.Logf("child stderr:\n%s", stderr.String())
		}
	})
	lines := make(chan string, 4)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	next := func() string {
		select {
		case l, ok := <-lines:
			require.True(t, ok, "the child exited early")
			return l
		case <-time.After(60 * time.Second):
			t.Fatal("the child said nothing")
		}
		return ""
	}
	ready := next()
	require.True(t, strings.HasPrefix(ready, "READY "), ready)
	childOwner := strings.TrimPrefix(ready, "READY ")

	b := killBackfill(nil)
	_, err = startBackfill(ctx, db.Pool, b)
	require.NoError(t, err)
	require.Equal(t, "HANGING", next())

	// The child's third batch is mid-transaction: its rows are updated but not
	// committed, so nobody else sees them.
	p := mustGet(t, db, b.Name)
	require.EqualValues(t, 2, p.Batches)
	require.NotNil(t, p.JobID)
	hung := *p.JobID // the job running the batch: the row names it while it drains
	require.Equal(t, 2*killSize, db.MustCount(t, `SELECT count(*) FROM kill_items WHERE filled IS NOT NULL`))
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM (SELECT id FROM kill_items
		WHERE id > $1 AND id <= $2 FOR UPDATE SKIP LOCKED) unlocked`, 2*killSize, 3*killSize), "the batch's rows are locked")

	// A second worker waits for the shards; then the child dies.
	startWorker(t, db, registry(t, b), nil)
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
	killed = true

	waitState(t, db, b.Name, backfill.Done, 60*time.Second)
	requireRecount(t, db, b.Name, "kill_items", killRows)
	// The child's two committed batches stand; the killed one ran again elsewhere.
	require.Equal(t, 2*killSize, db.MustCount(t, `SELECT count(*) FROM bf_handled WHERE tbl = 'kill_items' AND owner = $1`, childOwner))
	require.Equal(t, 2*killSize, db.MustCount(t, `SELECT count(*) FROM bf_handled WHERE tbl = 'kill_items' AND owner = $1
		AND row_id <= $2`, childOwner, 2*killSize))
	var attempt int
	var lastErr string
	require.NoError(t, db.QueryRow(ctx, `SELECT attempt, errors[array_length(errors, 1)]->>'error' FROM river_job
		WHERE id = $1`, hung).Scan(&attempt, &lastErr))
	require.Equal(t, 2, attempt, "the killed batch's job ran a second attempt")
	require.Contains(t, lastErr, "handed back")
}
