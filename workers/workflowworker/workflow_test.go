package workflowworker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/domain/workflow"
	"github.com/bettercompute/bettercompute/platform/clock"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/workertest"
	"github.com/bettercompute/bettercompute/workers/workflowworker"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var t0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// effects is the test's domain table: one row per transactional step effect.
const effectsDDL = `CREATE TABLE wf_effects (workflow_id text, step text, n int, PRIMARY KEY (workflow_id, step))`

type orderIn struct {
	Order string `json:"order"`
}

type orderState struct {
	Order  string `json:"order"`
	Steps  int    `json:"steps"`
	Paid   bool   `json:"paid"`
	Amount int    `json:"amount"`
}

type orderOut struct {
	Order string `json:"order"`
	Paid  bool   `json:"paid"`
	Steps int    `json:"steps"`
}

func effect(ctx context.Context, tx pgx.Tx, c *workflow.Call[orderState]) error {
	_, err := tx.Exec(ctx, `INSERT INTO wf_effects (workflow_id, step, n) VALUES ($1, $2, 1)
		ON CONFLICT (workflow_id, step) DO UPDATE SET n = wf_effects.n + 1`, c.WorkflowID, c.Step)
	c.State.Steps++
	return err
}

// order: reserve, await paid (1 h), then confirm or release.
func orderWorkflow() *workflow.Workflow[orderIn, orderState, orderOut] {
	return &workflow.Workflow[orderIn, orderState, orderOut]{
		Kind: "order",
		Init: func(in orderIn) (orderState, error) { return orderState{Order: in.Order}, nil },
		Steps: []workflow.Step[orderState]{
			{Name: "reserve", Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[orderState]) (workflow.Next, error) {
				if err := effect(ctx, tx, c); err != nil {
					return workflow.Next{}, err
				}
				return workflow.AwaitSignal("paid", time.Hour, "confirm", "release"), nil
			}},
			{Name: "confirm", Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[orderState]) (workflow.Next, error) {
				var p struct {
					Amount int `json:"amount"`
				}
				if err := c.Signal.Decode(&p); err != nil {
					return workflow.Next{}, err
				}
				c.State.Paid, c.State.Amount = true, p.Amount
				if err := effect(ctx, tx, c); err != nil {
					return workflow.Next{}, err
				}
				return workflow.Finish(orderOut{Order: c.State.Order, Paid: true, Steps: c.State.Steps}), nil
			}},
			{Name: "release", Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[orderState]) (workflow.Next, error) {
				if !c.TimedOut {
					return workflow.Next{}, errors.New("release without a timeout")
				}
				if err := effect(ctx, tx, c); err != nil {
					return workflow.Next{}, err
				}
				return workflow.Finish(orderOut{Order: c.State.Order, Steps: c.State.Steps}), nil
			}},
		},
		Signals: []string{"paid"},
	}
}

type env struct {
	db  *pgtest.DB
	rt  *workers.Runtime
	reg *workers.Registry
}

func start(t *testing.T, defs ...workflow.Definition) *env {
	t.Helper()
	return startOn(t, pgtest.New(t), defs...)
}

// startOn is start on the database db.
func startOn(t *testing.T, db *pgtest.DB, defs ...workflow.Definition) *env {
	t.Helper()
	ctx := context.Background()
	db.MustExec(t, effectsDDL)
	require.NoError(t, clock.UseSim(ctx, db.Pool, t0))
	reg := workers.NewRegistry()
	require.NoError(t, workflowworker.Register(reg, &workflowworker.Options{WakeEvery: 50 * time.Millisecond}))
	for _, d := range defs {
		require.NoError(t, addWorkflow(reg, d))
	}
	rt := workertest.Start(t, db.Pool, reg, nil)
	return &env{db: db, rt: rt, reg: reg}
}

func startWF(t *testing.T, db *pg.Pool, kind string, in any, id string) string {
	t.Helper()
	var got string
	require.NoError(t, pg.InTx(context.Background(), db, func(ctx context.Context, tx pgx.Tx) error {
		var err error
		got, err = startKind(ctx, tx, kind, in, &workflow.StartOpts{ID: id})
		return err
	}))
	return got
}

func signal(t *testing.T, db *pg.Pool, id, name string, payload any, dedup string) workflow.SignalResult {
	t.Helper()
	var res workflow.SignalResult
	require.NoError(t, pg.InTx(context.Background(), db, func(ctx context.Context, tx pgx.Tx) error {
		var err error
		res, err = workflow.SignalTx(ctx, tx, id, name, payload, &workflow.SignalOpts{DedupKey: dedup})
		return err
	}))
	return res
}

func wait(t *testing.T, db *pg.Pool, id string) *workflow.Info {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	i, err := workflow.Wait(ctx, db, id, 20*time.Millisecond)
	require.NoError(t, err)
	return i
}

func waitStatus(t *testing.T, db *pg.Pool, id string, want workflow.Status) *workflow.Info {
	t.Helper()
	var i *workflow.Info
	require.Eventually(t, func() bool {
		var err error
		i, err = workflow.Get(context.Background(), db, id)
		require.NoError(t, err)
		return i.Status == want
	}, time.Minute, 10*time.Millisecond, "workflow %s never became %s", id, want)
	return i
}

func TestSignalBeforeAwaitIsConsumed(t *testing.T) {
	t.Parallel()
	e := start(t, orderWorkflow())
	ctx := context.Background()
	// Sent in the same transaction as the start: before the workflow could
	// possibly wait for it.
	require.NoError(t, pg.InTx(ctx, e.db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := orderWorkflow().StartTx(ctx, tx, orderIn{Order: "o1"}, &workflow.StartOpts{ID: "o1"}); err != nil {
			return err
		}
		_, err := workflow.SignalTx(ctx, tx, "o1", "paid", map[string]int{"amount": 42}, nil)
		return err
	}))
	out, err := orderWorkflow().Wait(ctx, e.db.Pool, "o1", 20*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, orderOut{Order: "o1", Paid: true, Steps: 2}, out)
	require.Equal(t, 1, e.db.MustCount(t, `SELECT count(*) FROM wf_effects WHERE workflow_id = 'o1' AND step = 'confirm' AND n = 1`))
	require.Equal(t, 0, e.db.MustCount(t, `SELECT count(*) FROM compute_workflow_signals WHERE consumed_at IS NULL`))

	hist, err := workflow.History(ctx, e.db.Pool, "o1")
	require.NoError(t, err)
	require.Len(t, hist, 2)
	require.Equal(t, "reserve", hist[0].Step)
	require.Equal(t, "await", hist[0].Outcome)
	require.Equal(t, "confirm", hist[1].Step)
	require.Equal(t, "completed", hist[1].Outcome)
	for _, h := range hist {
		require.NotNil(t, h.JobID)
		require.NotNil(t, h.LeaseEpoch)
		require.Equal(t, 1, h.Attempt)
	}
}

