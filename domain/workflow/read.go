package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
)

// Get returns workflow id (NOT_FOUND if there is none).
func Get(ctx context.Context, db pg.DBTX, id string) (*Info, error) {
	if err := ValidateID(id); err != nil {
		return nil, err
	}
	i, err := scanInfo(db.QueryRow(ctx, `SELECT `+readColumns+` FROM compute_workflows w WHERE w.id = $1`, id), true)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fault.New(fault.NotFound, "no workflow %s", id)
	}
	if err != nil {
		return nil, pg.Translate(fmt.Errorf("error reading workflow %s: %w", id, err))
	}
	return i, nil
}

// ListOpts filter and page List.
type ListOpts struct {
	Kind   string
	Status Status
	// Limit is at most 1000 (default 100).
	Limit int
	// Before, for the next page: only workflows created before this one.
	Before string
	// Tenant keeps only the tenant's workflows ("": every workflow's).
	Tenant string
}

// List returns workflows, newest first, filtered by kind, status and tenant.
func List(ctx context.Context, db pg.DBTX, o ListOpts) ([]Info, error) {
	if o.Limit <= 0 {
		o.Limit = 100
	}
	if o.Limit > 1000 {
		o.Limit = 1000
	}
	if o.Status != "" && !validStatus(o.Status) {
		return nil, fault.New(fault.InvalidArgument, "unknown workflow status %q (one of %s)", o.Status, statusList())
	}
	if err := fault.CheckText("list workflows: kind", o.Kind); err != nil {
		return nil, err
	}
	if err := fault.CheckText("list workflows: before", o.Before); err != nil {
		return nil, err
	}
	if err := fault.CheckText("list workflows: tenant", o.Tenant); err != nil {
		return nil, err
	}
	var before any
	if o.Before != "" {
		before = o.Before
	}
	rows, err := db.Query(ctx, `SELECT `+readColumns+` FROM compute_workflows w
WHERE ($1 = '' OR w.kind = $1) AND ($2 = '' OR w.status = $2) AND ($5 = '' OR w.tenant = $5)
  AND ($3::text IS NULL OR (w.created_at, w.id) < (SELECT b.created_at, b.id FROM compute_workflows b WHERE b.id = $3))
ORDER BY w.created_at DESC, w.id DESC LIMIT $4`, o.Kind, string(o.Status), before, o.Limit, o.Tenant)
	if err != nil {
		return nil, pg.Translate(fmt.Errorf("error listing workflows: %w", err))
	}
	defer rows.Close()
	var out []Info
	for rows.Next() {
		i, err := scanInfo(rows, true)
		if err != nil {
			return nil, pg.Translate(err)
		}
		out = append(out, *i)
	}
	return out, pg.Translate(rows.Err())
}

func validStatus(s Status) bool {
	for _, x := range Statuses {
		if x == s {
			return true
		}
	}
	return false
}

func statusList() string {
	var b []string
	for _, s := range Statuses {
		b = append(b, string(s))
	}
	return strings.Join(b, ", ")
}

// ParseStatus returns the status named s (INVALID_ARGUMENT for another).
func ParseStatus(s string) (Status, error) {
	if !validStatus(Status(s)) {
		return "", fault.New(fault.InvalidArgument, "unknown workflow status %q (one of %s)", s, statusList())
	}
	return Status(s), nil
}

// HistoryRow is one committed step of a workflow (or its cancel, retry).
type HistoryRow struct {
	Seq         int64     `json:"seq"`
	Step        string    `json:"step"`
	Outcome     string    `json:"outcome"`
	NextStep    string    `json:"next_step,omitempty"`
	Attempt     int       `json:"attempt"`
	JobID       *int64    `json:"job_id,omitempty"`
	LeaseEpoch  *int64    `json:"lease_epoch,omitempty"`
	StartedAt   time.Time `json:"started_at"`
	CommittedAt time.Time `json:"committed_at"`
	Error       string    `json:"error,omitempty"`
	// Took is CommittedAt - StartedAt, in seconds.
	Took *float64 `json:"took_seconds,omitempty"`
}

// History returns workflow id's history, oldest first (NOT_FOUND for no
// workflow).
func History(ctx context.Context, db pg.DBTX, id string) ([]HistoryRow, error) {
	if _, err := Get(ctx, db, id); err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, `SELECT seq, step, outcome, coalesce(next_step, ''), attempt, job_id, lease_epoch,
       started_at, committed_at, coalesce(error, '')
FROM compute_workflow_history WHERE workflow_id = $1 ORDER BY seq`, id)
	if err != nil {
		return nil, pg.Translate(fmt.Errorf("error reading the history of workflow %s: %w", id, err))
	}
	defer rows.Close()
	var out []HistoryRow
	for rows.Next() {
		var h HistoryRow
		if err := rows.Scan(&h.Seq, &h.Step, &h.Outcome, &h.NextStep, &h.Attempt, &h.JobID, &h.LeaseEpoch,
			&h.StartedAt, &h.CommittedAt, &h.Error); err != nil {
			return nil, pg.Translate(err)
		}
		took := h.CommittedAt.Sub(h.StartedAt).Seconds()
		h.Took = &took
		out = append(out, h)
	}
	return out, pg.Translate(rows.Err())
}

