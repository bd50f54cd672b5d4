package workers_test

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/domain/workflow"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

// These tests run the example application's order workflow (testdata/exampleapp:
// reserve, optionally await the signal "paid", charge, confirm; each
// transactional step writes one row of example_workflow_effects, counted) in
// real worker processes, and kill -9 or pause them mid-step.

// orderKind is the example application's workflow kind.
const orderKind = "example_order"

// orderInput is the example's OrderInput.
type orderInput struct {
	Order        string `json:"order"`
	AwaitPayment bool   `json:"await_payment,omitempty"`
}

// orderResult is the example's OrderResult.
type orderResult struct {
	Order    string   `json:"order"`
	Amount   int64    `json:"amount,omitempty"`
	Released bool     `json:"released,omitempty"`
	Steps    []string `json:"steps"`
}

// orderSteps are the steps every order that got its payment commits, in order.
var orderSteps = []string{"reserve", "charge", "confirm"}

func orderID(i int) string { return fmt.Sprintf("order-%05d", i) }

// startOrders starts orders 0..n-1 (those for which await says so wait for
// their payment), batch per transaction, from a few goroutines at once.
func startOrders(t *testing.T, db *pgtest.DB, n, batch int, await func(i int) bool) {
	t.Helper()
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, (n+batch-1)/batch)
	sem := make(chan struct{}, 4)
	for from := 0; from < n; from += batch {
		to := min(from+batch, n)
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			errs <- pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
				for i := from; i < to; i++ {
					in := orderInput{Order: orderID(i), AwaitPayment: await != nil && await(i)}
					if _, err := startKind(ctx, tx, orderKind, in, &workflow.StartOpts{ID: orderID(i)}); err != nil {
						return err
					}
				}
				return nil
			})
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

// pay sends order id its payment, amount, with a dedup key: a second payment
// of the same key counts once.
func pay(ctx context.Context, db *pgtest.DB, id string, amount int64) (workflow.SignalResult, error) {
	var res workflow.SignalResult
	err := pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		var err error
		res, err = workflow.SignalTx(ctx, tx, id, "paid", map[string]int64{"amount": amount}, &workflow.SignalOpts{DedupKey: "pay-" + id})
		return err
	})
	return res, err
}

// ordersBy counts the orders by status.
func ordersBy(t *testing.T, db *pgtest.DB, status workflow.Status) int {
	t.Helper()
	return db.MustCount(t, `SELECT count(*) FROM compute_workflows WHERE kind = $1 AND status = $2`, orderKind, string(status))
}