func TestAwaitTimesOutOnTheSimClock(t *testing.T) {
	t.Parallel()
	e := start(t, orderWorkflow())
	ctx := context.Background()
	id := startWF(t, e.db.Pool, "order", orderIn{Order: "o2"}, "o2")
	waitStatus(t, e.db.Pool, id, workflow.Waiting)
	began := time.Now()
	_, err := e.db.Pool.Exec(ctx, `SELECT compute_advance_sim_clock(interval '3 days')`)
	require.NoError(t, err)
	i := wait(t, e.db.Pool, id)
	// Woken by the sim clock, not by three days passing: the wake-up runs once a
	// second, so even a starved machine ends it well within a minute.
	require.Less(t, time.Since(began), time.Minute)
	require.Equal(t, workflow.Completed, i.Status)
	require.JSONEq(t, `{"order":"o2","paid":false,"steps":2}`, string(i.Result))
	require.Equal(t, 1, e.db.MustCount(t, `SELECT count(*) FROM wf_effects WHERE workflow_id = 'o2' AND step = 'release'`))
	// A signal after the timeout won: the workflow is finished and takes none.
	err = pg.InTx(ctx, e.db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		_, err := workflow.SignalTx(ctx, tx, id, "paid", nil, nil)
		return err
	})
	require.True(t, fault.Has(err, fault.Conflict), "%v", err)
}

func TestSleepEndsWhenTheSimClockMoves(t *testing.T) {
	t.Parallel()
	wf := &workflow.Workflow[struct{}, int, int]{
		Kind: "napper",
		Steps: []workflow.Step[int]{
			{Name: "nap", Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[int]) (workflow.Next, error) {
				return workflow.Sleep(72*time.Hour, "wake"), nil
			}},
			{Name: "wake", Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[int]) (workflow.Next, error) {
				return workflow.Finish(7), nil
			}},
		},
	}
	e := start(t, wf)
	ctx := context.Background()
	id := startWF(t, e.db.Pool, "napper", struct{}{}, "")
	i := waitStatus(t, e.db.Pool, id, workflow.Sleeping)
	require.Equal(t, t0.Add(72*time.Hour), i.WakeAt.UTC())
	// Still asleep a while later: the wall clock does not end it.
	time.Sleep(300 * time.Millisecond)
	i, err := workflow.Get(ctx, e.db.Pool, id)
	require.NoError(t, err)
	require.Equal(t, workflow.Sleeping, i.Status)
	_, err = e.db.Pool.Exec(ctx, `SELECT compute_advance_sim_clock(interval '3 days')`)
	require.NoError(t, err)
	out, err := wf.Wait(ctx, e.db.Pool, id, 20*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, 7, out)
}

func TestDuplicateSignalsWithOneDedupKeyCountOnce(t *testing.T) {
	t.Parallel()
	counter := &workflow.Workflow[struct{}, int, int]{
		Kind: "counter",
		Steps: []workflow.Step[int]{
			{Name: "wait", Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[int]) (workflow.Next, error) {
				if c.Signal != nil {
					*c.State++
				}
				if c.TimedOut {
					return workflow.Finish(*c.State), nil
				}
				return workflow.AwaitSignal("add", time.Hour, "wait", "wait"), nil
			}},
		},
		Signals: []string{"add"},
	}
	e := start(t, counter)
	ctx := context.Background()
	id := startWF(t, e.db.Pool, "counter", struct{}{}, "c1")
	for i := 0; i < 5; i++ {
		res := signal(t, e.db.Pool, id, "add", nil, "same")
		require.Equal(t, i > 0, res.Duplicate)
	}
	signal(t, e.db.Pool, id, "add", nil, "other")
	require.Eventually(t, func() bool {
		return e.db.MustCount(t, `SELECT count(*) FROM compute_workflow_signals WHERE workflow_id = 'c1' AND consumed_at IS NOT NULL`) == 2
	}, 30*time.Second, 10*time.Millisecond)
	waitStatus(t, e.db.Pool, id, workflow.Waiting)
	_, err := e.db.Pool.Exec(ctx, `SELECT compute_advance_sim_clock(interval '2 hours')`)
	require.NoError(t, err)
	out, err := counter.Wait(ctx, e.db.Pool, id, 20*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, 2, out)
}

