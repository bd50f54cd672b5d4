package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/tracing"
)

// This file is the step worker's side of the package (workers/workflowworker):
// lock an instance at a seq, decide what resumes it, plan and apply a
// transition.

// LockFencedSQL is the first statement of a step's transaction, in one round
// trip and with a plan the server keeps (compute_workflow_lock,
// migrations/workflow/0005_step_functions.sql): both fences of the step's job
// (jobs.FenceSQL: $1 lease, $2 owner, $3 epoch, $4 job id, $5 attempt), then
// workflow $6's row locked and read; Locked reads its answer. A fence that
// does not hold is an error jobs.FenceRaised reads.
//
// The lock is FOR NO KEY UPDATE: it excludes every other transaction that
// moves the instance, and no signal (see SignalTx): a step may hold it as
// long as it runs.
const LockFencedSQL = `SELECT * FROM compute_workflow_lock($1::text, $2::text, $3::bigint, $4::bigint, $5::int, $6::text)`

// Locked is the instance a step job jobID, created for seq, locked with
// LockFencedSQL (row, its answer), or nil when the job may no longer advance
// it: the workflow is gone (pruned), or its seq is no longer seq and the job
// is not the one that runs it (another step committed, or a cancel).
//
// A job that ran several steps in a row (inline: see the package doc) stays
// the instance's job (its job_id) while its seq moves on; an attempt of that
// job after a crash resumes at the instance's seq, the first step not
// committed.
func Locked(row pgx.Row, id string, seq, jobID int64) (*Info, error) {
	i, err := scanInfo(row)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, pg.Translate(fmt.Errorf("error locking workflow %s: %w", id, err))
	}
	if i.AdvancedBy(seq, jobID) {
		return i, nil
	}
	return nil, nil
}

// AdvancedBy reports whether step job jobID, created for seq, may advance i:
// i is at seq, or, moved on by that job's own inline steps, still run by it
// (the job then resumes at i's seq). jobID 0 asks for seq exactly.
func (i *Info) AdvancedBy(seq, jobID int64) bool {
	return i.Seq == seq || (i.Seq > seq && jobID != 0 && i.JobID != nil && *i.JobID == jobID && !i.Status.Finished())
}

// Event is what resumes a step execution: the step to run and what the step
// gets; or, with Rearm, nothing yet (the job re-arms itself for RearmAt).
type Event struct {
	Step     string
	Signal   *Signal
	TimedOut bool
	Children []ChildOutcome
	// Rearm: the awaited event has not come; wait again until RearmAt (on
	// compute_now()), or for a wake-up without a deadline.
	Rearm   bool
	RearmAt *time.Time
}

// Decide reads what resumes instance i (read from db, in its locked
// transaction or not): the step, a signal from the inbox, the children's
// outcomes, a deadline passed, or nothing yet.
func Decide(ctx context.Context, db pg.DBTX, i *Info) (Event, error) {
	switch i.Status {
	case Sleeping:
		if i.WakeAt != nil && i.WakeAt.After(i.Now) {
			return Event{Rearm: true, RearmAt: i.WakeAt}, nil
		}
		return Event{Step: i.Step}, nil
	case Waiting:
		if i.Wait == nil {
			return Event{Step: i.Step}, nil
		}
		if i.Wait.Signal != "" {
			var s Signal
			err := db.QueryRow(ctx, `SELECT id, payload, sent_at, coalesce(cause, '') FROM compute_workflow_signals
				WHERE workflow_id = $1 AND name = $2 AND consumed_at IS NULL ORDER BY id LIMIT 1`, i.ID, i.Wait.Signal).
				Scan(&s.id, &s.Payload, &s.SentAt, &s.cause)
			switch {
			case err == nil:
				s.Name = i.Wait.Signal
				return Event{Step: i.Step, Signal: &s}, nil
			case !errors.Is(err, pgx.ErrNoRows):
				return Event{}, pg.Translate(fmt.Errorf("error reading the inbox of workflow %s: %w", i.ID, err))
			}
		} else {
			cs, err := children(ctx, db, i.ID, i.Wait.Since)
			if err != nil {
				return Event{}, err
			}
			done := 0
			for _, c := range cs {
				if c.Status.Finished() {
					done++
				}
			}
			if done == len(cs) || (i.Wait.Children == "any" && done > 0) {
				return Event{Step: i.Step, Children: cs}, nil
			}
		}
		if i.WakeAt != nil && !i.WakeAt.After(i.Now) {
			return Event{Step: i.Wait.TimeoutStep, TimedOut: true}, nil
		}
		return Event{Rearm: true, RearmAt: i.WakeAt}, nil
	}
	return Event{Step: i.Step}, nil
}

