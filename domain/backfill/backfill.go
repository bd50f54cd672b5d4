// Package backfill is the state of backfills in the database: each one's row
// in compute_backfills (its state, epoch, counters, live job and last error),
// the operators' verbs on it (Start, Pause, Resume, Cancel) and what they read
// (Get, List). A batch's own transaction, which moves the counters, is the
// backfill module's worker's (workers/backfillworker); an application defines
// and registers a backfill with workers.AddBackfill. The states and the
// guarantees are in workers/backfillworker's package doc.
package backfill

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
)

// State is a backfill's state (see the package doc).
type State string

// The states of a backfill.
const (
	Pending   State = "pending" // never started
	Running   State = "running"
	Paused    State = "paused"
	Cancelled State = "cancelled"
	Done      State = "done"
)

// Progress is a backfill's row in compute_backfills, with its batch job as
// River has it now.
type Progress struct {
	Name  string `db:"name"`
	State State  `db:"state"`
	// Epoch goes up at every start, resume, pause and cancel.
	Epoch int64 `db:"epoch"`
	// Batches and RowsDone count the current run's committed batches (the last
	// one of a finished run found no rows) and the rows they handled.
	Batches       int64      `db:"batches"`
	RowsDone      int64      `db:"rows_done"`
	LastBatchAt   *time.Time `db:"last_batch_at"`
	LastBatchRows *int32     `db:"last_batch_rows"`
	LastBatchMS   *int32     `db:"last_batch_ms"`
	// RowsEstimate is RowsDone plus the rows left, as Estimate said at EstimatedAt.
	RowsEstimate *int64     `db:"rows_estimate"`
	EstimatedAt  *time.Time `db:"estimated_at"`
	// Rate is rows per second, smoothed over the last batches.
	Rate   *float64   `db:"rate"`
	RateAt *time.Time `db:"rate_at"`
	// JobID is the batch job that carries the run on: the one running its
	// batches, or the one that will run the next.
	JobID *int64 `db:"job_id"`
	// BatchSize is the rows the next batch asks for, as the sizing by time chose
	// it after the last batch (nil before the run's first batch).
	BatchSize *int32 `db:"batch_size"`
	// Errors counts the run's failed batch attempts; LastError is the last one's.
	Errors      int64      `db:"errors"`
	LastError   *string    `db:"last_error"`
	LastErrorAt *time.Time `db:"last_error_at"`
	StartedAt   *time.Time `db:"started_at"`
	FinishedAt  *time.Time `db:"finished_at"`
	CreatedAt   time.Time  `db:"created_at"`
	UpdatedAt   time.Time  `db:"updated_at"`

	// JobState is the River state of JobID's job (nil: no such job).
	JobState       *string    `db:"job_state"`
	JobAttempt     *int16     `db:"job_attempt"`
	JobMaxAttempts *int16     `db:"job_max_attempts"`
	JobScheduledAt *time.Time `db:"job_scheduled_at"`
	// Now is compute_now() when the row was read.
	Now time.Time `db:"now"`
}

// liveJobStates are River states of a job that will still run.
var liveJobStates = map[string]bool{"available": true, "scheduled": true, "running": true, "retryable": true, "pending": true}

// JobLive reports whether the backfill has a batch job that will still run.
func (p *Progress) JobLive() bool { return p.JobState != nil && liveJobStates[*p.JobState] }

// Stalled reports whether a running backfill has no live batch job (River
// discarded it after its last attempt, or an operator cancelled or deleted it):
// Resume carries it on.
func (p *Progress) Stalled() bool { return p.State == Running && !p.JobLive() }

// Left is the estimated number of rows left, if there is an estimate.
func (p *Progress) Left() (int64, bool) {
	if p.State == Done {
		return 0, true
	}
	if p.RowsEstimate == nil {
		return 0, false
	}
	return max(*p.RowsEstimate-p.RowsDone, 0), true
}

// Total is the estimated number of rows of the run (done plus left).
func (p *Progress) Total() (int64, bool) {
	left, ok := p.Left()
	return p.RowsDone + left, ok
}