func TestBadInputWritesNothing(t *testing.T) {
	t.Parallel()
	e := start(t, orderWorkflow())
	ctx := context.Background()
	try := func(f func(ctx context.Context, tx pgx.Tx) error) error {
		return pg.InTx(ctx, e.db.Pool, f)
	}
	err := try(func(ctx context.Context, tx pgx.Tx) error {
		_, err := startKind(ctx, tx, "no_such_kind", struct{}{}, nil)
		return err
	})
	require.True(t, fault.Has(err, fault.InvalidArgument), "%v", err)
	err = try(func(ctx context.Context, tx pgx.Tx) error {
		_, err := startKind(ctx, tx, "order", orderIn{}, &workflow.StartOpts{ID: "bad id!"})
		return err
	})
	require.True(t, fault.Has(err, fault.InvalidArgument), "%v", err)
	big := make([]byte, workflow.MaxPayload)
	for i := range big {
		big[i] = 'x'
	}
	err = try(func(ctx context.Context, tx pgx.Tx) error {
		_, err := startKind(ctx, tx, "order", map[string]string{"blob": string(big)}, nil)
		return err
	})
	require.True(t, fault.Has(err, fault.InvalidArgument), "%v", err)
	require.Equal(t, 0, e.db.MustCount(t, `SELECT count(*) FROM compute_workflows`))

	id := startWF(t, e.db.Pool, "order", orderIn{Order: "x"}, "x1")
	// The same start again is the same workflow; a different input is CONFLICT.
	require.Equal(t, id, startWF(t, e.db.Pool, "order", orderIn{Order: "x"}, "x1"))
	err = try(func(ctx context.Context, tx pgx.Tx) error {
		_, err := startKind(ctx, tx, "order", orderIn{Order: "y"}, &workflow.StartOpts{ID: "x1"})
		return err
	})
	require.True(t, fault.Has(err, fault.Conflict), "%v", err)
	require.Equal(t, 1, e.db.MustCount(t, `SELECT count(*) FROM compute_workflows`))

	err = try(func(ctx context.Context, tx pgx.Tx) error {
		_, err := workflow.SignalTx(ctx, tx, "x1", "refund", nil, nil)
		return err
	})
	require.True(t, fault.Has(err, fault.InvalidArgument), "%v", err)
	err = try(func(ctx context.Context, tx pgx.Tx) error {
		_, err := workflow.SignalTx(ctx, tx, "nobody", "paid", nil, nil)
		return err
	})
	require.True(t, fault.Has(err, fault.NotFound), "%v", err)
	err = try(func(ctx context.Context, tx pgx.Tx) error {
		_, err := workflow.SignalTx(ctx, tx, "x1", "paid", map[string]string{"blob": string(big)}, nil)
		return err
	})
	require.True(t, fault.Has(err, fault.InvalidArgument), "%v", err)
	require.Equal(t, 0, e.db.MustCount(t, `SELECT count(*) FROM compute_workflow_signals`))
}

type tripIn struct {
	Traveler string `json:"traveler"`
	Nights   int    `json:"nights"`
}

// trip's Init refuses a trip without a traveler (INVALID_ARGUMENT) and one of
// no nights (a plain error), and panics for the traveler boom.
func tripWorkflow() *workflow.Workflow[tripIn, tripIn, string] {
	return &workflow.Workflow[tripIn, tripIn, string]{
		Kind: "trip",
		Init: func(in tripIn) (tripIn, error) {
			if in.Traveler == "" {
				return in, fault.New(fault.InvalidArgument, "a trip needs a traveler")
			}
			if in.Nights <= 0 {
				return in, errors.New("a trip lasts a night at least")
			}
			if in.Traveler == "boom" {
				panic("no boom allowed")
			}
			return in, nil
		},
		Steps: []workflow.Step[tripIn]{{Name: "book", Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[tripIn]) (workflow.Next, error) {
			return workflow.Finish(c.State.Traveler), nil
		}}},
	}
}

// TestStartRefusesAnInputInitRefuses: StartTx and StartJSONTx run the kind's
// Init (and decode the input into its In) before any statement: a refused
// input is INVALID_ARGUMENT, nothing is stored, and the caller's transaction
// goes on and commits its own work. A start by a binary whose definition of
// the kind has no Init (another version, say) stores such an input, and the
// workflow fails at its first step.
func TestStartRefusesAnInputInitRefuses(t *testing.T) {
	t.Parallel()
	trip := tripWorkflow()
	e := start(t, trip)
	ctx := context.Background()
	var errs []error
	require.NoError(t, pg.InTx(ctx, e.db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO wf_effects VALUES ('caller', 'before', 1)`); err != nil {
			return err
		}
		_, err := trip.StartTx(ctx, tx, tripIn{Nights: 2}, &workflow.StartOpts{ID: "t1"})
		errs = append(errs, err)
		_, err = trip.StartTx(ctx, tx, tripIn{Traveler: "ada"}, &workflow.StartOpts{ID: "t2"})
		errs = append(errs, err)
		_, err = trip.StartJSONTx(ctx, tx, json.RawMessage(`{"nights": 2}`), &workflow.StartOpts{ID: "t3"})
		errs = append(errs, err)
		_, err = trip.StartJSONTx(ctx, tx, json.RawMessage(`{"traveler": ["ada"], "nights": 2}`), &workflow.StartOpts{ID: "t4"})
		errs = append(errs, err)
		_, err = trip.StartTx(ctx, tx, tripIn{Traveler: "boom", Nights: 1}, nil)
		errs = append(errs, err)
		// No statement failed: the transaction goes on.
		_, err = tx.Exec(ctx, `INSERT INTO wf_effects VALUES ('caller', 'after', 1)`)
		return err
	}))
	for n, want := range []string{
		"INVALID_ARGUMENT: a trip needs a traveler",
		"INVALID_ARGUMENT: workflow trip refuses its input (Init): a trip lasts a night at least",
		"INVALID_ARGUMENT: a trip needs a traveler",
		"INVALID_ARGUMENT: the input of workflow trip does not decode: json: cannot unmarshal array",
		"INVALID_ARGUMENT: workflow trip refuses its input: Init panicked: no boom allowed",
	} {
		require.True(t, fault.Has(errs[n], fault.InvalidArgument), "start %d: %v", n, errs[n])
		require.True(t, strings.HasPrefix(errs[n].Error(), want), "start %d: %v", n, errs[n])
	}
	require.Equal(t, 2, e.db.MustCount(t, `SELECT count(*) FROM wf_effects WHERE workflow_id = 'caller'`))
	require.Equal(t, 0, e.db.MustCount(t, `SELECT count(*) FROM compute_workflows`))
	require.Equal(t, 0, e.db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'workflow_step'`))

	// An input Init accepts starts, and the first step gets Init's state.
	startWF(t, e.db.Pool, "trip", tripIn{Traveler: "ada", Nights: 2}, "t5")
	i := wait(t, e.db.Pool, "t5")
	require.JSONEq(t, `"ada"`, string(i.Result))

	// A definition of the kind without Init stores the input: the workflow fails
	// at its first step.
	startWF(t, e.db.Pool, "trip", tripIn{Nights: 2}, "t6")
	i = waitStatus(t, e.db.Pool, "t6", workflow.Failed)
	require.Contains(t, i.Error, "a trip needs a traveler")
}

