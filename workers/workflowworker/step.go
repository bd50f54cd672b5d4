package workflowworker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"go.opentelemetry.io/otel/trace"

	"github.com/bettercompute/bettercompute/domain/lease"
	"github.com/bettercompute/bettercompute/domain/workflow"
	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/tracing"
	"github.com/bettercompute/bettercompute/workers"
)

// stepWorker runs one step of a workflow per job (see the package doc of
// domain/workflow for the fences and the transitions).
type stepWorker struct {
	river.WorkerDefaults[jobs.WorkflowStep]
	p *part
}

// NextRetry is the step's own backoff.
func (w *stepWorker) NextRetry(job *river.Job[jobs.WorkflowStep]) time.Time {
	return time.Now().Add(w.retryOf(job.Args.Workflow, job.Args.Step).Delay(job.Attempt))
}

func (w *stepWorker) retryOf(kind, step string) workflow.Retry {
	if d, m := w.p.def(kind); d != nil {
		if s, ok := m.Step(step); ok {
			return s.Retry
		}
	}
	return workflow.Retry{}
}

// exec is one step execution.
type exec struct {
	w     *stepWorker
	rt    *workers.Runtime
	job   *river.Job[jobs.WorkflowStep]
	l     lease.Lease
	def   workflow.Definition
	meta  workflow.Meta
	start time.Time
	// lockedAt is when the instance's row was locked (this process's clock).
	lockedAt time.Time
	span     trace.Span // bettercompute.workflow.step
}

// StepSpan is the name of a workflow step's span.
const StepSpan = "bettercompute.workflow.step"

func (w *stepWorker) Work(ctx context.Context, job *river.Job[jobs.WorkflowStep]) (err error) {
	rt := workers.RuntimeFrom(ctx)
	if rt == nil {
		return fault.New(fault.Internal, "workflow step job %d: no Runtime in its context", job.ID)
	}
	l, ok := rt.LeaseForQueue(job.Queue)
	if !ok {
		return fault.New(fault.Fenced, "job %d: this process holds no lease for queue %s", job.ID, job.Queue)
	}
	// The step's span, caused by what inserted its job (the start's request,
	// or the previous step: its span is the next job's cause, since that job is
	// inserted in this context).
	ctx, span := tracing.Start(ctx, rt.TracerProvider(), StepSpan, jobCause(job.Metadata))
	defer func() { workers.EndSpanOutcome(span, err, workers.Outcome(ctx, err)) }()
	if span.IsRecording() {
		span.SetAttributes(tracing.WorkflowID.String(job.Args.WorkflowID), tracing.WorkflowKind.String(job.Args.Workflow),
			tracing.WorkflowStep.String(job.Args.Step), tracing.LeaseEpoch.Int64(l.Epoch))
		if shard, ok := workers.ShardOfQueue(job.Queue); ok {
			span.SetAttributes(tracing.Shard.Int(shard))
		}
	}
	e := &exec{w: w, rt: rt, job: job, l: l, start: time.Now(), span: span}
	a := job.Args
	if d, m := w.p.def(a.Workflow); d != nil {
		if step, ok := m.Step(a.Step); ok && !step.External {
			// A transactional step needs no read before its transaction: it
			// locks, decides and checks the seq there (and takes the external
			// path should the event pick an external step).
			e.def, e.meta = d, m
			return e.transactional(ctx, step)
		}
	}

	// Read first, unlocked: an external step calls out before its transaction,
	// and a stale job needs no more than a no-op completion.
	inst, err := workflow.Get(ctx, rt.Pool(), a.WorkflowID)
	if fault.Has(err, fault.NotFound) {
		return e.noop(ctx, "the workflow is gone (pruned)")
	}
	if err != nil {
		return err
	}
	if inst.Seq != a.Seq {
		return e.noop(ctx, fmt.Sprintf("seq %d is stale (the workflow is at %d)", a.Seq, inst.Seq))
	}
	if inst.Status.Finished() {
		return e.noop(ctx, "the workflow is "+string(inst.Status))
	}
	e.def, e.meta = w.p.def(inst.Kind)
	if e.def == nil {
		return e.fail(ctx, inst.Step, "", fmt.Sprintf("this worker does not define workflow kind %s", inst.Kind), nil)
	}
	ev, err := workflow.Decide(ctx, rt.Pool(), inst)
	if err != nil {
		return err
	}
	e.linkSignal(ev)
	if ev.Rearm {
		return e.rearm(ctx)
	}
	step, ok := e.meta.Step(ev.Step)
	if !ok {
		return e.fail(ctx, ev.Step, "", fmt.Sprintf("this worker's workflow %s has no step %s", inst.Kind, ev.Step), nil)
	}
	if step.External {
		return e.external(ctx, inst, ev, step)
	}
	return e.transactional(ctx, step)
}