// Wait polls workflow id every poll (default 100 ms) until it has finished, and
// returns it; it holds no connection between polls (PgBouncer-safe). It returns
// ctx's error when ctx ends first.
func Wait(ctx context.Context, db pg.DBTX, id string, poll time.Duration) (*Info, error) {
	if poll <= 0 {
		poll = 100 * time.Millisecond
	}
	for {
		i, err := Get(ctx, db, id)
		if err != nil {
			return nil, err
		}
		if i.Status.Finished() {
			return i, nil
		}
		select {
		case <-ctx.Done():
			return nil, fault.Wrap(fault.Unavailable, ctx.Err(), "workflow %s is still %s", id, i.Status)
		case <-time.After(poll):
		}
	}
}

// Wait waits for workflow id (see the package's Wait) and returns its result:
// a workflow that failed or was cancelled returns its error (CONFLICT, with the
// workflow's error in the message).
func (w *Workflow[In, S, Out]) Wait(ctx context.Context, db pg.DBTX, id string, poll time.Duration) (Out, error) {
	var out Out
	i, err := Wait(ctx, db, id, poll)
	if err != nil {
		return out, err
	}
	if i.Status != Completed {
		return out, fault.New(fault.Conflict, "workflow %s %s: %s", id, i.Status, i.Error)
	}
	if len(i.Result) > 0 {
		if err := json.Unmarshal(i.Result, &out); err != nil {
			return out, fault.Wrap(fault.InvalidArgument, err, "the result of workflow %s does not decode", id)
		}
	}
	return out, nil
}

// RecordKinds records definitions in compute_workflow_kinds (migrate and every
// worker start do), so StartTx and SignalTx of any process can check kinds and
// signal names. The latest recording of a kind wins.
func RecordKinds(ctx context.Context, db pg.DBTX, metas []Meta) error {
	for _, m := range metas {
		steps := make([]string, len(m.Steps))
		for i, s := range m.Steps {
			steps[i] = s.Name
		}
		signals := m.Signals
		if signals == nil {
			signals = []string{}
		}
		var comp any
		if m.Compensate != "" {
			comp = m.Compensate
		}
		_, err := db.Exec(ctx, `INSERT INTO compute_workflow_kinds (kind, steps, signals, compensate)
VALUES ($1, $2, $3, $4)
ON CONFLICT (kind) DO UPDATE SET steps = EXCLUDED.steps, signals = EXCLUDED.signals,
    compensate = EXCLUDED.compensate, recorded_at = compute_now()`, m.Kind, steps, signals, comp)
		if err != nil {
			return pg.Translate(fmt.Errorf("error recording workflow kind %s: %w", m.Kind, err))
		}
	}
	return nil
}

// stranded is an unfinished workflow that sits on a step no definition has.
type stranded struct {
	ID, Kind, Step string
}

// findStranded returns up to 20 unfinished workflows (running, sleeping,
// waiting, cancelling, or failed, which RetryTx resumes) whose kind or step
// (or await's timeout step) is not among metas, and how many there are.
func findStranded(ctx context.Context, db pg.DBTX, metas []Meta) ([]stranded, int, error) {
	var kinds, steps []string
	for _, m := range metas {
		for _, s := range m.Steps {
			kinds, steps = append(kinds, m.Kind), append(steps, s.Name)
		}
	}
	rows, err := db.Query(ctx, `
WITH d AS (SELECT * FROM unnest($1::text[], $2::text[]) AS d(kind, step)),
s AS (
    SELECT w.id, w.kind, CASE WHEN NOT EXISTS (SELECT 1 FROM d WHERE d.kind = w.kind AND d.step = w.step)
                              THEN w.step ELSE w.wait->>'timeout_step' END AS step
    FROM compute_workflows w
    WHERE w.status IN ('running', 'sleeping', 'waiting', 'cancelling', 'failed')
      AND (NOT EXISTS (SELECT 1 FROM d WHERE d.kind = w.kind AND d.step = w.step)
           OR (w.wait->>'timeout_step' IS NOT NULL
               AND NOT EXISTS (SELECT 1 FROM d WHERE d.kind = w.kind AND d.step = w.wait->>'timeout_step')))
)
SELECT id, kind, step, count(*) OVER () FROM s ORDER BY kind, step, id LIMIT 20`, kinds, steps)
	if err != nil {
		return nil, 0, pg.Translate(fmt.Errorf("error checking unfinished workflows against the definitions: %w", err))
	}
	defer rows.Close()
	var out []stranded
	total := 0
	for rows.Next() {
		var s stranded
		if err := rows.Scan(&s.ID, &s.Kind, &s.Step, &total); err != nil {
			return nil, 0, pg.Translate(err)
		}
		out = append(out, s)
	}
	return out, total, pg.Translate(rows.Err())
}