// waitOrdersCompleted waits until n orders have completed, failing at once if
// one failed or was cancelled.
func waitOrdersCompleted(t *testing.T, db *pgtest.DB, n int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		var completed, bad int
		var example string
		require.NoError(t, db.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE status = 'completed'),
			count(*) FILTER (WHERE status IN ('failed', 'cancelled')),
			coalesce(min(id || ' is ' || status || ': ' || error) FILTER (WHERE status IN ('failed', 'cancelled')), '')
			FROM compute_workflows WHERE kind = $1`, orderKind).Scan(&completed, &bad, &example))
		require.Zero(t, bad, "orders did not complete: %s", example)
		if completed == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %d orders to complete: %d have", within, n, completed)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// requireEachStepOnce checks the exactly-once guarantee over n completed
// orders: every order committed reserve, charge and confirm once each (one
// effect row each, with n = 1: a second commit of a step would count 2),
// its history has exactly those three rows, in order, its result lists them,
// and no step job is left unfinished.
func requireEachStepOnce(t *testing.T, db *pgtest.DB, n int) {
	t.Helper()
	require.Equal(t, n, ordersBy(t, db, workflow.Completed))
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM example_workflow_effects WHERE n <> 1`),
		"a transactional step committed more than once")
	require.Equal(t, 3*n, db.MustCount(t, `SELECT count(*) FROM example_workflow_effects`))
	require.Equal(t, n, db.MustCount(t, `SELECT count(*) FROM (
		SELECT workflow_id FROM example_workflow_effects GROUP BY workflow_id
		HAVING array_agg(step ORDER BY step) = '{charge,confirm,reserve}' AND sum(n) = 3) x`),
		"every order has exactly one effect of each of its three steps")

	require.Equal(t, 3*n, db.MustCount(t, `SELECT count(*) FROM compute_workflow_history h
		JOIN compute_workflows w ON w.id = h.workflow_id WHERE w.kind = $1`, orderKind))
	require.Equal(t, n, db.MustCount(t, `SELECT count(*) FROM (
		SELECT h.workflow_id FROM compute_workflow_history h JOIN compute_workflows w ON w.id = h.workflow_id
		WHERE w.kind = $1 GROUP BY h.workflow_id
		HAVING array_agg(h.step ORDER BY h.seq) = '{reserve,charge,confirm}'
		   AND (array_agg(h.outcome ORDER BY h.seq))[3] = 'completed') x`, orderKind),
		"every order's history is reserve, charge, confirm, once each")
	require.Equal(t, n, db.MustCount(t, `SELECT count(*) FROM compute_workflows
		WHERE kind = $1 AND result->'steps' = '["reserve", "charge", "confirm"]'::jsonb`, orderKind))

	// No step job is left behind: the stale and fenced ones complete too.
	workertest.WaitFor(t, 30*time.Second, "every step job is completed", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'workflow_step' AND state <> 'completed'`) == 0
	})
}

// fencedJobs are the job ids process p's log says it gave back fenced.
func fencedJobs(t *testing.T, p *proc) map[int64]bool {
	t.Helper()
	out := map[int64]bool{}
	for _, rec := range workerLog(t, p.log) {
		if rec.Message == "job fenced: given back" {
			out[rec.JobID] = true
		}
	}
	return out
}

// TestWorkflowProcessKill9MidStep: 200 orders (half of them awaiting a payment
// sent while the test runs) in one worker process whose steps are slowed,
// killed with kill -9 at random moments (mid-step, before its commit; after a
// commit, before the next step's job is fetched) and restarted each time. At
// the end every order has completed, and each of its steps committed exactly
// once.
func TestWorkflowProcessKill9MidStep(t *testing.T) {
	t.Parallel()
	began := time.Now()
	db := appDB(t)
	ctx := context.Background()
	// One job at a time per shard, 100 ms a step: the orders take seconds, so
	// the kills land while they run.
	env := []string{"EXAMPLE_STEP_SLEEP=100ms", "BETTER_COMPUTE_WORKERS_PER_SHARD=1"}
	w := startWorker(t, db, env...)
	workertest.WaitFor(t, 20*time.Second, "the worker holds every shard", func() bool { return leasesOf(t, db, w) == 16 })

	const n = 200
	awaits := func(i int) bool { return i%2 == 0 }
	startOrders(t, db, n, 50, awaits)

	// The payments come while the worker is killed and restarted, some before
	// their order awaits them (they wait in its inbox), each sent twice (the
	// second is a duplicate by its key).
	var (
		wg      sync.WaitGroup
		payErr  error
		payDups int
	)
	wg.Go(func() {
		for _, i := range rand.Perm(n) {
			if !awaits(i) {
				continue
			}
			for range 2 {
				res, err := pay(ctx, db, orderID(i), int64(i+1))
				if err != nil {
					payErr = fmt.Errorf("pay %s: %w", orderID(i), err)
					return
				}
				if res.Duplicate {
					payDups++
				}
			}
			time.Sleep(time.Duration(rand.IntN(40)) * time.Millisecond)
		}
	})

	var kills, midStep, betweenSteps int
	for kills < 12 && ordersBy(t, db, workflow.Completed) < n {
		time.Sleep(time.Duration(50+rand.IntN(400)) * time.Millisecond)
		require.NoError(t, w.cmd.Process.Signal(syscall.SIGKILL))
		<-w.done
		kills++
		// What the kill interrupted, read while no worker runs: step jobs it
		// was running (mid-step, uncommitted: a commit completes its job), and
		// next steps committed and not yet fetched.
		midStep += db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'workflow_step' AND state = 'running'`)
		betweenSteps += db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'workflow_step' AND state = 'available'
			AND (args->>'seq')::int > 1`)
		w = startWorker(t, db, env...)
		workertest.WaitFor(t, 20*time.Second, fmt.Sprintf("restart %d holds every shard", kills), func() bool {
			return leasesOf(t, db, w) == 16
		})
	}
	wg.Wait()
	require.NoError(t, payErr)
	require.Equal(t, n/2, payDups, "each payment's second send is a duplicate")

	waitOrdersCompleted(t, db, n, 60*time.Second)
	requireEachStepOnce(t, db, n)
	require.GreaterOrEqual(t, kills, 3, "the orders outlived at least three kills")
	require.Positive(t, midStep, "a kill landed mid-step")
	// The payments were consumed once each, by the order they were sent to.
	require.Equal(t, n/2, db.MustCount(t, `SELECT count(*) FROM compute_workflows
		WHERE kind = $1 AND (input->>'await_payment')::bool AND (result->>'amount')::int = substr(id, 7)::int + 1`, orderKind))
	require.Equal(t, n/2, db.MustCount(t, `SELECT count(*) FROM compute_workflow_signals WHERE consumed_at IS NOT NULL`))
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM compute_workflow_signals WHERE consumed_at IS NULL`))
	handedBack := db.MustCount(t, `SELECT count(*) FROM river_job j, unnest(j.errors) e
		WHERE j.kind = 'workflow_step' AND e->>'error' LIKE 'handed back by %'`)
	t.Logf("%d orders (%d awaiting a payment), %d kill -9 restarts: %d step jobs running, uncommitted, at a kill, %d next steps committed and not yet fetched at a kill, %d step jobs handed back; every step committed exactly once; took %s",
		n, n/2, kills, midStep, betweenSteps, handedBack, time.Since(began).Round(time.Millisecond))
}

