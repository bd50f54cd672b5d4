package clitest_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/cmd/better-compute/cli"
	"github.com/bettercompute/bettercompute/cmd/better-compute/cli/clitest"
	"github.com/bettercompute/bettercompute/domain/outbox"
	"github.com/bettercompute/bettercompute/domain/workflow"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/workers"
)

func TestMain(m *testing.M) { clitest.Main(m) }

// The application under test, as an application would define it: one module
// with a migration, a reconciler, two fenced jobs, an outbox sink, a workflow
// that sleeps an hour, and a command of its own. Its registrations are all
// here (kitModule).

const kitSchema = `
CREATE TABLE kit_items (
    id text PRIMARY KEY,
    qty bigint NOT NULL,
    reconciled_qty bigint,
    runs integer NOT NULL DEFAULT 0
);
CREATE TABLE kit_shipped (id text PRIMARY KEY, at timestamptz NOT NULL);
CREATE TABLE kit_audit (event_id text PRIMARY KEY, topic text NOT NULL, key text NOT NULL);
CREATE TABLE kit_naps (workflow_id text NOT NULL, step text NOT NULL, at timestamptz NOT NULL,
    PRIMARY KEY (workflow_id, step));
`

func kitApp() cli.App {
	return cli.App{Name: "kitapp", Modules: []cli.Module{kitModule()}, Commands: []cli.Command{setCommand()}}
}

func kitModule() cli.Module {
	return cli.Module{
		Name:       "kitapp",
		Migrations: fstest.MapFS{"0001_tables.sql": {Data: []byte(kitSchema)}},
		Register: func(r *workers.Registry) error {
			return errors.Join(
				workers.AddReconciler(r, workers.Reconciler{Kind: "kit_item", Reconcile: reconcileItem}),
				workers.AddWorker(r, &shipWorker{}),
				workers.AddWorker(r, &refusedWorker{}),
				workers.AddSink(r, workers.Sink{Name: "kit_audit", HandleTx: auditTx}),
				workers.AddWorkflow(r, napWorkflow),
			)
		},
	}
}

// setItemTx is the application's state change: an item's qty, and its
// reconcile.
func setItemTx(ctx context.Context, tx pgx.Tx, id string, qty int64) error {
	_, err := tx.Exec(ctx, `INSERT INTO kit_items (id, qty) VALUES ($1, $2)
		ON CONFLICT (id) DO UPDATE SET qty = EXCLUDED.qty`, id, qty)
	if err != nil {
		return err
	}
	return workers.DirtyTx(ctx, tx, "kit_item", id, nil)
}

// reconcileItem copies qty to reconciled_qty and counts its runs; an item
// whose id starts with "again-" asks to run again an hour later, one whose id
// starts with "bad-" fails.
func reconcileItem(ctx context.Context, tx pgx.Tx, id string) (workers.Result, error) {
	if strings.HasPrefix(id, "bad-") {
		return workers.Result{}, fmt.Errorf("item %s is out of stock", id)
	}
	_, err := tx.Exec(ctx, `UPDATE kit_items SET reconciled_qty = qty, runs = runs + 1 WHERE id = $1`, id)
	if strings.HasPrefix(id, "again-") {
		return workers.Result{RequeueAfter: time.Hour}, err
	}
	return workers.Result{}, err
}

// setCommand is `kitapp set ID QTY`.
func setCommand() cli.Command {
	return cli.Command{
		Name:    "set",
		Summary: "set an item's qty",
		Usage:   "ID QTY",
		Run: func(ctx context.Context, c *cli.CommandContext, args []string) error {
			if len(args) != 2 {
				return fmt.Errorf("set takes ID QTY, got %q", args)
			}
			qty, err := strconv.ParseInt(args[1], 10, 64)
			if err != nil {
				return err
			}
			return pg.InTx(ctx, c.DB, func(ctx context.Context, tx pgx.Tx) error { return setItemTx(ctx, tx, args[0], qty) })
		},
	}
}

// shipArgs is a fenced job: it ships an order, at compute_now().
type shipArgs struct {
	ID string `json:"id"`
}

func (shipArgs) Kind() string { return "kit_ship" }

type shipWorker struct{ river.WorkerDefaults[shipArgs] }