// jobCause is the cause in a job's metadata (jobs.TraceparentKey), nil
// without one; the metadata is decoded only when it names the key.
func jobCause(metadata []byte) []string {
	if !bytes.Contains(metadata, []byte(`"`+jobs.TraceparentKey+`"`)) {
		return nil
	}
	var m map[string]any
	if json.Unmarshal(metadata, &m) != nil {
		return nil
	}
	if c, ok := m[jobs.TraceparentKey].(string); ok {
		return []string{c}
	}
	return nil
}

// linkSignal links the step's span to the span that sent the signal ev
// resumes the step with.
func (e *exec) linkSignal(ev workflow.Event) {
	if ev.Signal == nil || !e.span.IsRecording() {
		return
	}
	if sc := tracing.SpanContext(ev.Signal.Cause()); sc.IsValid() {
		e.span.AddLink(trace.Link{SpanContext: sc})
	}
}

// invocation is the untyped call of ev's step on inst.
func (e *exec) invocation(inst *workflow.Info, ev workflow.Event) *workflow.Invocation {
	return &workflow.Invocation{
		WorkflowID: inst.ID, Kind: inst.Kind, Step: ev.Step, Seq: inst.Seq, Attempt: e.job.Attempt,
		Input: inst.Input, State: inst.State, Signal: ev.Signal, TimedOut: ev.TimedOut,
		Children: ev.Children, Cancelled: inst.Status == workflow.Cancelling, Err: errIfOnError(inst),
	}
}

// errIfOnError is the error an OnError step gets: the one its failed step left.
func errIfOnError(i *workflow.Info) string {
	if i.Status == workflow.Running {
		return i.Error
	}
	return ""
}

// transactional runs a transactional step: lock, decide, run, advance, complete,
// in one fenced transaction.
func (e *exec) transactional(ctx context.Context, step workflow.StepMeta) error {
	var (
		outcome = "stale"
		status  workflow.Status
		ranStep = step.Name
		first   bool
		ext     *externalRun
	)
	err := workers.InTx(ctx, e.job, func(ctx context.Context, tx pgx.Tx) error {
		inst, err := workflow.LockTx(ctx, tx, e.job.Args.WorkflowID, e.job.Args.Seq)
		e.lockedAt = time.Now()
		if err != nil || inst == nil {
			return err // nil: stale, the job completes as a no-op
		}
		ev, err := workflow.Decide(ctx, tx, inst)
		if err != nil {
			return err
		}
		e.linkSignal(ev)
		if ev.Rearm {
			outcome = "rearm"
			_, err := workflow.AdvanceTx(ctx, tx, inst, workflow.RearmTransition(inst, e.job.Queue, step.Retry.Attempts))
			return err
		}
		ranStep, first = ev.Step, inst.Seq == 1
		sm, ok := e.meta.Step(ev.Step)
		if !ok {
			return fault.New(fault.InvalidArgument, "workflow %s has no step %s", inst.Kind, ev.Step)
		}
		if sm.External {
			// The event picks an external step (an await's timeout step, say):
			// nothing is written here; it runs outside the transaction, and is
			// recorded under the fences as any external step.
			ext = &externalRun{inst: inst, ev: ev, step: sm}
			return errTakeExternal
		}
		inv := e.invocation(inst, ev)
		// A failing step rolls the whole transaction back; failed records the
		// failure, when it is final, in a transaction of its own.
		next, err := e.run(ctx, tx, inv)
		if err != nil {
			return err
		}
		if e.w.p.afterStep != nil {
			e.w.p.afterStep(ctx, e.job.Args)
		}
		t, err := workflow.Plan(e.meta, inst, ev, next, inv.NewState, e.job.Queue)
		if err != nil {
			return err
		}
		e.stamp(&t, inst)
		if _, err := workflow.AdvanceTx(ctx, tx, inst, t); err != nil {
			return err
		}
		outcome, status = t.Outcome, t.Status
		return nil
	})
	if errors.Is(err, errTakeExternal) {
		return e.external(ctx, ext.inst, ext.ev, ext.step)
	}
	if err != nil {
		return e.failed(ctx, ranStep, err)
	}
	e.w.p.observe(e.job.Args.Workflow, ranStep, outcome, time.Since(e.start), status, first)
	return nil
}