// TestACompensationThatWaitsFailsAndKeepsTheReason: a compensation step may
// Goto, Finish or Fail, not wait (a sleeping workflow would no longer be
// cancelling, and would end completed): a Sleep fails the compensation, and
// the workflow ends cancelled with the cancel's reason.
func TestACompensationThatWaitsFailsAndKeepsTheReason(t *testing.T) {
	t.Parallel()
	wf := &workflow.Workflow[struct{}, int, int]{
		Kind: "napper",
		Steps: []workflow.Step[int]{
			{Name: "wait", Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[int]) (workflow.Next, error) {
				return workflow.Sleep(time.Hour, "wait"), nil
			}},
			{Name: "undo", Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[int]) (workflow.Next, error) {
				return workflow.Sleep(time.Minute, "wait"), nil
			}},
		},
		Compensate: "undo",
	}
	e := start(t, wf)
	ctx := context.Background()
	id := startWF(t, e.db.Pool, "napper", struct{}{}, "n1")
	waitStatus(t, e.db.Pool, id, workflow.Sleeping)
	require.NoError(t, pg.InTx(ctx, e.db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		return workflow.CancelTx(ctx, tx, id, "customer asked")
	}))
	var i *workflow.Info
	require.Eventually(t, func() bool {
		var err error
		i, err = workflow.Get(ctx, e.db.Pool, id)
		require.NoError(t, err)
		return i.Status != workflow.Cancelling // the compensation ran
	}, time.Minute, 10*time.Millisecond)
	require.Equal(t, workflow.Cancelled, i.Status)
	require.Equal(t, "customer asked; compensation failed: step undo failed (attempt 1 of 10): INVALID_ARGUMENT: "+
		"workflow napper step undo: a compensation step may Goto, Finish or Fail, not Sleep", i.Error)
}

func TestChildrenFanOutAndIn(t *testing.T) {
	t.Parallel()
	const n = 1000
	child := &workflow.Workflow[int, int, int]{
		Kind: "square",
		Init: func(in int) (int, error) { return in, nil },
		Steps: []workflow.Step[int]{
			{Name: "square", Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[int]) (workflow.Next, error) {
				if *c.State == 13 {
					return workflow.Fail("13 is unlucky"), nil
				}
				return workflow.Finish(*c.State * *c.State), nil
			}},
		},
	}
	type sum struct {
		Sum    int
		Failed []string
	}
	parent := &workflow.Workflow[struct{}, sum, sum]{
		Kind: "fanout",
		Steps: []workflow.Step[sum]{
			{Name: "spawn", Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[sum]) (workflow.Next, error) {
				cs := make([]workflow.Child, n)
				for i := range cs {
					cs[i] = workflow.Child{Kind: "square", Input: i}
				}
				return workflow.StartChildren(cs, "gather"), nil
			}},
			{Name: "gather", Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[sum]) (workflow.Next, error) {
				if len(c.Children) != n {
					return workflow.Next{}, fmt.Errorf("gather got %d children", len(c.Children))
				}
				for _, ch := range c.Children {
					switch ch.Status {
					case workflow.Completed:
						var v int
						if err := ch.Decode(&v); err != nil {
							return workflow.Next{}, err
						}
						c.State.Sum += v
					default:
						c.State.Failed = append(c.State.Failed, ch.ID+": "+ch.Error)
					}
				}
				return workflow.Finish(*c.State), nil
			}},
		},
	}
	e := start(t, child, parent)
	ctx := context.Background()
	id := startWF(t, e.db.Pool, "fanout", struct{}{}, "p1")
	out, err := parent.Wait(ctx, e.db.Pool, id, 50*time.Millisecond)
	require.NoError(t, err)
	want := 0
	for i := 0; i < n; i++ {
		if i != 13 {
			want += i * i
		}
	}
	require.Equal(t, want, out.Sum)
	require.Len(t, out.Failed, 1)
	require.Contains(t, out.Failed[0], "13 is unlucky")
	require.Equal(t, n, e.db.MustCount(t, `SELECT count(*) FROM compute_workflows WHERE parent_id = 'p1'`))
	// The gather step ran once.
	require.Equal(t, 1, e.db.MustCount(t, `SELECT count(*) FROM compute_workflow_history WHERE workflow_id = 'p1' AND step = 'gather'`))
}

func TestCancelFencesTheRunningStepAndCompensatesOnce(t *testing.T) {
	t.Parallel()
	var (
		entered = make(chan struct{}, 10)
		release = make(chan struct{})
		comp    atomic.Int32
	)
	var once sync.Once
	wf := &workflow.Workflow[struct{}, int, int]{
		Kind: "cancellable",
		Steps: []workflow.Step[int]{
			{Name: "spawn", Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[int]) (workflow.Next, error) {
				return workflow.StartChildren([]workflow.Child{{Kind: "slow", Input: 1}}, "slow"), nil
			}},
			{Name: "slow", Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[int]) (workflow.Next, error) {
				return workflow.Finish(1), nil
			}},
			{Name: "undo", Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[int]) (workflow.Next, error) {
				if !c.Cancelled {
					return workflow.Next{}, errors.New("compensation without Cancelled")
				}
				comp.Add(1)
				_, err := tx.Exec(ctx, `INSERT INTO wf_effects VALUES ($1, 'undo', 1)`, c.WorkflowID)
				return workflow.Finish(nil), err
			}},
		},
		Compensate: "undo",
	}
	// The child's step is external: it runs outside any transaction, so the
	// cancel commits while it runs, and its result is then fenced by the seq.
	var calls atomic.Int32
	slow := &workflow.Workflow[int, int, int]{
		Kind: "slow",
		Steps: []workflow.Step[int]{
			{Name: "work", External: func(ctx context.Context, c *workflow.Call[int]) (workflow.Next, error) {
				calls.Add(1)
				once.Do(func() { entered <- struct{}{} })
				<-release
				return workflow.Goto("record"), nil
			}},
			{Name: "record", Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[int]) (workflow.Next, error) {
				_, err := tx.Exec(ctx, `INSERT INTO wf_effects VALUES ($1, 'work', 1)`, c.WorkflowID)
				return workflow.Finish(2), err
			}},
		},
	}
	e := start(t, wf, slow)
	ctx := context.Background()
	id := startWF(t, e.db.Pool, "cancellable", struct{}{}, "k1")
	<-entered // the child's step is running
	require.NoError(t, pg.InTx(ctx, e.db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		return workflow.CancelTx(ctx, tx, id, "customer asked")
	}))
	close(release) // the running step now tries to commit: fenced by the seq
	i := wait(t, e.db.Pool, id)
	require.Equal(t, workflow.Cancelled, i.Status)
	require.Contains(t, i.Error, "customer asked")
	ch := wait(t, e.db.Pool, id+"/2.0")
	require.Equal(t, workflow.Cancelled, ch.Status)
	time.Sleep(200 * time.Millisecond)
	require.Equal(t, int32(1), comp.Load())
	require.Equal(t, 0, e.db.MustCount(t, `SELECT count(*) FROM wf_effects WHERE step = 'work'`), "the fenced step committed")
	require.Equal(t, int32(1), calls.Load())
	hist, err := workflow.History(ctx, e.db.Pool, id+"/2.0")
	require.NoError(t, err)
	require.Len(t, hist, 1, "the child's only history row is its cancel: %+v", hist)
	require.Equal(t, "cancelled", hist[0].Outcome)
	require.Equal(t, 1, e.db.MustCount(t, `SELECT count(*) FROM wf_effects WHERE step = 'undo'`))
	// Cancel again: nothing to do.
	require.NoError(t, pg.InTx(ctx, e.db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		return workflow.CancelTx(ctx, tx, id, "again")
	}))
	require.Equal(t, 1, e.db.MustCount(t, `SELECT count(*) FROM wf_effects WHERE step = 'undo'`))
}