// ETA is the estimated time to finish at the current rate, when both are known.
func (p *Progress) ETA() (time.Duration, bool) {
	left, ok := p.Left()
	if !ok || p.Rate == nil || *p.Rate <= 0 || p.State != Running {
		return 0, false
	}
	return time.Duration(float64(left) / *p.Rate * float64(time.Second)), true
}

// progressSQL is jobs.BackfillProgressSQL with where (on b, compute_backfills)
// appended, and the backfill's batch size added.
func progressSQL(where string) string {
	return `SELECT p.*, (SELECT s.batch_size FROM compute_backfills s WHERE s.name = p.name) AS batch_size
FROM (` + jobs.BackfillProgressSQL + where + `) p`
}

// checkName is INVALID_ARGUMENT for a backfill name an operator gave that is
// not valid UTF-8 or holds a NUL byte: the statement would fail with it.
func checkName(name string) error { return fault.CheckText("backfill name", name) }

// Get returns the progress of the backfill name: NOT_FOUND if it was never
// started, INVALID_ARGUMENT for a name that is not valid UTF-8 or holds a NUL
// byte.
func Get(ctx context.Context, db pg.DBTX, name string) (*Progress, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, progressSQL(` WHERE b.name = $1`), name)
	if err != nil {
		return nil, pg.Translate(fmt.Errorf("error reading backfill %s: %w", name, err))
	}
	p, err := pgx.CollectExactlyOneRow(rows, pgx.RowToAddrOfStructByName[Progress])
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fault.New(fault.NotFound, "backfill %s was never started", name)
	}
	if err != nil {
		return nil, pg.Translate(fmt.Errorf("error reading backfill %s: %w", name, err))
	}
	return p, nil
}

// List returns the progress of every backfill that was ever started, by name.
func List(ctx context.Context, db pg.DBTX) ([]*Progress, error) {
	rows, err := db.Query(ctx, progressSQL(``)+` ORDER BY p.name`)
	if err != nil {
		return nil, pg.Translate(fmt.Errorf("error listing backfills: %w", err))
	}
	out, err := pgx.CollectRows(rows, pgx.RowToAddrOfStructByName[Progress])
	if err != nil {
		return nil, pg.Translate(fmt.Errorf("error listing backfills: %w", err))
	}
	return out, nil
}

// advisoryKey is the first key of every backfill's transaction-level advisory
// lock, pg_advisory_xact_lock(advisoryKey, hashtext(name)) ("bfll"; the
// migrator's is 1650683248).
const advisoryKey = 0x62666c6c

// AdvisoryLockSQL takes the advisory lock of the backfill named $1 for the
// transaction: shared (a batch) or exclusive (an operator's verb). PostgreSQL
// queues a request behind a waiting one that it conflicts with, so a batch
// started while a verb waits runs after the verb.
func AdvisoryLockSQL(shared bool) string {
	f := "pg_advisory_xact_lock"
	if shared {
		f += "_shared"
	}
	return fmt.Sprintf("SELECT %s(%d, hashtext($1))", f, advisoryKey)
}

// lockRow locks the backfill's row FOR UPDATE and returns its state, epoch and
// job. With create, a missing row is created (pending) first; without, a missing
// row is NOT_FOUND.
func lockRow(ctx context.Context, tx pgx.Tx, name string, create bool) (*Progress, error) {
	// The advisory lock first: it waits for the batch in flight (which holds it
	// shared), and the drain's next batch waits behind it.
	if _, err := tx.Exec(ctx, AdvisoryLockSQL(false), name); err != nil {
		return nil, pg.Translate(fmt.Errorf("error locking backfill %s: %w", name, err))
	}
	if create {
		if _, err := tx.Exec(ctx, `INSERT INTO compute_backfills (name) VALUES ($1) ON CONFLICT (name) DO NOTHING`, name); err != nil {
			return nil, pg.Translate(fmt.Errorf("error creating backfill %s: %w", name, err))
		}
	}
	p := &Progress{Name: name}
	var jobState *string
	err := tx.QueryRow(ctx, jobs.BackfillLockSQL, name).Scan(&p.State, &p.Epoch, &p.Batches, &p.JobID, &jobState)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fault.New(fault.NotFound, "backfill %s was never started", name)
	}
	if err != nil {
		return nil, pg.Translate(fmt.Errorf("error locking backfill %s: %w", name, err))
	}
	p.JobState = jobState
	return p, nil
}