func children(ctx context.Context, db pg.DBTX, id string, since int64) ([]ChildOutcome, error) {
	rows, err := db.Query(ctx, `SELECT id, kind, status, result, coalesce(error, '') FROM compute_workflows
		WHERE parent_id = $1 AND parent_seq = $2 ORDER BY created_at, id`, id, since)
	if err != nil {
		return nil, pg.Translate(fmt.Errorf("error reading the children of workflow %s: %w", id, err))
	}
	defer rows.Close()
	var out []ChildOutcome
	for rows.Next() {
		var c ChildOutcome
		var status string
		if err := rows.Scan(&c.ID, &c.Kind, &status, &c.Result, &c.Error); err != nil {
			return nil, pg.Translate(err)
		}
		c.Status = Status(status)
		out = append(out, c)
	}
	return out, pg.Translate(rows.Err())
}

// Transition is an instance's move to its next state, applied by AdvanceTx.
type Transition struct {
	Status Status
	Step   string
	// State is the new state; nil keeps the stored one.
	State  json.RawMessage
	Result json.RawMessage
	Error  string
	Wait   *WaitSpec
	WakeAt *time.Time
	// Job: the next step's River job, in Queue, due at RunAt (River's wall
	// clock), with MaxAttempts.
	Job         bool
	Queue       string
	RunAt       time.Time
	MaxAttempts int
	// KeepJob, without Job, keeps this running job as the instance's job: the
	// same job execution runs the next step at once (inline).
	KeepJob int64
	// Outcome, when set, writes a history row for the step execution that
	// ends: what it led to, to NextStep, with the job's attempt, id and lease
	// epoch, started at StartedAt and committed at CommittedAt (both on
	// compute_now()'s scale; zero for compute_now() itself).
	Outcome     string
	CommittedAt time.Time
	NextStep    string
	Attempt     int
	JobID       int64
	LeaseEpoch  int64
	StartedAt   time.Time
	// ConsumeSignal marks the signal consumed at this seq.
	ConsumeSignal *Signal
	// Children are started with this instance as their parent (at its new seq).
	Children []Child
	// RanStep is the step whose execution ends (for the history row), when it
	// is not the instance's current step (an await's timeout step).
	RanStep string
}