// TestSignalVersusTimeoutRaces: 1,000 workflows await "paid" with a 1 h
// timeout; signals go out while the sim clock jumps past the deadline. Each
// workflow takes exactly one path, and a signal that lost stays in the inbox.
func TestSignalVersusTimeoutRaces(t *testing.T) {
	t.Parallel()
	const n = 1000
	e := start(t, orderWorkflow())
	ctx := context.Background()
	ids := make([]string, n)
	require.NoError(t, pg.InTx(ctx, e.db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		for i := range ids {
			var err error
			if ids[i], err = startKind(ctx, tx, "order", orderIn{Order: fmt.Sprint(i)}, &workflow.StartOpts{ID: fmt.Sprintf("race-%04d", i)}); err != nil {
				return err
			}
		}
		return nil
	}))
	require.Eventually(t, func() bool {
		return e.db.MustCount(t, `SELECT count(*) FROM compute_workflows WHERE status = 'waiting'`) == n
	}, 3*time.Minute, 100*time.Millisecond, "the %d workflows never all waited for their payment", n)

	var wg sync.WaitGroup
	errs := make(chan error, n+1)
	jump := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		<-jump
		_, err := e.db.Pool.Exec(ctx, `SELECT compute_advance_sim_clock(interval '2 hours')`)
		errs <- err
	}()
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := w; i < n; i += 8 {
				if i == n/2 {
					close(jump)
				}
				errs <- pg.InTx(ctx, e.db.Pool, func(ctx context.Context, tx pgx.Tx) error {
					_, err := workflow.SignalTx(ctx, tx, ids[i], "paid", map[string]int{"amount": i}, nil)
					if fault.Has(err, fault.Conflict) {
						return nil // timed out and finished already: refused, not lost
					}
					return err
				})
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	for _, id := range ids {
		wait(t, e.db.Pool, id)
	}
	// Exactly one path each, its effect once.
	require.Equal(t, n, e.db.MustCount(t, `SELECT count(*) FROM (SELECT workflow_id FROM wf_effects
		WHERE step IN ('confirm', 'release') GROUP BY workflow_id HAVING count(*) = 1 AND sum(n) = 1) x`))
	require.Equal(t, 0, e.db.MustCount(t, `SELECT count(*) FROM wf_effects WHERE n <> 1`))
	confirmed := e.db.MustCount(t, `SELECT count(*) FROM wf_effects WHERE step = 'confirm'`)
	released := e.db.MustCount(t, `SELECT count(*) FROM wf_effects WHERE step = 'release'`)
	t.Logf("signal won %d times, timeout %d times", confirmed, released)
	require.Equal(t, n, confirmed+released)
	require.Positive(t, confirmed, "no signal won: the race never happened")
	require.Positive(t, released, "no timeout won: the race never happened")
	// A confirmed workflow consumed its signal; a released one that got a
	// signal keeps it in its inbox, unconsumed.
	require.Equal(t, confirmed, e.db.MustCount(t, `SELECT count(*) FROM compute_workflow_signals WHERE consumed_at IS NOT NULL`))
	require.Equal(t, 0, e.db.MustCount(t, `SELECT count(*) FROM compute_workflow_signals s
		JOIN wf_effects f ON f.workflow_id = s.workflow_id AND f.step = 'release' WHERE s.consumed_at IS NOT NULL`))
}

// twoStep sleeps in step a and finishes in b; without b (v2) it lacks the step
// its sleeping workflows sit on.
func twoStep[S any](withB bool) *workflow.Workflow[struct{}, S, int] {
	wf := &workflow.Workflow[struct{}, S, int]{
		Kind: "versioned",
		Steps: []workflow.Step[S]{
			{Name: "a", Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[S]) (workflow.Next, error) {
				return workflow.Sleep(time.Hour, "b"), nil
			}},
		},
	}
	if withB {
		wf.Steps = append(wf.Steps, workflow.Step[S]{Name: "b", Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[S]) (workflow.Next, error) {
			return workflow.Finish(1), nil
		}})
	} else {
		wf.Steps = append(wf.Steps, workflow.Step[S]{Name: "c", Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[S]) (workflow.Next, error) {
			return workflow.Finish(1), nil
		}})
	}
	return wf
}

func TestVersioningRefusesAWorkerThatWouldStrandWorkflows(t *testing.T) {
	t.Parallel()
	e := start(t, twoStep[int](true))
	ctx := context.Background()
	id := startWF(t, e.db.Pool, "versioned", struct{}{}, "v-1")
	waitStatus(t, e.db.Pool, id, workflow.Sleeping)
	require.NoError(t, e.rt.Stop(ctx))

	reg := workers.NewRegistry()
	require.NoError(t, addWorkflow(reg, twoStep[int](false)))
	_, err := workers.Start(ctx, workers.Options{Pool: e.db.Pool, Registry: reg, Work: true, Shards: []int{0}, Log: workertest.Logger(t)})
	require.True(t, fault.Has(err, fault.InvalidConfig), "%v", err)
	require.Contains(t, err.Error(), "v-1 (versioned at step b)")
	// Nothing ran: the workflow still sleeps on b.
	i, err := workflow.Get(ctx, e.db.Pool, id)
	require.NoError(t, err)
	require.Equal(t, workflow.Sleeping, i.Status)
	require.Equal(t, "b", i.Step)
}