// Start starts the backfill name: a new run from zero counters, its first
// batch enqueued. estimate, optional, gives the rows left for the progress
// (the backfill's Estimate). It returns CONFLICT when it is running or paused
// (Resume a paused one). A done or cancelled backfill starts again.
func Start(ctx context.Context, db pg.DBTX, name string, estimate func(ctx context.Context, db pg.DBTX) (int64, error)) (*Progress, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	b := struct {
		Name     string
		Estimate func(ctx context.Context, db pg.DBTX) (int64, error)
	}{name, estimate}
	var out *Progress
	err := pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
		p, err := lockRow(ctx, tx, b.Name, true)
		if err != nil {
			return err
		}
		switch p.State {
		case Running:
			return fault.New(fault.Conflict, "backfill %s is already running (batch %d)", b.Name, p.Batches)
		case Paused:
			return fault.New(fault.Conflict, "backfill %s is paused: resume it, or cancel it and start again", b.Name)
		}
		var estimate *int64
		if b.Estimate != nil {
			left, err := b.Estimate(ctx, tx)
			if err != nil {
				return fmt.Errorf("error estimating backfill %s: %w", b.Name, err)
			}
			estimate = &left
		}
		epoch := p.Epoch + 1
		jobID, err := InsertJobTx(ctx, tx, jobs.BackfillBatch{Name: b.Name, Epoch: epoch, Batch: 0}, 0)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `
UPDATE compute_backfills SET
    state = 'running', epoch = $2, batches = 0, rows_done = 0,
    last_batch_at = NULL, last_batch_rows = NULL, last_batch_ms = NULL,
    rows_estimate = $3, estimated_at = CASE WHEN $3::bigint IS NULL THEN NULL ELSE compute_now() END,
    rate = NULL, rate_at = compute_now(), job_id = $4, batch_size = NULL,
    errors = 0, last_error = NULL, last_error_at = NULL,
    started_at = compute_now(), finished_at = NULL, updated_at = compute_now()
WHERE name = $1`, b.Name, epoch, estimate, jobID)
		if err != nil {
			return pg.Translate(fmt.Errorf("error starting backfill %s: %w", b.Name, err))
		}
		out, err = Get(ctx, tx, b.Name)
		return err
	})
	return out, err
}

// Resume carries a paused backfill on from where it stopped, or a running one
// whose batch job is dead (discarded after its last attempt, or cancelled or
// deleted by an operator). It returns CONFLICT for a running backfill whose job
// is alive and for one that is not paused or running, NOT_FOUND for one never
// started, INVALID_ARGUMENT for a name that is not valid UTF-8 or holds a NUL
// byte (as Pause and Cancel).
func Resume(ctx context.Context, db pg.DBTX, name string) (*Progress, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	var out *Progress
	err := pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
		p, err := lockRow(ctx, tx, name, false)
		if err != nil {
			return err
		}
		switch {
		case p.State == Paused:
		case p.State == Running && p.JobLive():
			// JobLive: the job's row was read, so its id and state are set.
			return fault.New(fault.Conflict, "backfill %s is running (its job %d is %s): nothing to resume", name, *p.JobID, *p.JobState)
		case p.State == Running:
			// Stalled: its job is gone; a new epoch fences any straggler.
		case p.State == Pending:
			return fault.New(fault.Conflict, "backfill %s was never started: start it", name)
		default:
			return fault.New(fault.Conflict, "backfill %s is %s: start runs it again", name, p.State)
		}
		epoch := p.Epoch + 1
		jobID, err := InsertJobTx(ctx, tx, jobs.BackfillBatch{Name: name, Epoch: epoch, Batch: p.Batches}, 0)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `
UPDATE compute_backfills SET state = 'running', epoch = $2, job_id = $3,
    rate_at = compute_now(), updated_at = compute_now()
WHERE name = $1`, name, epoch, jobID)
		if err != nil {
			return pg.Translate(fmt.Errorf("error resuming backfill %s: %w", name, err))
		}
		out, err = Get(ctx, tx, name)
		return err
	})
	return out, err
}