// Plan turns a step's Next into the transition of instance i, for a
// definition m, with the step's new state. The next job goes to queue.
func Plan(m Meta, i *Info, ev Event, next Next, state json.RawMessage, queue string) (Transition, error) {
	t := Transition{State: state, Queue: queue, RunAt: time.Now(), Outcome: next.op, RanStep: ev.Step}
	attemptsOf := func(step string) int {
		s, _ := m.Step(step)
		return s.Retry.attempts()
	}
	need := func(step, what string) error {
		if step == "" {
			return fault.New(fault.InvalidArgument, "workflow %s step %s: %s names no step", m.Kind, ev.Step, what)
		}
		if _, ok := m.Step(step); !ok {
			return fault.New(fault.InvalidArgument, "workflow %s step %s: %s names step %s, which is not defined", m.Kind, ev.Step, what, step)
		}
		return nil
	}
	// A cancelled workflow's compensation keeps it cancelling, with the
	// cancel's reason as its error, until it ends cancelled: it may Goto,
	// Finish or Fail, not wait (a wait would leave cancelling, and a
	// cancelling workflow takes no signals).
	cancelling := i.Status == Cancelling
	if cancelling {
		var w string
		switch next.op {
		case "sleep":
			w = "Sleep"
		case "await":
			w = "AwaitSignal"
		case "children":
			w = "StartChildren"
		}
		if w != "" {
			return t, fault.New(fault.InvalidArgument, "workflow %s step %s: a compensation step may Goto, Finish or Fail, not %s", m.Kind, ev.Step, w)
		}
	}
	switch next.op {
	case "goto":
		if err := need(next.step, "Goto"); err != nil {
			return t, err
		}
		t.Status, t.Step, t.NextStep, t.Job, t.MaxAttempts = Running, next.step, next.step, true, attemptsOf(next.step)
		if cancelling {
			t.Status, t.Error = Cancelling, i.Error
		}
	case "sleep":
		if err := need(next.step, "Sleep"); err != nil {
			return t, err
		}
		if next.d < 0 {
			return t, fault.New(fault.InvalidArgument, "workflow %s step %s: Sleep of a negative duration", m.Kind, ev.Step)
		}
		wake := i.Now.Add(next.d)
		t.Status, t.Step, t.NextStep, t.WakeAt, t.Job, t.MaxAttempts = Sleeping, next.step, next.step, &wake, true, attemptsOf(next.step)
		t.RunAt = time.Now().Add(next.d)
	case "await":
		if err := need(next.step, "AwaitSignal"); err != nil {
			return t, err
		}
		if !m.HasSignal(next.signal) {
			return t, fault.New(fault.InvalidArgument, "workflow %s step %s: AwaitSignal of %q, which the workflow does not declare in Signals", m.Kind, ev.Step, next.signal)
		}
		t.Status, t.Step, t.NextStep, t.Job, t.MaxAttempts = Waiting, next.step, next.step, true, attemptsOf(next.step)
		t.Wait = &WaitSpec{Signal: next.signal}
		if next.d > 0 {
			if err := need(next.timeoutStep, "AwaitSignal's timeout"); err != nil {
				return t, err
			}
			wake := i.Now.Add(next.d)
			t.WakeAt, t.Wait.TimeoutStep = &wake, next.timeoutStep
		}
		// Waits for the signal, or (below) its deadline; a wake-up makes it due.
		t.RunAt = time.Now().Add(rearmDelay(i.Now, t.WakeAt))
	case "children":
		if err := need(next.step, "StartChildren"); err != nil {
			return t, err
		}
		mode := "all"
		if next.any {
			mode = "any"
		}
		t.Status, t.Step, t.NextStep, t.Job, t.MaxAttempts = Waiting, next.step, next.step, true, attemptsOf(next.step)
		t.Wait = &WaitSpec{Children: mode, Since: i.Seq + 1}
		if next.d > 0 {
			if err := need(next.timeoutStep, "StartChildren' timeout"); err != nil {
				return t, err
			}
			wake := i.Now.Add(next.d)
			t.WakeAt, t.Wait.TimeoutStep = &wake, next.timeoutStep
		}
		t.Children = next.children
		if len(next.children) == 0 {
			t.RunAt = time.Now()
		} else {
			t.RunAt = time.Now().Add(rearmDelay(i.Now, t.WakeAt))
		}
	case "finish":
		res, err := EncodePayload("result of workflow "+m.Kind, next.result)
		if err != nil {
			return t, err
		}
		t.Status, t.Step, t.Result, t.Outcome = Completed, ev.Step, res, "completed"
		if cancelling {
			t.Status, t.Result, t.Outcome, t.Error = Cancelled, nil, "cancelled", i.Error
		}
	case "fail":
		t.Status, t.Step, t.Error, t.Outcome = Failed, ev.Step, next.reason, "failed"
		if cancelling {
			t.Status, t.Outcome, t.Error = Cancelled, "cancelled", i.Error+"; compensation failed: "+next.reason
		}
	default:
		return t, fault.New(fault.InvalidArgument, "workflow %s step %s returned an empty Next (use Goto, Sleep, AwaitSignal, StartChildren, Finish or Fail)", m.Kind, ev.Step)
	}
	if t.Step == "" {
		t.Step = ev.Step
	}
	if ev.Signal != nil {
		t.ConsumeSignal = ev.Signal
	}
	return t, nil
}