func TestUndecodableStateFailsTheWorkflowAndCancelsItsJob(t *testing.T) {
	t.Parallel()
	e := start(t, twoStep[int](true))
	ctx := context.Background()
	id := startWF(t, e.db.Pool, "versioned", struct{}{}, "u-1")
	waitStatus(t, e.db.Pool, id, workflow.Sleeping)
	require.NoError(t, e.rt.Stop(ctx))
	// The new deploy's state is a struct: the stored 0 no longer decodes.
	reg := workers.NewRegistry()
	require.NoError(t, workflowworker.Register(reg, &workflowworker.Options{WakeEvery: 50 * time.Millisecond}))
	require.NoError(t, addWorkflow(reg, twoStep[struct{ N int }](true)))
	workertest.Start(t, e.db.Pool, reg, nil)
	_, err := e.db.Pool.Exec(ctx, `SELECT compute_advance_sim_clock(interval '2 hours')`)
	require.NoError(t, err)
	i := wait(t, e.db.Pool, id)
	require.Equal(t, workflow.Failed, i.Status)
	require.Contains(t, i.Error, "does not decode")
	require.Eventually(t, func() bool {
		return e.db.MustCount(t, `SELECT count(*) FROM river_job WHERE args->>'workflow_id' = 'u-1' AND state = 'cancelled'`) == 1
	}, time.Minute, 20*time.Millisecond)
	require.Equal(t, 0, e.db.MustCount(t, `SELECT count(*) FROM river_job WHERE args->>'workflow_id' = 'u-1' AND state NOT IN ('completed', 'cancelled')`))
}

func TestExternalStepRetriesWithOneIdempotencyKeyThenFailsToItsErrorStep(t *testing.T) {
	t.Parallel()
	var (
		mu       sync.Mutex
		keys     []string
		attempts []int
		broken   atomic.Bool
	)
	broken.Store(true)
	wf := &workflow.Workflow[struct{}, int, string]{
		Kind: "charger",
		Steps: []workflow.Step[int]{
			{Name: "charge", Retry: workflow.Retry{Attempts: 5, Backoff: 10 * time.Millisecond},
				External: func(ctx context.Context, c *workflow.Call[int]) (workflow.Next, error) {
					mu.Lock()
					keys, attempts = append(keys, c.IdempotencyKey), append(attempts, c.Attempt)
					mu.Unlock()
					if c.Attempt < 3 {
						return workflow.Next{}, errors.New("gateway timeout")
					}
					return workflow.Goto("ship"), nil
				}},
			{Name: "ship", Retry: workflow.Retry{Attempts: 2, Backoff: 10 * time.Millisecond}, OnError: "refund",
				Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[int]) (workflow.Next, error) {
					return workflow.Next{}, errors.New("no courier")
				}},
			{Name: "refund", Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[int]) (workflow.Next, error) {
				if broken.Load() {
					return workflow.Fail("refund desk closed"), nil
				}
				return workflow.Finish("refunded after: " + c.Err), nil
			}},
		},
	}
	e := start(t, wf)
	ctx := context.Background()
	id := startWF(t, e.db.Pool, "charger", struct{}{}, "ch-1")
	i := wait(t, e.db.Pool, id)
	require.Equal(t, workflow.Failed, i.Status)
	require.Equal(t, "refund", i.Step)
	require.Equal(t, "refund desk closed", i.Error)
	mu.Lock()
	require.Equal(t, []int{1, 2, 3}, attempts)
	require.Equal(t, []string{"ch-1/charge/1", "ch-1/charge/1", "ch-1/charge/1"}, keys)
	mu.Unlock()
	hist, err := workflow.History(ctx, e.db.Pool, id)
	require.NoError(t, err)
	require.Len(t, hist, 3)
	require.Equal(t, []string{"charge", "ship", "refund"}, []string{hist[0].Step, hist[1].Step, hist[2].Step})
	require.Equal(t, 3, hist[0].Attempt)
	require.Equal(t, "error", hist[1].Outcome)
	require.Contains(t, hist[1].Error, "no courier")
	require.Equal(t, "failed", hist[2].Outcome)

	// Retry resumes the failed step, with fresh attempts.
	broken.Store(false)
	require.NoError(t, pg.InTx(ctx, e.db.Pool, func(ctx context.Context, tx pgx.Tx) error { return workflow.RetryTx(ctx, tx, id) }))
	out, err := wf.Wait(ctx, e.db.Pool, id, 20*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, "refunded after: ", out[:len("refunded after: ")])
	err = pg.InTx(ctx, e.db.Pool, func(ctx context.Context, tx pgx.Tx) error { return workflow.RetryTx(ctx, tx, id) })
	require.True(t, fault.Has(err, fault.Conflict), "%v", err)
}

func TestPruneDeletesFinishedWorkflowsPastRetention(t *testing.T) {
	t.Parallel()
	e := start(t, orderWorkflow())
	ctx := context.Background()
	done := startWF(t, e.db.Pool, "order", orderIn{Order: "p"}, "pr-1")
	signal(t, e.db.Pool, done, "paid", nil, "")
	wait(t, e.db.Pool, done)
	open := startWF(t, e.db.Pool, "order", orderIn{Order: "q"}, "pr-2")
	waitStatus(t, e.db.Pool, open, workflow.Waiting)
	n, err := workflow.Prune(ctx, e.db.Pool, 24*time.Hour, 1)
	require.NoError(t, err)
	require.Zero(t, n, "pruned a workflow inside its retention")
	_, err = e.db.Pool.Exec(ctx, `SELECT compute_advance_sim_clock(interval '25 hours')`)
	require.NoError(t, err)
	wait(t, e.db.Pool, open) // timed out meanwhile, finished just now
	n, err = workflow.Prune(ctx, e.db.Pool, 24*time.Hour, 1)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	_, err = workflow.Get(ctx, e.db.Pool, done)
	require.True(t, fault.Has(err, fault.NotFound), "%v", err)
	require.Equal(t, 0, e.db.MustCount(t, `SELECT count(*) FROM compute_workflow_history WHERE workflow_id = 'pr-1'`))
	require.Equal(t, 0, e.db.MustCount(t, `SELECT count(*) FROM compute_workflow_signals WHERE workflow_id = 'pr-1'`))
	_, err = workflow.Get(ctx, e.db.Pool, open)
	require.NoError(t, err)
}

