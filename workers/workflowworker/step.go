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

	"github.com/bettercompute/bettercompute/domain/workflow"
	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/tracing"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/internal/lease"
	"github.com/bettercompute/bettercompute/workers/internal/riverjob"
)

// stepWorker runs one step of a workflow per job (see the package doc of
// domain/workflow for the fences and the transitions).
type stepWorker struct {
	river.WorkerDefaults[riverjob.WorkflowStep]
	p *part
}

// NextRetry is the step's own backoff.
func (w *stepWorker) NextRetry(job *river.Job[riverjob.WorkflowStep]) time.Time {
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

// exec is one job execution: the step its job names, then, inline, each
// step a commit moves the workflow to while the budget lasts (see Options).
type exec struct {
	w    *stepWorker
	rt   *workers.Runtime
	job  *river.Job[riverjob.WorkflowStep]
	l    lease.Lease
	def  workflow.Definition // nil until the kind is known to this worker
	meta workflow.Meta       // def's
	// seq and step are what this execution runs now: the job's, then each
	// inline step's; n is how many steps it committed so far.
	seq  int64
	step string
	n    int
	ran  []ranStep
	// more: the last commit kept the job, so the next step runs inline.
	more bool
	// completes: the transition routed last ends this job's work; it
	// completes in the same transaction, after the transition (finish).
	completes bool
	began     time.Time // the job execution's start (the budget's clock)
	start     time.Time // the current step's start
	// lockedAt is when the instance's row was locked (this process's clock).
	lockedAt time.Time
	span     trace.Span // the current step's bettercompute.workflow.step
}

// ranStep is a step an execution committed, in its job's metadata when it
// ran more than one.
type ranStep struct {
	Seq  int64  `json:"seq"`
	Step string `json:"step"`
}

// StepSpan is the name of a workflow step's span.
const StepSpan = "bettercompute.workflow.step"

// JobStepsKey is the key of a step job's metadata that lists the steps it
// ran ({"seq": …, "step": …}), when it ran more than one inline.
const JobStepsKey = "workflow_steps"

func (w *stepWorker) Work(ctx context.Context, job *river.Job[riverjob.WorkflowStep]) error {
	rt := workers.RuntimeFrom(ctx)
	if rt == nil {
		return fault.New(fault.Internal, "workflow step job %d: no Runtime in its context", job.ID)
	}
	l, ok := rt.LeaseForQueue(job.Queue)
	if !ok {
		return fault.New(fault.Fenced, "job %d: this process holds no lease for queue %s", job.ID, job.Queue)
	}
	e := &exec{w: w, rt: rt, job: job, l: l, seq: job.Args.Seq, step: job.Args.Step, began: time.Now()}
	if d, m := w.p.def(job.Args.Workflow); d != nil {
		e.def, e.meta = d, m
	}
	// The first step's span is caused by what inserted the job (the start's
	// request, or the step before it); each inline step's span is a child of
	// the span of the step before it, as the next job's would be.
	stepCtx := ctx
	causes := jobCause(job.Metadata)
	for {
		var err error
		stepCtx, err = e.once(ctx, stepCtx, causes)
		if err != nil || !e.more {
			return err
		}
		causes = nil
	}
}

// once runs the execution's current step in its own span (a child of the
// span in parent when causes is nil) and returns the span's context.
func (e *exec) once(ctx, parent context.Context, causes []string) (_ context.Context, err error) {
	if causes == nil && parent != ctx {
		ctx = trace.ContextWithSpan(ctx, trace.SpanFromContext(parent))
	}
	ctx, span := tracing.Start(ctx, e.rt.TracerProvider(), StepSpan, causes)
	defer func() { workers.EndSpanOutcome(span, err, workers.Outcome(ctx, err)) }()
	if span.IsRecording() {
		span.SetAttributes(tracing.WorkflowID.String(e.job.Args.WorkflowID), tracing.WorkflowKind.String(e.job.Args.Workflow),
			tracing.WorkflowStep.String(e.step), tracing.LeaseEpoch.Int64(e.l.Epoch))
		if shard, ok := workers.ShardOfQueue(e.job.Queue); ok {
			span.SetAttributes(tracing.Shard.Int(shard))
		}
	}
	e.span, e.start, e.more, e.lockedAt = span, time.Now(), false, time.Time{}
	return ctx, e.run1(ctx)
}

// run1 runs the current step.
func (e *exec) run1(ctx context.Context) error {
	if e.def != nil {
		if step, ok := e.meta.Step(e.step); ok && !step.External {
			// A transactional step needs no read before its transaction: it
			// locks, decides and checks the seq there (and takes the external
			// path should the event pick an external step).
			return e.transactional(ctx, step)
		}
	}

	// Read first, unlocked: an external step calls out before its transaction,
	// and a stale job needs no more than a no-op completion.
	inst, err := workflow.Get(ctx, e.rt.Pool(), e.job.Args.WorkflowID)
	if fault.Has(err, fault.NotFound) {
		return e.noop(ctx, "the workflow is gone (pruned)")
	}
	if err != nil {
		return err
	}
	if !e.runs(inst) {
		return e.noop(ctx, fmt.Sprintf("seq %d is stale (the workflow is at %d)", e.seq, inst.Seq))
	}
	if inst.Status.Finished() {
		return e.noop(ctx, "the workflow is "+string(inst.Status))
	}
	e.def, e.meta = e.w.p.def(inst.Kind)
	if e.def == nil {
		return e.fail(ctx, inst.Step, "", fmt.Sprintf("this worker does not define workflow kind %s", inst.Kind), nil)
	}
	ev, err := workflow.Decide(ctx, e.rt.Pool(), inst)
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

// runs reports whether this execution may advance inst, read unlocked: inst
// is at its seq, or, moved on by this job's own inline steps before a crash,
// still run by this job (the execution then resumes at inst's seq).
func (e *exec) runs(inst *workflow.Info) bool {
	if !inst.AdvancedBy(e.seq, e.job.ID) {
		return false
	}
	e.seq, e.step = inst.Seq, inst.Step
	return true
}

// attempt is the attempt of the current step: the job's for the step it
// starts with, the first for each step it runs inline.
func (e *exec) attempt() int {
	if e.n == 0 {
		return e.job.Attempt
	}
	return 1
}

// args are the current step's job args, as a job of its own would carry them.
func (e *exec) args() riverjob.WorkflowStep {
	a := e.job.Args
	a.Step, a.Seq = e.step, e.seq
	return a
}

// lock fences tx and locks the instance at the current seq, in one statement
// (workflow.LockFencedSQL); nil (and no error) when the job may no longer
// advance it (workflow.Locked). On a job's attempt after a crash in the
// middle of its inline steps, it moves the execution to the instance's seq.
func (e *exec) lock(ctx context.Context, tx pgx.Tx, f workers.Fence) (*workflow.Info, error) {
	id := e.job.Args.WorkflowID
	inst, err := workflow.Locked(tx.QueryRow(ctx, workflow.LockFencedSQL, append(f.Args(), id)...), id, e.seq, e.job.ID)
	e.lockedAt = time.Now()
	if got, err := jobs.FenceRaised(err); got != jobs.FenceHeld {
		return nil, f.Check(got, nil)
	} else if err != nil || inst == nil {
		return nil, err
	}
	e.seq = inst.Seq
	return inst, nil
}

// complete completes the job in tx, whose fence holds its row.
func (e *exec) complete(ctx context.Context, tx pgx.Tx) error {
	var id int64
	err := tx.QueryRow(ctx, riverjob.CompleteJobSQL, e.job.ID, time.Now(), string(e.jobMeta())).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return fault.New(fault.Fenced, "job %d: completion found it no longer running", e.job.ID)
	}
	if err != nil {
		return pg.Translate(fmt.Errorf("error completing job %d: %w", e.job.ID, err))
	}
	return nil
}

// jobMeta is what the job's completion merges into its metadata: the steps
// it ran, when it ran more than one.
func (e *exec) jobMeta() json.RawMessage {
	if len(e.ran) < 2 {
		return json.RawMessage(`{}`)
	}
	enc, _ := json.Marshal(map[string]any{JobStepsKey: e.ran})
	return enc
}

// finish completes the job in tx after the transition when route said so.
//
// The completion is a statement of its own after the transition's batch, not
// part of it: sent in the batch, a signal racing the step that commits an
// await could be lost (TestSignalsRacingAwaitsLoseNoWakeUp failed about one
// run in four under load that way; the cause was not found, so the order that
// holds is kept).
func (e *exec) finish(ctx context.Context, tx pgx.Tx) error {
	if !e.completes {
		return nil
	}
	return e.complete(ctx, tx)
}

// route decides, before t commits, where the step t moves to runs: inline,
// in this execution (the instance keeps this job, which stays running), when
// t goes at once to a step this process may run and the budget lasts; else
// in a job of its own, or nowhere, and this job completes in t's transaction,
// after t (finish).
//
// A tenant's workflow (jobs.TenantOf) whose tenant is suspended parks at the
// boundary: its next step gets a job of its own, which the fetch holds until
// the tenant resumes.
func (e *exec) route(ctx context.Context, tx pgx.Tx, f workers.Fence, t *workflow.Transition) {
	// e.ran holds the e.n steps committed; a transaction retried after a lost
	// connection routes its step again.
	e.ran = append(e.ran[:min(len(e.ran), e.n)], ranStep{Seq: e.seq, Step: e.step})
	e.completes = false
	o := e.w.p.options()
	inline := t.Job && (t.Status == workflow.Running || t.Status == workflow.Cancelling) &&
		t.Wait == nil && t.WakeAt == nil && len(t.Children) == 0 && !t.RunAt.After(time.Now()) &&
		e.n+1 < o.InlineSteps && time.Since(e.began) < o.InlineFor && ctx.Err() == nil && f.Holds(ctx) &&
		!tenantSuspended(ctx, tx)
	if inline {
		t.Job, t.KeepJob = false, e.job.ID
		return
	}
	e.completes = true
}

// committed moves the execution past a step whose transition t committed at
// newSeq: to the next step, inline, when t kept the job.
func (e *exec) committed(t workflow.Transition, newSeq int64) {
	e.n++
	if t.KeepJob != 0 {
		e.more, e.seq, e.step = true, newSeq, t.Step
	}
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

// transactional runs a transactional step: fence and lock, decide, run,
// advance (and complete the job, or keep it for the next step), in one fenced
// transaction.
func (e *exec) transactional(ctx context.Context, step workflow.StepMeta) error {
	var (
		outcome = "stale"
		status  workflow.Status
		ranStep = step.Name
		first   bool
		ext     *externalRun
		t       workflow.Transition
		newSeq  int64
	)
	err := workers.FencedTx(ctx, e.job, func(ctx context.Context, tx pgx.Tx, f workers.Fence) error {
		inst, err := e.lock(ctx, tx, f)
		if err != nil {
			return err
		}
		if inst == nil {
			return e.complete(ctx, tx) // stale: the job completes as a no-op
		}
		e.step = inst.Step
		ev, err := workflow.Decide(ctx, tx, inst)
		if err != nil {
			return err
		}
		e.linkSignal(ev)
		if ev.Rearm {
			outcome = "rearm"
			t = workflow.RearmTransition(inst, e.job.Queue, step.Retry.Attempts)
			if _, err := workflow.AdvanceTx(ctx, tx, inst, t); err != nil {
				return err
			}
			return e.complete(ctx, tx)
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
			e.w.p.afterStep(ctx, e.args())
		}
		t, err = workflow.Plan(e.meta, inst, ev, next, inv.NewState, e.job.Queue)
		if err != nil {
			return err
		}
		e.stamp(&t, inst)
		e.route(ctx, tx, f, &t)
		if newSeq, err = workflow.AdvanceTx(ctx, tx, inst, t); err != nil {
			return err
		}
		if err := e.finish(ctx, tx); err != nil {
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
	if outcome != "stale" && outcome != "rearm" {
		e.committed(t, newSeq)
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
		e.w.p.afterStep(ctx, e.args())
	}
	outcome := "stale"
	var (
		status workflow.Status
		t      workflow.Transition
		newSeq int64
	)
	err = workers.FencedTx(ctx, e.job, func(ctx context.Context, tx pgx.Tx, f workers.Fence) error {
		locked, err := e.lock(ctx, tx, f)
		if err != nil {
			return err
		}
		if locked == nil || locked.Seq != inst.Seq {
			outcome = "stale"
			return e.complete(ctx, tx)
		}
		t, err = workflow.Plan(e.meta, locked, ev, next, inv.NewState, e.job.Queue)
		if err != nil {
			return err
		}
		e.stamp(&t, locked)
		e.route(ctx, tx, f, &t)
		if newSeq, err = workflow.AdvanceTx(ctx, tx, locked, t); err != nil {
			return err
		}
		if err := e.finish(ctx, tx); err != nil {
			return err
		}
		outcome, status = t.Outcome, t.Status
		return nil
	})
	if err != nil {
		return e.failed(ctx, ev.Step, err)
	}
	if outcome != "stale" {
		e.committed(t, newSeq)
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
	t.Attempt, t.JobID, t.LeaseEpoch = e.attempt(), e.job.ID, e.l.Epoch
	t.StartedAt = inst.Now.Add(-e.lockedAt.Sub(e.start))
	t.CommittedAt = inst.Now.Add(time.Since(e.lockedAt))
}

// failed handles a step's error: FENCED goes back to the middleware (the job
// is given back); a state that no longer decodes fails the workflow and
// cancels the job; bad input (INVALID_ARGUMENT: a Next naming no step, a state
// over the limit) and a last attempt fail the workflow (or go to the step's
// OnError step); anything else is retried with the step's backoff: by River,
// for the step the job started with, or, for a step run inline, by a new job
// that counts this attempt (handOver).
func (e *exec) failed(ctx context.Context, step string, err error) error {
	sm, _ := e.meta.Step(step)
	attempts := sm.Retry.Attempts
	if attempts <= 0 {
		attempts = workflow.DefaultAttempts
	}
	last := e.attempt() >= attempts || (e.n == 0 && e.job.Attempt >= e.job.MaxAttempts)
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
		if e.n > 0 {
			return e.handOver(ctx, step, err)
		}
		return err
	}
	msg := fmt.Sprintf("step %s failed (attempt %d of %d): %s", step, e.attempt(), attempts, e.rt.Redact(err))
	return e.fail(ctx, step, sm.OnError, msg, nil)
}

// handOver gives the workflow, whose step run inline failed, to a new job
// for the same seq, retryable after the step's backoff with this attempt
// counted, and completes this job: the step then retries as if it had had a
// job of its own from the start.
func (e *exec) handOver(ctx context.Context, step string, cause error) error {
	sm, _ := e.meta.Step(step)
	attempts := sm.Retry.Attempts
	if attempts <= 0 {
		attempts = workflow.DefaultAttempts
	}
	now := time.Now()
	msg := fault.CleanText(e.rt.Redact(cause).Error())
	err := workers.FencedTx(ctx, e.job, func(ctx context.Context, tx pgx.Tx, f workers.Fence) error {
		if err := workers.FenceTx(ctx, tx, f.Lease, f.Job); err != nil {
			return err
		}
		var id int64
		err := tx.QueryRow(ctx, riverjob.HandOverWorkflowSQL, e.job.Args.WorkflowID, e.seq, e.job.ID,
			now.Add(sm.Retry.Delay(1)), msg, now, attempts, tracing.CauseOrNil(ctx)).Scan(&id)
		if errors.Is(err, pgx.ErrNoRows) {
			return e.complete(ctx, tx) // the workflow moved on without this job (a cancel)
		}
		return pg.Translate(err)
	})
	if err != nil {
		return err
	}
	log(e.rt).Debug().Str("workflow_id", e.job.Args.WorkflowID).Str("step", step).Int64("seq", e.seq).Err(cause).
		Msg("workflow step run inline failed; it retries in a job of its own")
	return nil
}

// fail moves the workflow to failed (or to onError) at the current seq, and
// completes the job (or keeps it, when the OnError step runs inline); with
// cause set it does not complete the job (the caller cancels it).
func (e *exec) fail(ctx context.Context, step, onError, msg string, cause error) error {
	var (
		status workflow.Status
		t      workflow.Transition
		newSeq int64
		moved  bool
	)
	err := workers.FencedTx(ctx, e.job, func(ctx context.Context, tx pgx.Tx, f workers.Fence) error {
		inst, err := e.lock(ctx, tx, f)
		if err != nil {
			return err
		}
		if inst == nil {
			if cause != nil {
				return nil
			}
			return e.complete(ctx, tx)
		}
		attempts := workflow.DefaultAttempts
		if s, ok := e.meta.Step(onError); ok && s.Retry.Attempts > 0 {
			attempts = s.Retry.Attempts
		}
		t = workflow.FailTransition(inst, step, onError, e.job.Queue, attempts, msg)
		e.stamp(&t, inst)
		if cause == nil {
			e.route(ctx, tx, f, &t)
		}
		if newSeq, err = workflow.AdvanceTx(ctx, tx, inst, t); err != nil {
			return err
		}
		if cause == nil {
			if err := e.finish(ctx, tx); err != nil {
				return err
			}
		}
		status, moved = t.Status, true
		return nil
	})
	if err != nil {
		return err
	}
	if moved {
		e.committed(t, newSeq)
	}
	log(e.rt).Warn().Str("workflow_id", e.job.Args.WorkflowID).Str("workflow", e.job.Args.Workflow).
		Str("step", step).Str("status", string(status)).Msg(msg)
	e.w.p.observe(e.job.Args.Workflow, step, "failed", time.Since(e.start), status, false)
	return nil
}

// rearm re-arms a wait whose event has not come, under the lock.
func (e *exec) rearm(ctx context.Context) error {
	err := workers.FencedTx(ctx, e.job, func(ctx context.Context, tx pgx.Tx, f workers.Fence) error {
		inst, err := e.lock(ctx, tx, f)
		if err != nil {
			return err
		}
		if inst == nil {
			return e.complete(ctx, tx)
		}
		ev, err := workflow.Decide(ctx, tx, inst)
		if err != nil {
			return err
		}
		t := workflow.RearmTransition(inst, e.job.Queue, e.retryOf(inst.Step).Attempts)
		if !ev.Rearm {
			t.RunAt = time.Now() // the event came meanwhile: run at once
		}
		if _, err := workflow.AdvanceTx(ctx, tx, inst, t); err != nil {
			return err
		}
		return e.complete(ctx, tx)
	})
	if err == nil {
		e.w.p.observe(e.job.Args.Workflow, e.step, "rearm", 0, "", false)
	}
	return err
}

func (e *exec) retryOf(step string) workflow.Retry { return e.w.retryOf(e.job.Args.Workflow, step) }

// noop completes a job that may no longer advance its workflow.
func (e *exec) noop(ctx context.Context, why string) error {
	err := workers.FencedTx(ctx, e.job, func(ctx context.Context, tx pgx.Tx, f workers.Fence) error {
		if err := workers.FenceTx(ctx, tx, f.Lease, f.Job); err != nil {
			return err
		}
		return e.complete(ctx, tx)
	})
	if err == nil {
		log(e.rt).Debug().Int64("job_id", e.job.ID).Str("workflow_id", e.job.Args.WorkflowID).Msg("workflow step job completed without effect: " + why)
		e.w.p.observe(e.job.Args.Workflow, e.step, "stale", 0, "", false)
	}
	return err
}

// tenantSuspendedSQL says whether tenant $1 is suspended.
const tenantSuspendedSQL = `SELECT EXISTS (SELECT 1 FROM compute_tenants WHERE name = $1 AND state = 'suspended')`

// tenantSuspended reports whether the tenant ctx names is suspended, read in
// tx (false for work of no tenant, without a statement). An error reads as
// suspended: the next step then gets a job of its own, as ever.
func tenantSuspended(ctx context.Context, tx pgx.Tx) bool {
	t := jobs.TenantOf(ctx)
	if t == "" {
		return false
	}
	var held bool
	if err := tx.QueryRow(ctx, tenantSuspendedSQL, t).Scan(&held); err != nil {
		return true
	}
	return held
}
