package quorumworker_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/domain/quorum"
	"github.com/bettercompute/bettercompute/platform/clock"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/quorumworker"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

func TestMain(m *testing.M) {
	if url := os.Getenv(killChildEnv); url != "" {
		os.Exit(runKillChild(url)) // the child of TestKillDuringApply
	}
	pgtest.Main(m)
}

// effects is the test applier's table: one row per applied item, with no key
// that would refuse a second application, so applying twice would show.
const effectsSQL = `CREATE TABLE test_effects (n bigserial PRIMARY KEY, batch_id bigint NOT NULL, position int NOT NULL, payload jsonb NOT NULL)`

// recordEffects is the test applier: it writes one row per item in tx.
func recordEffects(ctx context.Context, tx pgx.Tx, b *quorum.Batch) error {
	for i, it := range b.Items {
		if _, err := tx.Exec(ctx, `INSERT INTO test_effects (batch_id, position, payload) VALUES ($1, $2, $3::jsonb)`, b.ID, i, string(it)); err != nil {
			return err
		}
	}
	return nil
}

// commitBatch proposes a batch of kind with items and votes it through.
func commitBatch(t *testing.T, db pg.DBTX, kind string, items []any, deadline time.Time) int64 {
	t.Helper()
	ctx := context.Background()
	var id int64
	require.NoError(t, pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
		b, err := quorum.ProposeTx(ctx, tx, &quorum.ProposeParams{Kind: kind, Agent: "test", Items: items,
			Voters: []string{"a", "b", "c"}, Quorum: 2, Deadline: deadline})
		id = b.ID
		return err
	}))
	for _, v := range []string{"a", "b"} {
		require.NoError(t, pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
			_, err := quorum.VoteTx(ctx, tx, &quorum.VoteParams{BatchID: id, Voter: v, Approve: true})
			return err
		}))
	}
	return id
}

func effectsOf(t *testing.T, db *pgtest.DB, batch int64) (rows, distinct int) {
	t.Helper()
	return db.MustCount(t, `SELECT count(*) FROM test_effects WHERE batch_id = $1`, batch),
		db.MustCount(t, `SELECT count(DISTINCT position) FROM test_effects WHERE batch_id = $1`, batch)
}

func TestApplyOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	db.MustExec(t, effectsSQL)
	reg := workers.NewRegistry()
	require.NoError(t, quorumworker.Register(reg, nil))
	require.NoError(t, quorumworker.AddApplier(reg, "effects", recordEffects))
	workertest.Start(t, db.Pool, reg, nil)

	id := commitBatch(t, db.Pool, "effects", []any{"x", "y", "z"}, time.Now().Add(time.Hour))
	workertest.WaitFor(t, 60*time.Second, "the batch applied", func() bool {
		b, err := quorum.Get(ctx, db.Pool, id)
		require.NoError(t, err)
		return b.State == quorum.Applied
	})
	rows, distinct := effectsOf(t, db, id)
	require.Equal(t, 3, rows)
	require.Equal(t, 3, distinct)
	require.Equal(t, `["x", "y", "z"]`, func() string {
		var s string
		require.NoError(t, db.QueryRow(ctx, `SELECT jsonb_agg(payload ORDER BY position)::text FROM test_effects WHERE batch_id = $1`, id).Scan(&s))
		return s
	}(), "in order")

	// A second apply job for the same batch (a retry, an operator) changes nothing.
	require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE river_job SET state = 'available', attempt = 0, finalized_at = NULL WHERE kind = 'quorum_apply'`)
		return err
	}))
	workertest.WaitFor(t, 60*time.Second, "the apply job to run again", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'quorum_apply' AND state = 'completed'`) == 1
	})
	rows, _ = effectsOf(t, db, id)
	require.Equal(t, 3, rows, "applied once")
}

func TestHandle(t *testing.T) {
	t.Parallel()
	reg := workers.NewRegistry()
	require.NoError(t, quorumworker.AddApplier(reg, "a", recordEffects))
	require.NoError(t, quorumworker.Register(reg, nil), "Register after Handle reuses the workers")
	require.True(t, fault.Has(quorumworker.AddApplier(reg, "a", recordEffects), fault.InvalidConfig), "a second applier for a kind")
	require.True(t, fault.Has(quorumworker.AddApplier(reg, "Not A Kind", recordEffects), fault.InvalidConfig))
	require.True(t, fault.Has(quorumworker.AddApplier(reg, "b", nil), fault.InvalidConfig))
	// Another registry has appliers of its own.
	require.NoError(t, quorumworker.AddApplier(workers.NewRegistry(), "a", recordEffects))
}