// CheckDefinitions returns INVALID_CONFIG naming the unfinished workflows that
// sit on a step metas lack (FindStranded): a worker with these definitions
// would strand them.
func CheckDefinitions(ctx context.Context, db pg.DBTX, metas []Meta) error {
	st, total, err := findStranded(ctx, db, metas)
	if err != nil || total == 0 {
		return err
	}
	var b strings.Builder
	for i, s := range st {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s (%s at step %s)", s.ID, s.Kind, s.Step)
	}
	if total > len(st) {
		fmt.Fprintf(&b, " and %d more", total-len(st))
	}
	return fault.New(fault.InvalidConfig, "%d unfinished workflows sit on a step this binary does not define, and would never finish: %s; deploy definitions that keep these steps (or cancel the workflows) first", total, b.String())
}

// Prune deletes finished workflows (and their history and signals) that
// finished more than retention ago on compute_now(), batch at a time (default
// 1000) until none is left, and returns how many it deleted.
func Prune(ctx context.Context, db pg.DBTX, retention time.Duration, batch int) (int64, error) {
	if batch <= 0 {
		batch = 1000
	}
	var total int64
	for {
		tag, err := db.Exec(ctx, `DELETE FROM compute_workflows WHERE id IN (
    SELECT id FROM compute_workflows
    WHERE finished_at < compute_now() - make_interval(secs => $1::double precision)
    ORDER BY finished_at LIMIT $2)`, retention.Seconds(), batch)
		if err != nil {
			return total, pg.Translate(fmt.Errorf("error pruning finished workflows: %w", err))
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(batch) || ctx.Err() != nil {
			return total, nil
		}
	}
}

// WakeDue makes due the jobs of sleeping and waiting workflows whose wake_at
// has come on compute_now(), and returns how many.
func WakeDue(ctx context.Context, db pg.DBTX) (int64, error) {
	tag, err := db.Exec(ctx, jobs.WakeDueWorkflowsSQL, time.Now())
	if err != nil {
		return 0, pg.Translate(fmt.Errorf("error waking due workflows: %w", err))
	}
	return tag.RowsAffected(), nil
}

// Counts are the workflows by kind and status, and the signals waiting in
// inboxes, for metrics.
type Counts struct {
	ByKindStatus   map[[2]string]int64
	SignalsWaiting int64
}

// Count reads Counts.
func Count(ctx context.Context, db pg.DBTX) (Counts, error) {
	c := Counts{ByKindStatus: map[[2]string]int64{}}
	rows, err := db.Query(ctx, `SELECT kind, status, count(*) FROM compute_workflows GROUP BY 1, 2`)
	if err != nil {
		return c, pg.Translate(err)
	}
	for rows.Next() {
		var k, s string
		var n int64
		if err := rows.Scan(&k, &s, &n); err != nil {
			rows.Close()
			return c, pg.Translate(err)
		}
		c.ByKindStatus[[2]string{k, s}] = n
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return c, pg.Translate(err)
	}
	err = db.QueryRow(ctx, `SELECT count(*) FROM compute_workflow_signals WHERE consumed_at IS NULL`).Scan(&c.SignalsWaiting)
	return c, pg.Translate(err)
}

// Stuck is an unfinished workflow whose step job is not live.
type Stuck struct {
	ID, Kind, Step string
	JobID          int64
	// JobState is the job's River state, or "missing" (deleted).
	JobState string
}

// FindStuck returns up to 10 unfinished workflows whose step job is not live
// (cancelled, discarded or deleted by hand, in River UI say), oldest first, and
// how many there are: they never advance until RetryTx gives them a new job.
func FindStuck(ctx context.Context, db pg.DBTX) ([]Stuck, int, error) {
	rows, err := db.Query(ctx, jobs.StuckWorkflowsSQL)
	if err != nil {
		return nil, 0, pg.Translate(fmt.Errorf("error looking for workflows without a live step job: %w", err))
	}
	defer rows.Close()
	var out []Stuck
	total := 0
	for rows.Next() {
		var s Stuck
		if err := rows.Scan(&s.ID, &s.Kind, &s.Step, &s.JobID, &s.JobState, &total); err != nil {
			return nil, 0, pg.Translate(err)
		}
		out = append(out, s)
	}
	return out, total, pg.Translate(rows.Err())
}
