package workers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/workers/internal/riverjob"
)

type runtimeKey struct{}

func runtimeFrom(ctx context.Context) *Runtime {
	rt, _ := ctx.Value(runtimeKey{}).(*Runtime)
	return rt
}

// RuntimeFrom returns the Runtime working the job whose context ctx is.
func RuntimeFrom(ctx context.Context) *Runtime { return runtimeFrom(ctx) }

// jobMiddleware puts the runtime in every job's context, tracks the job so a lost
// lease can cancel it, and turns errors into River outcomes in one place.
type jobMiddleware struct {
	river.MiddlewareDefaults
	rt *Runtime
}

// fencedSnooze is how long a fenced job waits before the lease holder runs it.
const fencedSnooze = time.Second

func (m *jobMiddleware) Work(ctx context.Context, job *rivertype.JobRow, doInner func(ctx context.Context) error) error {
	ctx = context.WithValue(ctx, runtimeKey{}, m.rt)
	if t := jobs.TenantOfMetadata(job.Metadata); t != "" {
		ctx = jobs.WithTenant(ctx, t) // the job's work is its tenant's, and so is what it enqueues
	}
	ctx, cancel := context.WithCancelCause(ctx)
	m.rt.track(job.Queue, job.ID, cancel)
	defer func() {
		m.rt.untrack(job.Queue, job.ID)
		cancel(nil)
	}()

	start := time.Now()
	_, isShard := shardOfQueue(job.Queue)
	held := func() bool { _, ok := m.rt.leaseForQueue(job.Queue); return ok }
	l, heldAtStart := m.rt.leaseForQueue(job.Queue) // the lease the job's span names
	var err error
	if isShard && !heldAtStart {
		// Fetched after the lease was lost (a paused process that woke: River's
		// fetch is not fenced): not started, given back to the holder.
		err = fault.New(fault.Fenced, "job %d not started: this process no longer holds the lease of %s", job.ID, job.Queue)
		fencedEvent(ctx, m.rt, job.Queue, 0, err)
	} else {
		err = doInner(ctx)
	}
	switch {
	case err == nil || fault.Has(err, fault.Fenced):
	case ctx.Err() != nil && fault.Has(context.Cause(ctx), fault.Fenced):
		err = fault.Wrap(fault.Fenced, err, "cancelled: %v", context.Cause(ctx))
		fencedEvent(ctx, m.rt, job.Queue, l.Epoch, err)
	case isShard && !held():
		// Whatever failed (a paused process's transaction ended by the server, a
		// connection closed under it), this attempt is stale now: its lease is
		// gone and the holder may be running the job already. River's completer
		// checks only state = 'running', so a retry with backoff recorded here
		// would hold the holder's job back for minutes; a short snooze does not.
		err = fault.Wrap(fault.Fenced, err, "this process lost the lease of %s during the job", job.Queue)
		fencedEvent(ctx, m.rt, job.Queue, l.Epoch, err)
	}
	out := m.rt.outcome(job, err)
	traceJob(ctx, job, l, heldAtStart, out, err)
	m.rt.metrics.jobDone(job.Kind, job.Queue, outcomeName(out, err), time.Since(start))
	if fault.Has(err, fault.Fenced) {
		m.rt.waitOutLiveAttempt(ctx, job)
	}
	return out
}

// staleWaitPoll bounds how often a fenced attempt checks whether another
// attempt of its job still runs.
const staleWaitPoll = time.Second

// waitOutLiveAttempt holds a fenced attempt's outcome back while another
// attempt of the same job runs. River's completer records an outcome by job id
// with only state = 'running' as its check: a stale attempt's snooze, recorded
// while the live attempt runs, would snooze the live one, whose commit would
// then be fenced in turn and its work done again. So the stale attempt waits,
// holding no connection between checks, until no other attempt of its job is
// running (the live one finished or gave the job back), and then its outcome
// changes nothing. The wait ends early when the runtime stops waiting for jobs
// (the stop grace is over), after the job timeout, or when the database cannot
// be asked.
func (rt *Runtime) waitOutLiveAttempt(ctx context.Context, job *rivertype.JobRow) {
	if job.AttemptedAt == nil {
		return
	}
	deadline := time.NewTimer(rt.o.jobTimeout())
	defer deadline.Stop()
	wait := 50 * time.Millisecond
	for logged := false; ; {
		qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		other, err := riverjob.AnotherAttemptRunning(qctx, rt.pool, job.ID, job.Attempt, *job.AttemptedAt)
		cancel()
		if err != nil || !other {
			return
		}
		if !logged {
			rt.log.Info().Int64("job_id", job.ID).Int("attempt", job.Attempt).
				Msg("fenced attempt waits for the job's live attempt to finish before giving the job back")
			logged = true
		}
		select {
		case <-time.After(wait):
		case <-rt.hardStop:
			return
		case <-deadline.C:
			return
		}
		wait = min(2*wait, staleWaitPoll)
	}
}