// TestExpiryJobUnderTheSimClock: the expiry job, scheduled for the deadline in
// real time, expires the open batch only once compute_now() passes the deadline.
func TestExpiryJobUnderTheSimClock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	require.NoError(t, clock.UseSim(ctx, db.Pool, time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)))
	reg := workers.NewRegistry()
	require.NoError(t, quorumworker.Register(reg, nil))
	workertest.Start(t, db.Pool, reg, nil)
	now, err := clock.Now(ctx, db.Pool)
	require.NoError(t, err)
	var b *quorum.Batch
	require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		b, err = quorum.ProposeTx(ctx, tx, &quorum.ProposeParams{Kind: "k", Agent: "test", Voters: []string{"a"}, Quorum: 1, Deadline: now.Add(time.Hour)})
		return err
	}))
	// The job is due in an hour of real time; make River run it now, as if the
	// real and sim clocks disagreed: it must snooze, not expire the batch.
	db.MustExec(t, `UPDATE river_job SET state = 'available', scheduled_at = $2 WHERE id = $1`, *b.ExpireJobID, time.Now())
	workertest.WaitFor(t, 60*time.Second, "the expiry job to run early and snooze", func() bool {
		return db.MustCount(t, `SELECT coalesce((metadata->>'snoozes')::int, 0) FROM river_job WHERE id = $1`, *b.ExpireJobID) >= 1
	})
	got, _ := quorum.Get(ctx, db.Pool, b.ID)
	require.Equal(t, quorum.Open, got.State)
	_, err = clock.Advance(ctx, db.Pool, time.Hour)
	require.NoError(t, err)
	workertest.WaitFor(t, 60*time.Second, "the batch to expire", func() bool {
		got, err := quorum.Get(ctx, db.Pool, b.ID)
		require.NoError(t, err)
		return got.State == quorum.Expired
	})
}

// The kill -9 test runs a worker in a child process (this test binary, re-run
// with killChildEnv set), whose applier writes its effects and then blocks with
// the apply transaction open; the parent kills it with SIGKILL, then starts a
// worker of its own that takes the shard over and applies the batch again.
const killChildEnv = "BETTER_COMPUTE_QUORUM_KILL_CHILD_URL"

// The kill test's leases: long enough that neither worker loses one on a slow
// machine (a lost lease would give the job back and raise its attempt), short
// enough that the takeover after the kill is quick.
const (
	killLeaseTTL   = 5 * time.Second
	killLeaseRenew = time.Second
)

// runKillChild is the child's side: a worker whose applier writes its effects,
// says APPLYING, and blocks with the apply transaction open until it is killed.
func runKillChild(url string) int {
	ctx := context.Background()
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "child:", err); return 1 }
	db, err := pg.Open(ctx, pg.Options{URL: url, MaxConns: 10})
	if err != nil {
		return fail(err)
	}
	reg := workers.NewRegistry()
	err = quorumworker.AddApplier(reg, "effects", func(ctx context.Context, tx pgx.Tx, b *quorum.Batch) error {
		if err := recordEffects(ctx, tx, b); err != nil {
			return err
		}
		var pid int
		if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			return err
		}
		fmt.Printf("APPLYING batch=%d backend=%d\n", b.ID, pid)
		select {} // the apply transaction stays open until the parent kills us
	})
	if err != nil {
		return fail(err)
	}
	var shards []int
	for i := 0; i < pgtest.DefaultShardCount; i++ {
		shards = append(shards, i)
	}
	o := workertest.Fast
	o.Pool, o.Registry, o.Work, o.Shards = db, reg, true, shards
	o.LeaseTTL, o.LeaseRenew = killLeaseTTL, killLeaseRenew
	if _, err := workers.Start(ctx, o); err != nil {
		return fail(err)
	}
	select {}
}