func (w *shipWorker) Work(ctx context.Context, job *river.Job[shipArgs]) error {
	return workers.InTx(ctx, job, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO kit_shipped (id, at) VALUES ($1, compute_now())`, job.Args.ID)
		return err
	})
}

// refusedArgs is a fenced job that always fails.
type refusedArgs struct {
	ID string `json:"id"`
}

func (refusedArgs) Kind() string { return "kit_refused" }

type refusedWorker struct {
	river.WorkerDefaults[refusedArgs]
}

func (w *refusedWorker) Work(ctx context.Context, job *river.Job[refusedArgs]) error {
	return fmt.Errorf("the carrier refused %s", job.Args.ID)
}

// auditTx writes every event into kit_audit, with the sink's cursor.
func auditTx(ctx context.Context, tx pgx.Tx, events []outbox.Event) error {
	for _, e := range events {
		if _, err := tx.Exec(ctx, `INSERT INTO kit_audit (event_id, topic, key) VALUES ($1, $2, $3)`,
			e.ID.String(), e.Topic, e.Key); err != nil {
			return err
		}
	}
	return nil
}

// napWorkflow sleeps an hour on compute_now(), then finishes with the time it
// woke at.
var napWorkflow = &workflow.Workflow[struct{}, struct{}, time.Time]{
	Kind: "kit_nap",
	Steps: []workflow.Step[struct{}]{
		{Name: "nap", Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[struct{}]) (workflow.Next, error) {
			_, err := tx.Exec(ctx, `INSERT INTO kit_naps (workflow_id, step, at) VALUES ($1, $2, compute_now())`, c.WorkflowID, c.Step)
			return workflow.Sleep(time.Hour, "wake"), err
		}},
		{Name: "wake", Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[struct{}]) (workflow.Next, error) {
			var now time.Time
			err := tx.QueryRow(ctx, `INSERT INTO kit_naps (workflow_id, step, at) VALUES ($1, $2, compute_now()) RETURNING at`,
				c.WorkflowID, c.Step).Scan(&now)
			return workflow.Finish(now), err
		}},
	},
}

// fatal is a testing.TB whose Fatalf ends the function that catch runs (with
// the message) instead of the test: it shows what a Wait helper's failure says.
type fatal struct {
	*testing.T
}

type fatalMsg string

func (f fatal) Fatalf(format string, args ...any) { panic(fatalMsg(fmt.Sprintf(format, args...))) }

// catch runs fn and returns the message of the Fatalf that ended it; the test
// fails if none did.
func (f fatal) catch(fn func()) (msg string) {
	f.T.Helper()
	func() {
		defer func() {
			if r := recover(); r != nil {
				m, ok := r.(fatalMsg)
				if !ok {
					panic(r)
				}
				msg = string(m)
			}
		}()
		fn()
	}()
	if msg == "" {
		f.T.Fatal("it did not fail the test")
	}
	f.T.Log(msg)
	return msg
}

// TestKitWaitsForAReconcile: a command line of the application marks a key
// dirty; WaitReconciled returns once the worker reconciled it. A reconcile
// due an hour later counts as done until the clock gets there. A key whose
// reconcile fails is waited for through its retries, and fails the test once
// its job is cancelled.
func TestKitWaitsForAReconcile(t *testing.T) {
	t.Parallel()
	f := fatal{t}
	k := clitest.Start(f, kitApp(), nil)
	r := k.Run("set", "a", "5")
	require.Equal(t, 0, r.Code, r.Stderr)
	k.WaitReconciled("kit_item", "a")
	var got *int64
	require.NoError(t, k.DB.QueryRow(t.Context(), `SELECT reconciled_qty FROM kit_items WHERE id = 'a'`).Scan(&got))
	require.NotNil(t, got, "WaitReconciled returned before the reconcile")
	require.EqualValues(t, 5, *got)

	k.InTx(func(ctx context.Context, tx pgx.Tx) error { return setItemTx(ctx, tx, "again-b", 7) })
	k.WaitReconciled("kit_item", "again-b")
	runs := func() (n int) {
		require.NoError(t, k.DB.QueryRow(t.Context(), `SELECT runs FROM kit_items WHERE id = 'again-b'`).Scan(&n))
		return n
	}
	require.Equal(t, 1, runs())
	k.Advance(time.Hour)
	k.WaitReconciled("kit_item", "again-b")
	require.Equal(t, 2, runs(), "WaitReconciled returned before the reconcile that the clock made due")

	k.InTx(func(ctx context.Context, tx pgx.Tx) error { return setItemTx(ctx, tx, "bad-c", 1) })
	var job *int64
	require.Eventually(t, func() bool {
		err := k.DB.QueryRow(t.Context(), `SELECT job_id FROM compute_dirty WHERE key = 'bad-c'`).Scan(&job)
		return err == nil && job != nil
	}, 10*time.Second, 10*time.Millisecond, "the failed key never got its own job")
	clitest.SetTimeout(k, 300*time.Millisecond)
	msg := f.catch(func() { k.WaitReconciled("kit_item", "bad-c") })
	require.Contains(t, msg, "its reconcile failed and is retried by its own job")
	require.Contains(t, msg, "item bad-c is out of stock")
	rc, err := river.NewClient(riverpgxv5.New(k.DB.Pool), &river.Config{})
	require.NoError(t, err)
	_, err = rc.JobCancel(t.Context(), *job)
	require.NoError(t, err)
	clitest.SetTimeout(k, clitest.DefaultTimeout)
	msg = f.catch(func() { k.WaitReconciled("kit_item", "bad-c") })
	require.Contains(t, msg, "its reconcile failed for good")
	require.Contains(t, msg, "cancelled")
}

// TestKitWaitsForJobs: WaitJobs returns a fenced job once it completed, and
// fails the test, with the job's error, when one was discarded.
func TestKitWaitsForJobs(t *testing.T) {
	t.Parallel()
	f := fatal{t}
	k := clitest.Start(f, kitApp(), nil)
	k.InTx(func(ctx context.Context, tx pgx.Tx) error {
		_, err := workers.InsertForKeyTx(ctx, tx, "o-1", shipArgs{ID: "o-1"}, nil)
		return err
	})
	done := k.WaitJobs("kit_ship")
	require.Len(t, done, 1)
	require.Equal(t, rivertype.JobStateCompleted, done[0].State)
	var at time.Time
	require.NoError(t, k.DB.QueryRow(t.Context(), `SELECT at FROM kit_shipped WHERE id = 'o-1'`).Scan(&at))
	require.Equal(t, clitest.DefaultNow, at.UTC(), "the job ran on the sim clock")

	k.InTx(func(ctx context.Context, tx pgx.Tx) error {
		_, err := workers.InsertForKeyTx(ctx, tx, "o-2", refusedArgs{ID: "o-2"}, &river.InsertOpts{MaxAttempts: 1})
		return err
	})
	msg := f.catch(func() { k.WaitJobs("kit_refused") })
	require.Contains(t, msg, "discarded")
	require.Contains(t, msg, "the carrier refused o-2")
}

// TestKitWaitsForADelivery: WaitDelivered returns once the sink has had every
// event committed before the call. The second round's events have a
// transaction id of more digits than the first's, so a reader that ordered
// ids as text ("999" after "1000") would find the log's end in the first
// round and return early.
func TestKitWaitsForADelivery(t *testing.T) {
	t.Parallel()
	k := clitest.Start(t, kitApp(), nil)
	audited := func() (n int) {
		require.NoError(t, k.DB.QueryRow(t.Context(), `SELECT count(*) FROM kit_audit`).Scan(&n))
		return n
	}
	appendEvents := func(round, n int) (txid string) {
		k.InTx(func(ctx context.Context, tx pgx.Tx) error {
			for i := range n {
				err := outbox.AppendTx(ctx, tx, outbox.Message{Topic: "kit.happened", Key: fmt.Sprintf("r%d-%d", round, i)})
				if err != nil {
					return err
				}
			}
			return tx.QueryRow(ctx, `SELECT pg_current_xact_id()::text`).Scan(&txid)
		})
		return txid
	}

	first := appendEvents(1, 3)
	k.WaitDelivered("kit_audit")
	require.Equal(t, 3, audited(), "WaitDelivered returned before the delivery")

	crossed := burnTxidsPast(t, k, first)
	second := appendEvents(2, 2)
	if crossed {
		require.Greater(t, len(second), len(first))
	}
	k.WaitDelivered("kit_audit")
	require.Equal(t, 5, audited(), "WaitDelivered returned before the delivery")
}

// burnTxidsPast uses transaction ids until the next one has more decimal
// digits than txid: one transaction whose subtransactions each write a row
// and roll back, each taking an id of its own (about 10 µs each). It reports
// false, using none, when that is more than 200,000 ids away (a test binary
// run with -count, or a long-lived TEST_DATABASE_URL server).
func burnTxidsPast(t *testing.T, k *clitest.Kit, txid string) bool {
	t.Helper()
	n, err := strconv.ParseInt(txid, 10, 64)
	require.NoError(t, err)
	next := int64(1)
	for next <= n {
		next *= 10
	}
	if next-n > 200_000 {
		t.Logf("transaction id %d is %d ids away from %d: the second round keeps its digits", n, next-n, next)
		return false
	}
	_, err = k.DB.Exec(t.Context(), fmt.Sprintf(`DO $$ BEGIN
		FOR i IN 1..%d LOOP
			BEGIN
				INSERT INTO kit_audit (event_id, topic, key) VALUES ('burn', 'burn', 'burn');
				RAISE EXCEPTION USING ERRCODE = 'BC999';
			EXCEPTION WHEN SQLSTATE 'BC999' THEN NULL;
			END;
		END LOOP;
	END $$`, next-n))
	require.NoError(t, err)
	return true
}

// TestKitWorkflowSleepsOnTheSimClock: a workflow that sleeps an hour does not
// finish while compute_now() stands still, nor after 59 minutes; WaitWorkflow
// returns it completed once the clock has moved the hour.
func TestKitWorkflowSleepsOnTheSimClock(t *testing.T) {
	t.Parallel()
	f := fatal{t}
	k := clitest.Start(f, kitApp(), nil)
	k.InTx(func(ctx context.Context, tx pgx.Tx) error {
		_, err := napWorkflow.StartTx(ctx, tx, struct{}{}, &workflow.StartOpts{ID: "nap-1"})
		return err
	})
	status := func() workflow.Status {
		i, err := workflow.Get(t.Context(), k.DB, "nap-1")
		if err != nil {
			return workflow.Status(err.Error())
		}
		return i.Status
	}
	require.Eventually(t, func() bool { return status() == workflow.Sleeping }, 10*time.Second, 10*time.Millisecond)

	clitest.SetTimeout(k, 300*time.Millisecond)
	msg := f.catch(func() { k.WaitWorkflow("nap-1") })
	require.Contains(t, msg, "workflow nap-1 to finish")
	require.Contains(t, msg, "sleeping")
	require.Contains(t, msg, "until 2030-01-01T01:00:00Z, compute_now() 2030-01-01T00:00:00Z (Advance the sim clock)")
	clitest.SetTimeout(k, clitest.DefaultTimeout)

	require.Equal(t, clitest.DefaultNow.Add(59*time.Minute), k.Advance(59*time.Minute))
	time.Sleep(100 * time.Millisecond)
	require.Equal(t, workflow.Sleeping, status())

	k.Advance(time.Minute)
	i := k.WaitWorkflow("nap-1")
	require.Equal(t, workflow.Completed, i.Status, i.Error)
	require.JSONEq(t, `"2030-01-01T01:00:00Z"`, string(i.Result))
}

// TestKitMigratesAndHoldsTheClock: Start ran the application's migrate (its
// migration is in the ledger), a second migrate applies nothing, and
// compute_now() stands at Options.Now until Advance moves it.
func TestKitMigratesAndHoldsTheClock(t *testing.T) {
	t.Parallel()
	at := time.Date(2031, 6, 1, 12, 0, 0, 0, time.UTC)
	k := clitest.Start(t, kitApp(), &clitest.Options{Now: at, NoWorkers: true})
	var applied time.Time
	require.NoError(t, k.DB.QueryRow(t.Context(), `SELECT applied_at FROM compute_migrations WHERE name = 'kitapp/0001_tables'`).Scan(&applied))
	require.Equal(t, at, applied.UTC(), "the migration ran on the sim clock")

	r := k.Run("migrate")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "migrate: 0 applied")

	require.Equal(t, at, k.Now().UTC())
	time.Sleep(20 * time.Millisecond)
	require.Equal(t, at, k.Now().UTC(), "the sim clock moved by itself")
	require.Equal(t, at.Add(90*time.Minute), k.Advance(90*time.Minute).UTC())
	require.Equal(t, at.Add(90*time.Minute), k.Now().UTC())
}

// TestKitWithoutWorkers: with NoWorkers nothing runs; every Wait helper fails
// the test at its timeout, saying what it waited for and what it saw.
func TestKitWithoutWorkers(t *testing.T) {
	t.Parallel()
	f := fatal{t}
	k := clitest.Start(f, kitApp(), &clitest.Options{NoWorkers: true, Timeout: 150 * time.Millisecond})
	k.InTx(func(ctx context.Context, tx pgx.Tx) error {
		if _, err := workers.InsertForKeyTx(ctx, tx, "o-3", shipArgs{ID: "o-3"}, nil); err != nil {
			return err
		}
		if _, err := napWorkflow.StartTx(ctx, tx, struct{}{}, &workflow.StartOpts{ID: "nap-2"}); err != nil {
			return err
		}
		if err := outbox.AppendTx(ctx, tx, outbox.Message{Topic: "kit.happened"}); err != nil {
			return err
		}
		return setItemTx(ctx, tx, "c", 1)
	})

	msg := f.catch(func() { k.WaitJobs("kit_ship") })
	require.Contains(t, msg, "timed out after 150ms waiting for the jobs of kind kit_ship (this kit runs no workers: Options.NoWorkers)")
	require.Regexp(t, `last saw: job \d+ \(kit_ship\) available, attempt 0 of 25`, msg)

	msg = f.catch(func() { k.WaitReconciled("kit_item", "c") })
	require.Contains(t, msg, `waiting for the reconcile of kit_item "c"`)
	require.Contains(t, msg, "not yet taken by its shard's worker")

	msg = f.catch(func() { k.WaitWorkflow("nap-2") })
	require.Contains(t, msg, "last saw: running at step nap")

	msg = f.catch(func() { k.WaitDelivered("kit_audit") })
	require.Contains(t, msg, "no sink of that name")
}