// TestBehindPgBouncer runs the whole path (start, steps, a signal, a timer, a
// cancel, reads) through a real PgBouncer in transaction mode.
func TestBehindPgBouncer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	direct := pgtest.New(t)
	direct.MustExec(t, effectsDDL)
	require.NoError(t, clock.UseSim(ctx, direct.Pool, t0))
	via, err := pg.Open(ctx, pg.Options{URL: pgtest.PgBouncer(t, direct), MaxConns: 20})
	require.NoError(t, err)
	t.Cleanup(via.Close) // after the runtime's stop (cleanups run last first)
	reg := workers.NewRegistry()
	require.NoError(t, workflowworker.Register(reg, &workflowworker.Options{WakeEvery: 50 * time.Millisecond}))
	require.NoError(t, addWorkflow(reg, orderWorkflow()))
	workertest.Start(t, via, reg, nil)

	paid := startWF(t, via, "order", orderIn{Order: "b1"}, "b1")
	late := startWF(t, via, "order", orderIn{Order: "b2"}, "b2")
	gone := startWF(t, via, "order", orderIn{Order: "b3"}, "b3")
	waitStatus(t, via, paid, workflow.Waiting)
	// Twice with one dedup key, in one transaction (the first may finish the
	// workflow before a second transaction could send): counted once.
	require.NoError(t, pg.InTx(ctx, via, func(ctx context.Context, tx pgx.Tx) error {
		for i := 0; i < 2; i++ {
			res, err := workflow.SignalTx(ctx, tx, paid, "paid", map[string]int{"amount": 5}, &workflow.SignalOpts{DedupKey: "once"})
			if err != nil {
				return err
			}
			if res.Duplicate != (i == 1) {
				return fmt.Errorf("signal %d: duplicate %v", i, res.Duplicate)
			}
		}
		return nil
	}))
	require.Equal(t, workflow.Completed, wait(t, via, paid).Status)
	require.NoError(t, pg.InTx(ctx, via, func(ctx context.Context, tx pgx.Tx) error { return workflow.CancelTx(ctx, tx, gone, "test") }))
	waitStatus(t, via, late, workflow.Waiting)
	_, err = via.Exec(ctx, `SELECT compute_advance_sim_clock(interval '2 hours')`)
	require.NoError(t, err)
	require.Equal(t, workflow.Completed, wait(t, via, late).Status)
	require.Equal(t, workflow.Cancelled, wait(t, via, gone).Status)
	require.Equal(t, 1, direct.MustCount(t, `SELECT count(*) FROM wf_effects WHERE workflow_id = 'b1' AND step = 'confirm' AND n = 1`))
	require.Equal(t, 1, direct.MustCount(t, `SELECT count(*) FROM wf_effects WHERE workflow_id = 'b2' AND step = 'release' AND n = 1`))
	list, err := workflow.List(ctx, via, workflow.ListOpts{Kind: "order", Status: workflow.Completed})
	require.NoError(t, err)
	require.Len(t, list, 2)
}

// TestAPanickingStepFailsTheWorkflowAtItsLastAttempt: a panic is the step's
// error, retried by its policy, and never leaves the workflow without a job.
func TestAPanickingStepFailsTheWorkflowAtItsLastAttempt(t *testing.T) {
	t.Parallel()
	var runs atomic.Int32
	wf := &workflow.Workflow[struct{}, int, int]{
		Kind: "panicky",
		Steps: []workflow.Step[int]{
			{Name: "boom", Retry: workflow.Retry{Attempts: 2, Backoff: 10 * time.Millisecond},
				Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[int]) (workflow.Next, error) {
					runs.Add(1)
					panic("nil map")
				}},
		},
	}
	e := start(t, wf)
	id := startWF(t, e.db.Pool, "panicky", struct{}{}, "pa-1")
	i := wait(t, e.db.Pool, id)
	require.Equal(t, workflow.Failed, i.Status)
	require.Contains(t, i.Error, "step boom panicked: nil map")
	require.Equal(t, int32(2), runs.Load())
}

// TestAwaitTimesOutOntoAnExternalStep: the job of an await carries its
// (transactional) resume step; at the deadline the decision, made under the
// lock, picks the external timeout step, which runs once and finishes.
func TestAwaitTimesOutOntoAnExternalStep(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	wf := &workflow.Workflow[struct{}, int, string]{
		Kind: "late_external",
		Steps: []workflow.Step[int]{
			{Name: "wait", Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[int]) (workflow.Next, error) {
				return workflow.AwaitSignal("go", time.Hour, "on", "late"), nil
			}},
			{Name: "on", Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[int]) (workflow.Next, error) {
				return workflow.Finish("on time"), nil
			}},
			{Name: "late", External: func(ctx context.Context, c *workflow.Call[int]) (workflow.Next, error) {
				calls.Add(1)
				if !c.TimedOut {
					return workflow.Next{}, errors.New("late without a timeout")
				}
				return workflow.Finish("late"), nil
			}},
		},
		Signals: []string{"go"},
	}
	e := start(t, wf)
	ctx := context.Background()
	id := startWF(t, e.db.Pool, "late_external", struct{}{}, "le-1")
	waitStatus(t, e.db.Pool, id, workflow.Waiting)
	_, err := e.db.Pool.Exec(ctx, `SELECT compute_advance_sim_clock(interval '2 hours')`)
	require.NoError(t, err)
	out, err := wf.Wait(ctx, e.db.Pool, id, 20*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, "late", out)
	require.Equal(t, int32(1), calls.Load())
	i, err := workflow.Get(ctx, e.db.Pool, id)
	require.NoError(t, err)
	require.LessOrEqual(t, i.Seq, int64(4), "the wait re-armed itself over and over")
	hist, err := workflow.History(ctx, e.db.Pool, id)
	require.NoError(t, err)
	require.Equal(t, "late", hist[len(hist)-1].Step)
}