func TestKillDuringApply(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	db.MustExec(t, effectsSQL)
	id := commitBatch(t, db.Pool, "effects", []any{1, 2, 3, 4}, time.Now().Add(time.Hour))

	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), killChildEnv+"="+db.URL)
	out, err := child.StdoutPipe()
	require.NoError(t, err)
	child.Stderr = os.Stderr
	require.NoError(t, child.Start())
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })

	var backend int
	lines := bufio.NewScanner(out)
	applying := make(chan string, 1)
	go func() {
		for lines.Scan() {
			if l := lines.Text(); strings.HasPrefix(l, "APPLYING ") {
				applying <- l
			}
		}
	}()
	select {
	case l := <-applying:
		_, err := fmt.Sscanf(l, "APPLYING batch=%d backend=%d", new(int64), &backend)
		require.NoError(t, err, l)
	case <-time.After(60 * time.Second):
		t.Fatal("the child never started applying")
	}
	// The child's apply transaction is open: its effects are written, not committed.
	require.Equal(t, "idle in transaction", func() string {
		var s string
		require.NoError(t, db.QueryRow(ctx, `SELECT state FROM pg_stat_activity WHERE pid = $1`, backend).Scan(&s))
		return s
	}())
	rows, _ := effectsOf(t, db, id)
	require.Zero(t, rows, "nothing is visible before the commit")
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'quorum_apply' AND state = 'running'`))

	require.NoError(t, child.Process.Signal(syscall.SIGKILL))
	_, _ = child.Process.Wait()
	workertest.WaitFor(t, 20*time.Second, "the server to end the child's transaction", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, backend) == 0
	})

	// Another worker takes the shard over (once the child's lease expires),
	// hands the running job back, and applies the batch.
	reg := workers.NewRegistry()
	require.NoError(t, quorumworker.AddApplier(reg, "effects", recordEffects))
	workertest.Start(t, db.Pool, reg, &workers.Options{LeaseTTL: killLeaseTTL, LeaseRenew: killLeaseRenew})
	workertest.WaitFor(t, 60*time.Second, "the batch applied by the new worker", func() bool {
		b, err := quorum.Get(ctx, db.Pool, id)
		require.NoError(t, err)
		return b.State == quorum.Applied
	})
	rows, distinct := effectsOf(t, db, id)
	require.Equal(t, 4, rows, "exactly one applied effect per item")
	require.Equal(t, 4, distinct)
	var attempt int
	var state string
	require.NoError(t, db.QueryRow(ctx, `SELECT state::text, attempt FROM river_job WHERE kind = 'quorum_apply'`).Scan(&state, &attempt))
	require.Equal(t, "completed", state)
	// The killed attempt and the one that applied (more if a fenced retry came
	// between them: the effects above, not this count, say it applied once).
	require.GreaterOrEqual(t, attempt, 2, "the killed attempt and the one that applied")
	t.Logf("applied by attempt %d after the kill (backend %d of the child ended)", attempt, backend)
}

// TestNoApplierRetriedAsUnavailable: a committed batch whose kind has no
// applier in the process is not applied, cancelled or discarded: its apply job
// fails with UNAVAILABLE and is retried with backoff, the batch stays
// committed; a process that knows the kind applies it.
func TestNoApplierRetriedAsUnavailable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	db.MustExec(t, effectsSQL)
	leases := &workers.Options{LeaseTTL: 10 * time.Second, LeaseRenew: time.Second}
	reg := workers.NewRegistry()
	require.NoError(t, quorumworker.AddApplier(reg, "other", recordEffects))
	rt := workertest.Start(t, db.Pool, reg, leases)

	id := commitBatch(t, db.Pool, "effects", []any{"x"}, time.Now().Add(time.Hour))
	type jobState struct {
		State   string
		Attempt int
		Errors  []string
	}
	job := func() jobState {
		var j jobState
		require.NoError(t, db.QueryRow(ctx, `
SELECT state::text, attempt, ARRAY(SELECT e->>'error' FROM jsonb_array_elements(to_jsonb(errors)) e)
  FROM river_job WHERE kind = 'quorum_apply' AND (args->>'batch_id')::bigint = $1`, id).Scan(&j.State, &j.Attempt, &j.Errors))
		return j
	}
	unavailable := regexp.MustCompile(`^UNAVAILABLE: no quorum applier for kind effects`)
	failures := func(j jobState) int {
		n := 0
		for _, e := range j.Errors {
			if unavailable.MatchString(e) {
				n++
			}
		}
		return n
	}
	workertest.WaitFor(t, 60*time.Second, "the apply job to fail twice with UNAVAILABLE (retried)", func() bool { return failures(job()) >= 2 })
	j := job()
	require.Contains(t, []string{"retryable", "available", "running"}, j.State, "retried, not cancelled, discarded or completed: %+v", j)
	for _, e := range j.Errors {
		// Besides UNAVAILABLE, only a hand-back by the shard's holder (an
		// attempt whose outcome River had not recorded yet at a lease round)
		// may show, and it carries no code.
		require.False(t, !unavailable.MatchString(e) && regexp.MustCompile(`^[A-Z_]+: `).MatchString(e), "an error of another code: %s", e)
	}
	b, err := quorum.Get(ctx, db.Pool, id)
	require.NoError(t, err)
	require.Equal(t, quorum.Committed, b.State, "the batch waits for an applier")
	rows, _ := effectsOf(t, db, id)
	require.Zero(t, rows)

	// A process that knows the kind takes the shards over and applies it (the
	// job made due at once, rather than after its backoff).
	require.NoError(t, rt.Stop(ctx))
	reg2 := workers.NewRegistry()
	require.NoError(t, quorumworker.AddApplier(reg2, "effects", recordEffects))
	workertest.Start(t, db.Pool, reg2, leases)
	db.MustExec(t, `UPDATE river_job SET scheduled_at = $2 WHERE kind = 'quorum_apply' AND (args->>'batch_id')::bigint = $1 AND state = 'retryable'`, id, time.Now())
	workertest.WaitFor(t, 60*time.Second, "the batch applied by the process that has its applier", func() bool {
		b, err := quorum.Get(ctx, db.Pool, id)
		require.NoError(t, err)
		return b.State == quorum.Applied
	})
	rows, _ = effectsOf(t, db, id)
	require.Equal(t, 1, rows)
}