// errTakeExternal rolls back a transactional execution whose event, decided
// under the lock, picked an external step.
var errTakeExternal = errors.New("the event picks an external step")

type externalRun struct {
	inst *workflow.Info
	ev   workflow.Event
	step workflow.StepMeta
}

// external runs an external step: call out, then record under the fences.
func (e *exec) external(ctx context.Context, inst *workflow.Info, ev workflow.Event, step workflow.StepMeta) error {
	inv := e.invocation(inst, ev)
	next, err := e.run(ctx, nil, inv)
	if err != nil {
		return e.failed(ctx, ev.Step, err)
	}
	if e.w.p.afterStep != nil {
		e.w.p.afterStep(ctx, e.job.Args)
	}
	outcome := "stale"
	var status workflow.Status
	err = workers.InTx(ctx, e.job, func(ctx context.Context, tx pgx.Tx) error {
		locked, err := workflow.LockTx(ctx, tx, inst.ID, inst.Seq)
		e.lockedAt = time.Now()
		if err != nil || locked == nil {
			return err
		}
		t, err := workflow.Plan(e.meta, locked, ev, next, inv.NewState, e.job.Queue)
		if err != nil {
			return err
		}
		e.stamp(&t, locked)
		if _, err := workflow.AdvanceTx(ctx, tx, locked, t); err != nil {
			return err
		}
		outcome, status = t.Outcome, t.Status
		return nil
	})
	if err != nil {
		return e.failed(ctx, ev.Step, err)
	}
	e.w.p.observe(inst.Kind, ev.Step, outcome, time.Since(e.start), status, inst.Seq == 1)
	return nil
}

// run runs the step, turning a panic into the step's error: River would
// retry a panicking job and finally discard it, leaving the workflow with no
// job; as an error it follows the step's retry policy and fails the workflow
// (or goes to OnError) at the last attempt.
func (e *exec) run(ctx context.Context, tx pgx.Tx, inv *workflow.Invocation) (next workflow.Next, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("step %s panicked: %v", inv.Step, r)
		}
	}()
	return e.def.Run(ctx, tx, inv)
}

// stamp fills the history fields of t from this execution.
//
// Both times are on compute_now()'s scale: inst.Now is its value when the
// instance was locked, and this process's clock measures the step's work
// before (an external call) and after (the step's function and the
// transition) that moment.
func (e *exec) stamp(t *workflow.Transition, inst *workflow.Info) {
	t.Attempt, t.JobID, t.LeaseEpoch = e.job.Attempt, e.job.ID, e.l.Epoch
	t.StartedAt = inst.Now.Add(-e.lockedAt.Sub(e.start))
	t.CommittedAt = inst.Now.Add(time.Since(e.lockedAt))
}

// failed handles a step's error: FENCED goes back to the middleware (the job
// is given back); a state that no longer decodes fails the workflow and
// cancels the job; bad input (INVALID_ARGUMENT: a Next naming no step, a state
// over the limit) and a last attempt fail the workflow (or go to the step's
// OnError step); anything else is retried with the step's backoff.
func (e *exec) failed(ctx context.Context, step string, err error) error {
	sm, _ := e.meta.Step(step)
	attempts := sm.Retry.Attempts
	if attempts <= 0 {
		attempts = workflow.DefaultAttempts
	}
	last := e.job.Attempt >= attempts || e.job.Attempt >= e.job.MaxAttempts
	switch {
	case fault.Has(err, fault.Fenced), fault.Has(context.Cause(ctx), fault.Fenced):
		return err
	case ctx.Err() != nil && (!last || !errors.Is(ctx.Err(), context.DeadlineExceeded)):
		return err // a stop hands the job back; an attempt left retries
	case ctx.Err() != nil:
		// The last attempt ran out of time (the job timeout): River would
		// discard the job and leave the workflow without one, so the failure
		// is recorded now, fenced as ever.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
	case errors.Is(err, workflow.ErrUndecodable):
		if ferr := e.fail(ctx, step, "", err.Error(), err); ferr != nil {
			return ferr
		}
		return river.JobCancel(err)
	}
	if !fault.Has(err, fault.InvalidArgument) && !last {
		e.w.p.observe(e.job.Args.Workflow, step, "retry", time.Since(e.start), "", false)
		return err
	}
	msg := fmt.Sprintf("step %s failed (attempt %d of %d): %s", step, e.job.Attempt, attempts, e.rt.Redact(err))
	return e.fail(ctx, step, sm.OnError, msg, nil)
}