// TestAStepAfterASleepKeepsItsBackoff: the wake-up of due timers does not cut
// short the retry backoff of the step a sleep led to.
func TestAStepAfterASleepKeepsItsBackoff(t *testing.T) {
	t.Parallel()
	var (
		mu   sync.Mutex
		runs []time.Time
	)
	wf := &workflow.Workflow[struct{}, int, int]{
		Kind: "sleepy_retry",
		Steps: []workflow.Step[int]{
			{Name: "nap", Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[int]) (workflow.Next, error) {
				return workflow.Sleep(time.Hour, "flaky"), nil
			}},
			{Name: "flaky", Retry: workflow.Retry{Attempts: 2, Backoff: 3 * time.Second},
				Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[int]) (workflow.Next, error) {
					mu.Lock()
					runs = append(runs, time.Now())
					mu.Unlock()
					return workflow.Next{}, errors.New("not yet")
				}},
		},
	}
	e := start(t, wf)
	ctx := context.Background()
	id := startWF(t, e.db.Pool, "sleepy_retry", struct{}{}, "sr-1")
	waitStatus(t, e.db.Pool, id, workflow.Sleeping)
	_, err := e.db.Pool.Exec(ctx, `SELECT compute_advance_sim_clock(interval '2 hours')`)
	require.NoError(t, err)
	i := wait(t, e.db.Pool, id)
	require.Equal(t, workflow.Failed, i.Status)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, runs, 2)
	require.GreaterOrEqual(t, runs[1].Sub(runs[0]), 3*time.Second, "the second attempt came before its backoff")
}

// TestAwaitAnyChildResumesAtTheFirstAndCountsInMetrics: StartChildrenAny
// resumes the parent when the first child finishes (the others still wait),
// and the worker's metrics count the steps, starts and finishes.
func TestAwaitAnyChildResumesAtTheFirstAndCountsInMetrics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	child := &workflow.Workflow[int, int, int]{
		Kind: "racer",
		Init: func(in int) (int, error) { return in, nil },
		Steps: []workflow.Step[int]{
			{Name: "run", Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[int]) (workflow.Next, error) {
				if *c.State == 0 {
					return workflow.Finish(0), nil // the quick one
				}
				return workflow.Sleep(time.Hour, "done"), nil
			}},
			{Name: "done", Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[int]) (workflow.Next, error) {
				return workflow.Finish(*c.State), nil
			}},
		},
	}
	parent := &workflow.Workflow[struct{}, int, []string]{
		Kind: "first_wins",
		Steps: []workflow.Step[int]{
			{Name: "spawn", Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[int]) (workflow.Next, error) {
				return workflow.StartChildrenAny([]workflow.Child{{Kind: "racer", Input: 1}, {Kind: "racer", Input: 0}, {Kind: "racer", Input: 2}}, "first"), nil
			}},
			{Name: "first", Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[int]) (workflow.Next, error) {
				var done []string
				for _, ch := range c.Children {
					if ch.Status.Finished() {
						done = append(done, ch.ID)
					}
				}
				return workflow.Finish(done), nil
			}},
		},
	}
	db := pgtest.New(t)
	require.NoError(t, clock.UseSim(ctx, db.Pool, t0))
	reg := workers.NewRegistry()
	require.NoError(t, addWorkflow(reg, child))
	require.NoError(t, addWorkflow(reg, parent))
	prom := prometheus.NewRegistry()
	workertest.Start(t, db.Pool, reg, &workers.Options{Metrics: workers.NewMetrics(prom)})

	id := startWF(t, db.Pool, "first_wins", struct{}{}, "fw")
	out, err := parent.Wait(ctx, db.Pool, id, 20*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, []string{"fw/2.1"}, out, "resumed at the first child's finish, the others still running")
	// The others go on: each reaches its sleep (its first step may still be
	// queued when the parent resumes) and none finishes.
	for _, c := range []string{"fw/2.0", "fw/2.2"} {
		require.Eventually(t, func() bool {
			i, err := workflow.Get(ctx, db.Pool, c)
			require.NoError(t, err)
			require.False(t, i.Status.Finished(), "child %s finished", c)
			return i.Status == workflow.Sleeping
		}, 20*time.Second, 20*time.Millisecond, "child %s never slept", c)
	}

	gather := func() map[string]float64 {
		families, err := prom.Gather()
		require.NoError(t, err)
		got := map[string]float64{}
		for _, f := range families {
			for _, m := range f.GetMetric() {
				labels := ""
				for _, l := range m.GetLabel() {
					labels += l.GetName() + "=" + l.GetValue() + ","
				}
				v := m.GetCounter().GetValue()
				if m.GetHistogram() != nil {
					v = float64(m.GetHistogram().GetSampleCount())
				}
				got[f.GetName()+"{"+labels+"}"] = v
			}
		}
		return got
	}
	// A step is counted once its transaction has committed, which Wait can see
	// first.
	var got map[string]float64
	workertest.WaitFor(t, 30*time.Second, "the finished workflows' last steps counted", func() bool {
		got = gather()
		return got["bettercompute_workflows_finished_total{status=completed,workflow=first_wins,}"] >= 1 &&
			got["bettercompute_workflows_finished_total{status=completed,workflow=racer,}"] >= 1 &&
			got["bettercompute_workflow_step_duration_seconds{step=first,workflow=first_wins,}"] >= 1
	})
	require.Equal(t, 4.0, got["bettercompute_workflows_started_total{workflow=first_wins,}"]+got["bettercompute_workflows_started_total{workflow=racer,}"])
	require.Equal(t, 1.0, got["bettercompute_workflows_finished_total{status=completed,workflow=first_wins,}"])
	require.Equal(t, 1.0, got["bettercompute_workflows_finished_total{status=completed,workflow=racer,}"])
	require.Equal(t, 1.0, got["bettercompute_workflow_steps_total{outcome=children,step=spawn,workflow=first_wins,}"])
	require.Equal(t, 2.0, got["bettercompute_workflow_steps_total{outcome=sleep,step=run,workflow=racer,}"])
	require.Equal(t, 1.0, got["bettercompute_workflow_step_duration_seconds{step=first,workflow=first_wins,}"])
}