// rearmDelay is how long a wait's job sleeps on River's clock before it looks
// again: until the deadline, or an hour without one (a wake-up makes it due
// sooner; the hour only bounds a lost one).
func rearmDelay(now time.Time, wake *time.Time) time.Duration {
	if wake == nil {
		return time.Hour
	}
	return max(wake.Sub(now), 0)
}

// RearmTransition is the transition of a job whose awaited event has not come:
// the instance stays as it is, and a new job (the next seq) waits for the
// deadline or a wake-up.
func RearmTransition(i *Info, queue string, attempts int) Transition {
	return Transition{Status: i.Status, Step: i.Step, Result: i.Result, Error: i.Error, Wait: i.Wait, WakeAt: i.WakeAt,
		Job: true, Queue: queue, RunAt: time.Now().Add(rearmDelay(i.Now, i.WakeAt)), MaxAttempts: attempts}
}

// FailTransition fails instance i at step (or sends it to onError) with err.
func FailTransition(i *Info, step, onError, queue string, attempts int, err string) Transition {
	if i.Status == Cancelling {
		return Transition{Status: Cancelled, Step: step, RanStep: step, Error: i.Error + "; compensation failed: " + err, Outcome: "cancelled"}
	}
	if onError != "" {
		return Transition{Status: Running, Step: onError, RanStep: step, NextStep: onError, Error: err, Outcome: "error", Job: true, Queue: queue, RunAt: time.Now(), MaxAttempts: attempts}
	}
	return Transition{Status: Failed, Step: step, RanStep: step, Error: err, Outcome: "failed"}
}

const consumeSQL = `UPDATE compute_workflow_signals SET consumed_at = compute_now(), consumed_seq = $3
WHERE id = $1 AND workflow_id = $2 AND consumed_at IS NULL`

const lockParentSQL = `SELECT 1 FROM compute_workflows WHERE id = $1 FOR NO KEY UPDATE`