// outcome maps a worker's error to what River should do with the job.
func (rt *Runtime) outcome(job *rivertype.JobRow, err error) error {
	if err == nil {
		return nil
	}
	var (
		syntaxErr *json.SyntaxError
		typeErr   *json.UnmarshalTypeError
		cancelErr *rivertype.JobCancelError
		snoozeErr *rivertype.JobSnoozeError
	)
	switch {
	case errors.As(err, &snoozeErr):
		return err // the worker decided
	case errors.As(err, &cancelErr):
		// The worker decided; River records the cause, redacted and storable.
		if cause := errors.Unwrap(cancelErr); cause != nil {
			if clean := rt.redactErr(cause); clean.Error() != cause.Error() {
				return river.JobCancel(clean)
			}
		}
		return err
	case errors.As(err, &syntaxErr), errors.As(err, &typeErr):
		rt.log.Error().Err(err).Int64("job_id", job.ID).Str("kind", job.Kind).Msg("job args do not decode: cancelled")
		return river.JobCancel(fault.Wrap(fault.InvalidArgument, rt.redactErr(err), "job args do not decode"))
	case fault.Has(err, fault.InvalidArgument):
		rt.log.Error().Err(err).Int64("job_id", job.ID).Str("kind", job.Kind).Msg("job cannot be worked: cancelled")
		return river.JobCancel(rt.redactErr(err))
	case fault.Has(err, fault.Fenced):
		rt.log.Warn().Err(err).Int64("job_id", job.ID).Str("queue", job.Queue).Msg("job fenced: given back")
		return river.JobSnooze(fencedSnooze)
	}
	return rt.redactErr(err)
}

// redactErr returns err with every configured secret removed from its message,
// and the message storable (fault.CleanText): River records it in river_job's
// jsonb errors, and one NUL byte in it would fail River's whole batch of
// completions, leaving the jobs running. The result keeps err's code for
// logging but not its chain (the chain would carry the secret).
func (rt *Runtime) redactErr(err error) error {
	msg := err.Error()
	clean := fault.CleanText(msg)
	for _, s := range rt.o.Secrets {
		if s != "" {
			clean = strings.ReplaceAll(clean, s, "xxxxx")
		}
	}
	if clean == msg {
		return err
	}
	return &fault.Error{Code: fault.CodeOf(err), Message: strings.TrimPrefix(clean, string(fault.CodeOf(err))+": ")}
}

func outcomeName(out, err error) string {
	var (
		cancelErr *rivertype.JobCancelError
		snoozeErr *rivertype.JobSnoozeError
	)
	switch {
	case out == nil:
		return "completed"
	case fault.Has(err, fault.Fenced):
		return "fenced"
	case errors.As(out, &cancelErr):
		return "cancelled"
	case errors.As(out, &snoozeErr):
		return "snoozed"
	default:
		return "failed"
	}
}

// errorHandler logs panics (River records them and retries the job).
type errorHandler struct{ rt *Runtime }

func (h *errorHandler) HandleError(ctx context.Context, job *rivertype.JobRow, err error) *river.ErrorHandlerResult {
	if !fault.Has(err, fault.Fenced) {
		h.rt.log.Warn().Err(err).Int64("job_id", job.ID).Str("kind", job.Kind).Int("attempt", job.Attempt).Msg("job failed; River retries it with backoff")
	}
	return nil
}

func (h *errorHandler) HandlePanic(ctx context.Context, job *rivertype.JobRow, panicVal any, trace string) *river.ErrorHandlerResult {
	h.rt.log.Error().Str("panic", fmt.Sprint(panicVal)).Int64("job_id", job.ID).Str("kind", job.Kind).Int("attempt", job.Attempt).Msg("job panicked: this attempt failed, River retries it")
	h.rt.metrics.jobDone(job.Kind, job.Queue, "panicked", 0)
	return nil
}