// fail moves the workflow to failed (or to onError) at the job's seq, and
// completes the job; with cause set it does not complete the job (the caller
// cancels it).
func (e *exec) fail(ctx context.Context, step, onError, msg string, cause error) error {
	var status workflow.Status
	write := func(ctx context.Context, tx pgx.Tx) error {
		inst, err := workflow.LockTx(ctx, tx, e.job.Args.WorkflowID, e.job.Args.Seq)
		e.lockedAt = time.Now()
		if err != nil || inst == nil {
			return err
		}
		attempts := workflow.DefaultAttempts
		if s, ok := e.meta.Step(onError); ok && s.Retry.Attempts > 0 {
			attempts = s.Retry.Attempts
		}
		t := workflow.FailTransition(inst, step, onError, e.job.Queue, attempts, msg)
		e.stamp(&t, inst)
		if _, err := workflow.AdvanceTx(ctx, tx, inst, t); err != nil {
			return err
		}
		status = t.Status
		return nil
	}
	var err error
	if cause == nil {
		err = workers.InTx(ctx, e.job, write)
	} else {
		err = pg.InTx(ctx, e.rt.Pool(), func(ctx context.Context, tx pgx.Tx) error {
			if err := workers.FenceTx(ctx, tx, e.l, e.job.JobRow); err != nil {
				return err
			}
			return write(ctx, tx)
		})
	}
	if err != nil {
		return err
	}
	log(e.rt).Warn().Str("workflow_id", e.job.Args.WorkflowID).Str("workflow", e.job.Args.Workflow).
		Str("step", step).Str("status", string(status)).Msg(msg)
	e.w.p.observe(e.job.Args.Workflow, step, "failed", time.Since(e.start), status, false)
	return nil
}

// rearm re-arms a wait whose event has not come, under the lock.
func (e *exec) rearm(ctx context.Context) error {
	err := workers.InTx(ctx, e.job, func(ctx context.Context, tx pgx.Tx) error {
		inst, err := workflow.LockTx(ctx, tx, e.job.Args.WorkflowID, e.job.Args.Seq)
		e.lockedAt = time.Now()
		if err != nil || inst == nil {
			return err
		}
		ev, err := workflow.Decide(ctx, tx, inst)
		if err != nil {
			return err
		}
		t := workflow.RearmTransition(inst, e.job.Queue, e.retryOf(inst.Step).Attempts)
		if !ev.Rearm {
			t.RunAt = time.Now() // the event came meanwhile: run at once
		}
		_, err = workflow.AdvanceTx(ctx, tx, inst, t)
		return err
	})
	if err == nil {
		e.w.p.observe(e.job.Args.Workflow, e.job.Args.Step, "rearm", 0, "", false)
	}
	return err
}

func (e *exec) retryOf(step string) workflow.Retry { return e.w.retryOf(e.job.Args.Workflow, step) }

// noop completes a job that may no longer advance its workflow.
func (e *exec) noop(ctx context.Context, why string) error {
	err := workers.InTx(ctx, e.job, func(context.Context, pgx.Tx) error { return nil })
	if err == nil {
		log(e.rt).Debug().Int64("job_id", e.job.ID).Str("workflow_id", e.job.Args.WorkflowID).Msg("workflow step job completed without effect: " + why)
		e.w.p.observe(e.job.Args.Workflow, e.job.Args.Step, "stale", 0, "", false)
	}
	return err
}