// AdvanceTx applies t to instance i, locked in tx at its seq: the instance's
// new state and seq, its next job, the history row, the consumed signal, the
// started children, and a finished child's wake-up of its waiting parent. It
// returns the new seq.
func AdvanceTx(ctx context.Context, tx pgx.Tx, i *Info, t Transition) (int64, error) {
	var state, result, wait any
	if t.State != nil {
		if len(t.State) > MaxPayload {
			return 0, fault.New(fault.InvalidArgument, "the state of workflow %s is %d bytes, over the limit of %d", i.ID, len(t.State), MaxPayload)
		}
		if err := fault.CheckJSON("the state of workflow "+i.ID, t.State); err != nil {
			return 0, err
		}
		state = string(t.State)
	}
	if t.Result != nil {
		result = string(t.Result)
	}
	if t.Wait != nil {
		enc, _ := json.Marshal(t.Wait)
		wait = string(enc)
	}
	var errText any
	if t.Error != "" {
		errText = errorText(t.Error, 4000)
	}
	// A signal wait's job is scheduled for the deadline (or an hour) even when
	// a signal is in the inbox already: the COMMIT's barrier (migrations/
	// workflow/0003_signal_barrier.sql) waits for the signals in flight, then
	// makes the job due if one the wait names is there. Read here, under the
	// row's FOR NO KEY UPDATE, the inbox could miss a signal committing
	// beside this transaction: signals do not wait for the lock.
	jobState := "available"
	if time.Until(t.RunAt) > jobs.ScheduledAfter {
		jobState = "scheduled"
	}
	maxAttempts := t.MaxAttempts
	if maxAttempts <= 0 {
		maxAttempts = DefaultAttempts
	}
	// One round trip: the instance's move, its next job and the history row
	// in one statement (jobs.StepWorkflowSQL), the consumed signal, and a
	// finished child's wake-up of its parent (after locking the parent, in a
	// statement of its own so that it sees the parent's committed wait).
	b := &pgx.Batch{}
	var keep any
	if t.KeepJob != 0 && !t.Job {
		keep = t.KeepJob
	}
	var ran, outcome, next, started, committed, ranJob, epoch any
	if t.Outcome != "" {
		outcome, ran = t.Outcome, t.RanStep
		if t.RanStep == "" {
			ran = i.Step
		}
		if t.NextStep != "" {
			next = t.NextStep
		}
		if !t.StartedAt.IsZero() {
			started = t.StartedAt
		}
		if !t.CommittedAt.IsZero() {
			committed = t.CommittedAt
		}
		if t.JobID != 0 {
			ranJob = t.JobID
		}
		if t.LeaseEpoch != 0 {
			epoch = t.LeaseEpoch
		}
	}
	b.Queue(jobs.StepWorkflowSQL, i.ID, i.Seq, string(t.Status), t.Step, state, result, errText, wait,
		t.WakeAt, t.Job, t.Queue, t.RunAt, jobState, maxAttempts, tracing.CauseOrNil(ctx), keep,
		ran, outcome, next, t.Attempt, ranJob, epoch, started, committed)
	if t.ConsumeSignal != nil {
		b.Queue(consumeSQL, t.ConsumeSignal.id, i.ID, i.Seq)
	}
	if t.Status.Finished() && i.ParentID != "" {
		b.Queue(lockParentSQL, i.ParentID)
		b.Queue(jobs.WakeWorkflowParentSQL, i.ParentID, i.ParentSeq, time.Now())
	}
	res := tx.SendBatch(ctx, b)
	var newSeq int64
	var jobID *int64
	err := res.QueryRow().Scan(&newSeq, &jobID)
	if errors.Is(err, pgx.ErrNoRows) {
		_ = res.Close()
		return 0, fault.New(fault.Fenced, "workflow %s: seq %d is stale", i.ID, i.Seq)
	}
	if err == nil {
		err = res.Close()
	} else {
		_ = res.Close()
	}
	if err != nil {
		return 0, pg.Translate(fmt.Errorf("error advancing workflow %s: %w", i.ID, err))
	}
	// Wake this process's worker of the next job's shard once tx commits: a
	// job due now, or a signal wait that the COMMIT's barrier may make due.
	if t.Job && (jobState == "available" || (t.Wait != nil && t.Wait.Signal != "")) {
		jobs.WakeAfterCommit(tx, i.ID)
	}
	if t.Status.Finished() && i.ParentID != "" {
		jobs.WakeAfterCommit(tx, i.ParentID)
	}
	if len(t.Children) > 0 {
		specs := make([]startSpec, len(t.Children))
		for n, c := range t.Children {
			id := c.ID
			if id == "" {
				id = i.ID + "/" + strconv.FormatInt(newSeq, 10) + "." + strconv.Itoa(n)
			}
			if err := ValidateID(id); err != nil {
				return 0, err
			}
			if !kindRe.MatchString(c.Kind) {
				return 0, fault.New(fault.InvalidArgument, "child %d of workflow %s: bad workflow kind %q", n, i.ID, c.Kind)
			}
			enc, err := EncodePayload("input of child workflow "+id, c.Input)
			if err != nil {
				return 0, err
			}
			specs[n] = startSpec{id: id, kind: c.Kind, input: enc}
		}
		if err := startManyTx(ctx, tx, specs, i.ID, newSeq); err != nil {
			return 0, err
		}
	}
	return newSeq, nil
}

// errorText is a step's error as text PostgreSQL stores: invalid UTF-8
// replaced and NUL bytes dropped (an application's error may hold either, and
// refusing it would leave the failure unrecorded), cut to n bytes at a
// character's start.
func errorText(s string, n int) string {
	s = fault.CleanText(s)
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