// Pause stops a running backfill at the next batch boundary: it waits for the
// batch in flight to commit, and no batch starts after it returns. Pausing a
// paused backfill changes nothing. It returns CONFLICT for a backfill that is
// not running, NOT_FOUND for one never started.
func Pause(ctx context.Context, db pg.DBTX, name string) (*Progress, error) {
	return stop(ctx, db, name, Paused)
}

// Cancel stops a running or paused backfill for good at the next batch boundary
// (like Pause); Start runs it again from zero counters. Cancelling a cancelled
// backfill changes nothing. It returns CONFLICT for a pending or done backfill,
// NOT_FOUND for one never started.
func Cancel(ctx context.Context, db pg.DBTX, name string) (*Progress, error) {
	return stop(ctx, db, name, Cancelled)
}

func stop(ctx context.Context, db pg.DBTX, name string, to State) (*Progress, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	var out *Progress
	err := pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
		p, err := lockRow(ctx, tx, name, false)
		if err != nil {
			return err
		}
		switch {
		case p.State == to:
			out, err = Get(ctx, tx, name)
			return err
		case p.State == Running, p.State == Paused && to == Cancelled:
		case to == Paused:
			return fault.New(fault.Conflict, "backfill %s is %s: only a running backfill pauses", name, p.State)
		default:
			return fault.New(fault.Conflict, "backfill %s is %s: only a running or paused backfill is cancelled", name, p.State)
		}
		// The row lock waited for the batch in flight. The next batch's job, if
		// it is waiting, is cancelled in River; one that is already running finds
		// the new epoch behind this lock and completes doing nothing.
		if p.JobID != nil {
			if err := cancelWaitingJobTx(ctx, tx, *p.JobID, fmt.Sprintf("backfill %s was %s by an operator", name, verbOf(to))); err != nil {
				return err
			}
		}
		_, err = tx.Exec(ctx, `
UPDATE compute_backfills SET state = $2, epoch = epoch + 1,
    finished_at = CASE WHEN $2 = 'cancelled' THEN compute_now() ELSE finished_at END,
    updated_at = compute_now()
WHERE name = $1`, name, string(to))
		if err != nil {
			return pg.Translate(fmt.Errorf("error stopping backfill %s: %w", name, err))
		}
		out, err = Get(ctx, tx, name)
		return err
	})
	return out, err
}

func verbOf(s State) string {
	if s == Paused {
		return "paused"
	}
	return "cancelled"
}

// cancelWaitingJobTx cancels the River job id if it is waiting to run. It skips
// a job whose row is locked (being fetched, or running a batch): taking that
// lock while holding the backfill's row would invert the batch transaction's
// lock order (job, then backfill) and could deadlock; such a job finds the new
// epoch and completes doing nothing.
func cancelWaitingJobTx(ctx context.Context, tx pgx.Tx, id int64, why string) error {
	_, err := jobs.CancelWaitingTx(ctx, tx, id, time.Now(), why)
	if err != nil {
		return pg.Translate(fmt.Errorf("error cancelling job %d: %w", id, err))
	}
	return nil
}

// InsertJobTx inserts the batch job args into the backfill's shard queue, to run
// after delay, and returns its id.
func InsertJobTx(ctx context.Context, tx pgx.Tx, args jobs.BackfillBatch, delay time.Duration) (int64, error) {
	queue, err := jobs.ShardQueueOfTx(ctx, tx, jobs.BackfillShardKey(args.Name))
	if err != nil {
		return 0, pg.Translate(fmt.Errorf("error reading the shard count: %w", err))
	}
	id, err := jobs.InsertBackfillTx(ctx, tx, args, queue, delay)
	if err != nil {
		return 0, pg.Translate(fmt.Errorf("error enqueueing backfill %s batch %d: %w", args.Name, args.Batch, err))
	}
	return id, nil
}