// TestWorkflowProcessSIGSTOPMidStep: the worker holding every shard is paused
// (SIGSTOP) in the middle of its orders' steps, past its lease; a second
// process takes the shards over and finishes the orders; then the first is
// woken (SIGCONT). The paused steps commit nothing: each paused attempt is
// fenced, the steps it was running were committed once, by the second
// process's attempts under their new lease epochs, and every effect has n = 1.
func TestWorkflowProcessSIGSTOPMidStep(t *testing.T) {
	t.Parallel()
	began := time.Now()
	db := appDB(t)
	ctx := context.Background()
	env := []string{"EXAMPLE_STEP_SLEEP=300ms"}
	a := startWorker(t, db, env...)
	workertest.WaitFor(t, 20*time.Second, "A holds every shard", func() bool { return leasesOf(t, db, a) == 16 })
	b := startWorker(t, db, env...)
	before := epochs(t, db)

	const n = 100
	// Half of them await a payment, sent at once: before or after the order
	// awaits it (it waits in the inbox until then).
	awaits := func(i int) bool { return i%2 == 0 }
	startOrders(t, db, n, n, awaits)
	for i := 0; i < n; i += 2 {
		_, err := pay(ctx, db, orderID(i), int64(i+1))
		require.NoError(t, err)
	}
	workertest.WaitFor(t, 20*time.Second, "A is mid-step", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'workflow_step' AND state = 'running'
			AND attempted_by[cardinality(attempted_by)] = $1`, ownerOf(t, db, a)) >= 10
	})
	require.NoError(t, a.cmd.Process.Signal(syscall.SIGSTOP))

	// The step jobs A was running, read once a COMMIT A sent just before its
	// pause has landed. Only A's attempts (River's attempted_by names the client,
	// which is the lease owner): on a loaded machine a renewal of A's can slip
	// past its TTL before the pause and B work a shard's jobs already.
	time.Sleep(200 * time.Millisecond)
	type attempt struct {
		id       int64
		attempt  int
		queue    string
		workflow string
		step     string
	}
	var paused []attempt
	rows, err := db.Query(ctx, `SELECT id, attempt, queue, args->>'workflow_id', args->>'step' FROM river_job
		WHERE kind = 'workflow_step' AND state = 'running' AND attempted_by[cardinality(attempted_by)] = $1`, ownerOf(t, db, a))
	require.NoError(t, err)
	for rows.Next() {
		var p attempt
		require.NoError(t, rows.Scan(&p.id, &p.attempt, &p.queue, &p.workflow, &p.step))
		paused = append(paused, p)
	}
	require.NoError(t, rows.Err())
	require.NotEmpty(t, paused)
	byA := func() int {
		return db.MustCount(t, `SELECT count(*) FROM example_workflow_effects WHERE worker = $1`, strconv.Itoa(a.pid))
	}
	beforePause := byA()

	pausedAt := time.Now()
	workertest.WaitFor(t, 30*time.Second, "B holds every shard", func() bool { return leasesOf(t, db, b) == 16 })
	tookOver := time.Since(pausedAt)
	takeover := epochs(t, db)
	waitOrdersCompleted(t, db, n, 60*time.Second)
	finished := time.Since(pausedAt)

	require.NoError(t, a.cmd.Process.Signal(syscall.SIGCONT))
	// Woken, A tries to go on with the steps it was running: each attempt is
	// fenced (its lease is B's now) and given back, committing nothing.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		fenced := fencedJobs(t, a)
		var unfenced []int64
		for _, p := range paused {
			if !fenced[p.id] {
				unfenced = append(unfenced, p.id)
			}
		}
		if len(unfenced) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("woken, A did not give back, fenced, the step jobs %v of its %d paused ones", unfenced, len(paused))
		}
	}
	time.Sleep(time.Second) // long enough for a late commit of A's to show
	requireEachStepOnce(t, db, n)
	after := epochs(t, db)
	if maps.Equal(after, takeover) {
		// B kept every lease it took: A, woken, took none of them back.
		require.Zero(t, leasesOf(t, db, a), "the paused process holds no shard after SIGCONT")
	} else {
		t.Logf("B lost a lease after its takeover (a renewal slipped past its TTL on this loaded machine): epochs %v, then %v", takeover, after)
	}
	require.Equal(t, beforePause, byA(), "the paused process committed a step after its pause")

	for _, p := range paused {
		shard := "shard/" + strings.TrimPrefix(p.queue, "shard_")
		// A job runs consecutive steps inline: the steps A committed before
		// its pause are A's attempt's, under A's lease, with A's effects; the
		// step A was running, and any after it, committed once each, by a
		// later attempt of the same job, under the lease B took, with B's
		// effects.
		type commit struct {
			Step, Worker string
			Attempt, N   int
			Epoch        int64
		}
		rows, err := db.Query(ctx, `SELECT h.step, e.worker, h.attempt, e.n, h.lease_epoch FROM compute_workflow_history h
			JOIN example_workflow_effects e ON e.workflow_id = h.workflow_id AND e.step = h.step
			WHERE h.job_id = $1 ORDER BY h.seq`, p.id)
		require.NoError(t, err)
		commits, err := pgx.CollectRows(rows, pgx.RowToStructByPos[commit])
		require.NoError(t, err)
		var resumed int
		for _, c := range commits {
			require.Equal(t, 1, c.N, "%s %s", p.workflow, c.Step)
			if c.Epoch == before[shard] {
				require.Equal(t, strconv.Itoa(a.pid), c.Worker, "%s %s: committed under A's lease, not A's effect", p.workflow, c.Step)
				require.Zero(t, resumed, "%s %s: A committed a step after a later attempt's", p.workflow, c.Step)
				continue
			}
			if resumed == 0 {
				// The step A was running: the first of the later attempt's.
				require.Greater(t, c.Attempt, p.attempt, "job %d (%s %s) committed by the paused attempt", p.id, p.workflow, c.Step)
			}
			resumed++
			require.Greater(t, c.Epoch, before[shard], "job %d (%s %s) committed under A's lease", p.id, p.workflow, c.Step)
			// B's epoch, or one before it: on a loaded machine B may lose a
			// lease (a renewal slipping past its TTL) and take it again.
			require.LessOrEqual(t, c.Epoch, after[shard])
			require.Equal(t, strconv.Itoa(b.pid), c.Worker, "%s %s", p.workflow, c.Step)
		}
		require.Positive(t, resumed, "job %d (%s): the step A was running was committed by a later attempt", p.id, p.workflow)
	}
	t.Logf("A paused mid-step in %d step jobs; B took every shard %s after the pause and finished the %d orders %s after it; woken, A was fenced on all of them and committed nothing; test took %s",
		len(paused), tookOver.Round(time.Millisecond), n, finished.Round(time.Millisecond), time.Since(began).Round(time.Millisecond))
}

// TestWorkflowProcess10000Orders: 10,000 orders of three cheap steps at once
// across two worker processes, each serving half of the shards. Every order
// completes, no step commits twice (30,000 effects, each n = 1), and each
// order's history has exactly its three steps.
func TestWorkflowProcess10000Orders(t *testing.T) {
	t.Parallel()
	began := time.Now()
	db := appDB(t)
	a := startWorkerOn(t, db, "0-7")
	b := startWorkerOn(t, db, "8-15")
	workertest.WaitFor(t, 20*time.Second, "each process holds its half of the shards", func() bool {
		return leasesOf(t, db, a) == 8 && leasesOf(t, db, b) == 8
	})
	const n = 10_000
	startAt := time.Now()
	startOrders(t, db, n, 500, nil)
	started := time.Since(startAt)
	waitOrdersCompleted(t, db, n, 3*time.Minute)
	ran := time.Since(startAt)

	requireEachStepOnce(t, db, n)
	for _, p := range []*proc{a, b} {
		require.Positive(t, db.MustCount(t, `SELECT count(*) FROM example_workflow_effects WHERE worker = $1`, strconv.Itoa(p.pid)),
			"process %d committed no step", p.pid)
	}
	var p50, p99 float64
	require.NoError(t, db.QueryRow(context.Background(), `SELECT
		percentile_cont(0.5) WITHIN GROUP (ORDER BY d), percentile_cont(0.99) WITHIN GROUP (ORDER BY d)
		FROM (SELECT extract(epoch FROM finished_at - created_at) AS d FROM compute_workflows) x`).Scan(&p50, &p99))
	t.Logf("%d orders of 3 steps across 2 worker processes: started in %s, all completed %s after the first start (%.0f steps/s); start to finish p50 %.1f s, p99 %.1f s; test took %s",
		n, started.Round(time.Millisecond), ran.Round(time.Millisecond), float64(3*n)/ran.Seconds(), p50, p99, time.Since(began).Round(time.Millisecond))
}
