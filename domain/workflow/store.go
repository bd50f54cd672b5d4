package workflow

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/tracing"
)

// MaxPayload is the largest input, state, result or signal payload, encoded as
// JSON, that a workflow takes (INVALID_ARGUMENT past it).
const MaxPayload = 256 << 10

// Info is a workflow instance as stored.
type Info struct {
	ID         string          `json:"id"`
	Kind       string          `json:"kind"`
	Status     Status          `json:"status"`
	Step       string          `json:"step"`
	Seq        int64           `json:"seq"`
	JobID      *int64          `json:"job_id,omitempty"`
	Input      json.RawMessage `json:"input"`
	State      json.RawMessage `json:"state,omitempty"`
	Result     json.RawMessage `json:"result,omitempty"`
	Error      string          `json:"error,omitempty"`
	Wait       *WaitSpec       `json:"wait,omitempty"`
	WakeAt     *time.Time      `json:"wake_at,omitempty"`
	ParentID   string          `json:"parent_id,omitempty"`
	ParentSeq  int64           `json:"parent_seq,omitempty"`
	CreatedAt  time.Time       `json:"created_at"`
	UpdatedAt  time.Time       `json:"updated_at"`
	FinishedAt *time.Time      `json:"finished_at,omitempty"`
	// Tenant is the tenant the workflow's work is done for ("" for none); set
	// by Get and List.
	Tenant string `json:"tenant,omitempty"`
	// Now is compute_now() when the row was read.
	Now time.Time `json:"-"`
}

// WaitSpec is what a waiting instance waits for.
type WaitSpec struct {
	Signal      string `json:"signal,omitempty"`
	Children    string `json:"children,omitempty"` // all or any
	Since       int64  `json:"since,omitempty"`    // the parent seq its children carry
	TimeoutStep string `json:"timeout_step,omitempty"`
}

const infoColumns = `w.id, w.kind, w.status, w.step, w.seq, w.job_id, w.input, w.state, w.result,
       coalesce(w.error, ''), w.wait, w.wake_at, coalesce(w.parent_id, ''), coalesce(w.parent_seq, 0),
       w.created_at, w.updated_at, w.finished_at, compute_now()`

// readColumns are infoColumns and the tenant, for scanInfo(row, true).
const readColumns = infoColumns + `, coalesce(w.tenant, '')`

// scanInfo scans infoColumns, or readColumns withTenant.
func scanInfo(row pgx.Row, withTenant ...bool) (*Info, error) {
	var (
		i      Info
		status string
		wait   []byte
	)
	dest := []any{&i.ID, &i.Kind, &status, &i.Step, &i.Seq, &i.JobID, &i.Input, &i.State, &i.Result,
		&i.Error, &wait, &i.WakeAt, &i.ParentID, &i.ParentSeq, &i.CreatedAt, &i.UpdatedAt, &i.FinishedAt, &i.Now}
	if len(withTenant) > 0 && withTenant[0] {
		dest = append(dest, &i.Tenant)
	}
	err := row.Scan(dest...)
	if err != nil {
		return nil, err
	}
	i.Status = Status(status)
	if len(wait) > 0 && string(wait) != "null" {
		i.Wait = &WaitSpec{}
		if err := json.Unmarshal(wait, i.Wait); err != nil {
			return nil, err
		}
	}
	return &i, nil
}

// ValidateID checks a workflow id: 1 to 255 of letters, digits and ._:/@-,
// starting with a letter or digit (INVALID_ARGUMENT).
func ValidateID(id string) error {
	if !idRe.MatchString(id) {
		return fault.New(fault.InvalidArgument, "bad workflow id %q: want 1 to 255 of [A-Za-z0-9._:/@-], starting with a letter or digit", id)
	}
	return nil
}

// NewID returns a random workflow id.
func NewID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "wf_" + hex.EncodeToString(b[:])
}

// EncodePayload marshals v (a json.RawMessage or []byte as is) and checks it:
// valid JSON that jsonb stores (fault.CheckJSON: a string holding a NUL byte
// is not), within MaxPayload; INVALID_ARGUMENT naming what otherwise. Every
// input, result and signal payload passes through it, and so do the payloads
// other packages hold for a workflow (a confirmation's).
func EncodePayload(what string, v any) (json.RawMessage, error) {
	var enc []byte
	switch x := v.(type) {
	case json.RawMessage:
		enc = x
	case []byte:
		enc = x
	default:
		var err error
		if enc, err = json.Marshal(v); err != nil {
			return nil, fault.Wrap(fault.InvalidArgument, err, "the %s does not encode as JSON", what)
		}
	}
	if len(enc) == 0 {
		enc = []byte("null")
	}
	if !json.Valid(enc) {
		return nil, fault.New(fault.InvalidArgument, "the %s is not valid JSON", what)
	}
	if err := fault.CheckJSON("the "+what, enc); err != nil {
		return nil, err
	}
	if len(enc) > MaxPayload {
		return nil, fault.New(fault.InvalidArgument, "the %s is %d bytes, over the limit of %d", what, len(enc), MaxPayload)
	}
	return enc, nil
}

// StartOpts are a start's options.
type StartOpts struct {
	// ID is the workflow's id (ValidateID); empty for a new random one. Starting
	// the same id twice with the same kind and input is one workflow; with
	// another kind or input it is CONFLICT.
	ID string
}

// StartTx starts a workflow of w's kind with in, in the caller's transaction,
// and returns its id: if tx rolls back, nothing was started. It is the one way
// to start a workflow. The kind must have been recorded by a migrate or a
// worker start of a binary that registers it (INVALID_ARGUMENT otherwise). It
// first checks in as the first step will see it (CheckInput: encoded, decoded
// from that JSON into In, then given to Init): an input that does not decode,
// that Init refuses, that does not encode as JSON jsonb stores (a string
// holding a NUL byte, say) or is over MaxPayload, or a bad id (ValidateID), is
// INVALID_ARGUMENT, and nothing is sent to the database, so tx stays usable.
func (w *Workflow[In, S, Out]) StartTx(ctx context.Context, tx pgx.Tx, in In, opts *StartOpts) (string, error) {
	return startTx(ctx, tx, w.Kind, in, opts, w.CheckInput)
}

// StartJSONTx is StartTx with the input as JSON, for tools that know a
// workflow by its kind only (the CLI's `workflow start KIND JSON`).
func (w *Workflow[In, S, Out]) StartJSONTx(ctx context.Context, tx pgx.Tx, input json.RawMessage, opts *StartOpts) (string, error) {
	return startTx(ctx, tx, w.Kind, input, opts, w.CheckInput)
}

// startTx starts a workflow of kind, with check (when not nil) run on the encoded input
// before any statement.
func startTx(ctx context.Context, tx pgx.Tx, kind string, input any, opts *StartOpts, check func(json.RawMessage) error) (string, error) {
	var o StartOpts
	if opts != nil {
		o = *opts
	}
	if o.ID == "" {
		o.ID = NewID()
	}
	if !kindRe.MatchString(kind) {
		return "", fault.New(fault.InvalidArgument, "bad workflow kind %q", kind)
	}
	if err := ValidateID(o.ID); err != nil {
		return "", err
	}
	enc, err := EncodePayload("input of workflow "+kind, input)
	if err != nil {
		return "", err
	}
	if check != nil {
		if err := check(enc); err != nil {
			return "", err
		}
	}
	if err := startManyTx(ctx, tx, []startSpec{{id: o.ID, kind: kind, input: enc}}, "", 0); err != nil {
		return "", err
	}
	return o.ID, nil
}

type startSpec struct {
	id, kind string
	input    json.RawMessage
}

// startManyTx inserts the instances of specs and their first jobs; an id that
// exists with the same kind and input is fine, another is CONFLICT; an unknown
// kind is INVALID_ARGUMENT.
func startManyTx(ctx context.Context, tx pgx.Tx, specs []startSpec, parent string, parentSeq int64) error {
	ids := make([]string, len(specs))
	kinds := make([]string, len(specs))
	inputs := make([]string, len(specs))
	hashes := make([]int64, len(specs))
	for i, s := range specs {
		ids[i], kinds[i], inputs[i], hashes[i] = s.id, s.kind, string(s.input), int64(jobs.KeyHash(s.id))
	}
	var parentArg, parentSeqArg any
	if parent != "" {
		parentArg, parentSeqArg = parent, parentSeq
	}
	var tenant any
	if t := jobs.TenantOf(ctx); t != "" {
		if err := jobs.ValidateTenant(t); err != nil {
			return err
		}
		tenant = t
	}
	rows, err := tx.Query(ctx, jobs.StartWorkflowsSQL, ids, kinds, inputs, hashes, parentArg, parentSeqArg, time.Now(),
		tracing.CauseOrNil(ctx), tenant)
	if err != nil {
		return pg.Translate(fmt.Errorf("error starting workflows: %w", err))
	}
	inserted, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return pg.Translate(fmt.Errorf("error starting workflows: %w", err))
	}
	for _, id := range inserted {
		jobs.WakeAfterCommit(tx, id)
	}
	if len(inserted) == len(specs) {
		return nil
	}
	done := make(map[string]bool, len(inserted))
	for _, id := range inserted {
		done[id] = true
	}
	var rest []string
	for _, id := range ids {
		if !done[id] {
			rest = append(rest, id)
		}
	}
	// Each id left either exists (the same start again, or a conflict) or has
	// a kind no binary recorded.
	type existing struct {
		kind  string
		input json.RawMessage
	}
	have := map[string]existing{}
	erows, err := tx.Query(ctx, `SELECT id, kind, input FROM compute_workflows WHERE id = ANY($1::text[])`, rest)
	if err != nil {
		return pg.Translate(err)
	}
	for erows.Next() {
		var id string
		var e existing
		if err := erows.Scan(&id, &e.kind, &e.input); err != nil {
			erows.Close()
			return pg.Translate(err)
		}
		have[id] = e
	}
	erows.Close()
	if err := erows.Err(); err != nil {
		return pg.Translate(err)
	}
	for i, id := range ids {
		if done[id] {
			continue
		}
		e, ok := have[id]
		if !ok {
			return fault.New(fault.InvalidArgument, "unknown workflow kind %s (no binary that registers it has run migrate or a worker against this database)", kinds[i])
		}
		if e.kind != kinds[i] || !sameJSON(e.input, specs[i].input) {
			return fault.New(fault.Conflict, "workflow %s already exists (kind %s) with a different kind or input", id, e.kind)
		}
	}
	return nil
}

func sameJSON(a, b json.RawMessage) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	ea, _ := json.Marshal(x)
	eb, _ := json.Marshal(y)
	return string(ea) == string(eb)
}

// SignalOpts are a signal's options.
type SignalOpts struct {
	// DedupKey, optional: a second signal to the same workflow with the same
	// key is not stored again (it counts once), and is a Duplicate rather than
	// CONFLICT after the workflow finished: a sender may retry safely.
	DedupKey string
}

// SignalResult is what SignalTx did.
type SignalResult struct {
	ID int64
	// Duplicate is true when a signal with the same dedup key was already sent:
	// nothing was stored.
	Duplicate bool
}

// signalSQL reads the instance's status and takes its row FOR KEY SHARE,
// checks the name against the kind's recorded signals, and stores the signal
// unless its dedup key was seen: $1 id, $2 name, $3 payload, $4 dedup key, $5
// the sender's cause (a traceparent or NULL). Its row: status, known name,
// signal id (NULL for a duplicate or a refusal), and whether the dedup key was
// seen before.
//
// FOR KEY SHARE, not a stronger mode: a step holds the row FOR NO KEY UPDATE
// for its whole transaction (LockFencedSQL), which FOR KEY SHARE does not conflict
// with, so a signal never waits for a step in progress, not even one whose
// process is paused mid-transaction. What the lock does do is make the COMMIT
// of a step that waits for a signal, or that finishes the workflow, wait for
// this transaction: that COMMIT takes the row FOR UPDATE first (the barrier of
// migrations/workflow/0003_signal_barrier.sql), then reads the inbox. Under
// the lock the row read is the latest committed version: a finish or a
// compensation committed before, or during a wait for the barrier, shows as
// its status (CONFLICT).
const signalSQL = `
WITH w AS (
    SELECT w.id, w.status, k.signals FROM compute_workflows w
    LEFT JOIN compute_workflow_kinds k ON k.kind = w.kind
    WHERE w.id = $1 FOR KEY SHARE OF w
), s AS (
    INSERT INTO compute_workflow_signals (workflow_id, name, payload, dedup_key, cause)
    SELECT w.id, $2, $3::jsonb, $4, $5::text FROM w
    WHERE $2 = ANY(w.signals) AND w.status NOT IN ('cancelling', 'completed', 'failed', 'cancelled')
    ON CONFLICT (workflow_id, dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING
    RETURNING id
)
SELECT w.status, coalesce($2 = ANY(w.signals), false), (SELECT id FROM s),
       EXISTS (SELECT 1 FROM compute_workflow_signals d WHERE d.workflow_id = $1 AND d.dedup_key = $4)
FROM w`

// dedupWaitSQL waits, before signalSQL takes the workflow's row FOR KEY
// SHARE, for a step that is consuming the signal with the same dedup key ($1
// workflow id, $2 dedup key), and keeps any other step from consuming it until
// this transaction ends. Without it a repeat of a signal deadlocks with the
// step that consumes the first one: signalSQL's insert waits for the step's
// transaction (the unique check waits for the consuming UPDATE of the row it
// conflicts with) while holding FOR KEY SHARE, and the step's COMMIT waits for
// that lock (the barrier's FOR UPDATE). FOR SHARE is the weakest mode that
// waits for that UPDATE; holding nothing else of the workflow's yet, this
// transaction's wait here blocks no step.
const dedupWaitSQL = `SELECT 1 FROM compute_workflow_signals WHERE workflow_id = $1 AND dedup_key = $2 FOR SHARE`

// SignalTx sends the signal name with payload to workflow id, in the caller's
// transaction: if tx rolls back, nothing was sent. A signal the workflow does
// not wait for yet waits in its inbox. Unknown workflow: NOT_FOUND; a name the
// kind does not declare: INVALID_ARGUMENT; a finished (or cancelling) workflow: CONFLICT;
// nothing written in each case. A bad id, name, dedup key (not valid UTF-8, or
// holding a NUL byte) or payload is INVALID_ARGUMENT before any statement is
// sent: tx stays usable.
//
// It does not wait for a step of the workflow in progress (see signalSQL),
// except for a step consuming the signal this one repeats (same dedup key: see
// dedupWaitSQL), whose commit it then reports as a duplicate. A signal sent
// during a step is stored at once, and the workflow's next await
// sees it, whatever the order of the two commits. A step that commits a wait,
// or finishes the workflow, waits instead for the signals in flight: keep the
// transaction short after SignalTx. A signal accepted while the workflow was
// still running is in its inbox even if the workflow then finishes without
// awaiting it again (it is never consumed, and is pruned with the workflow);
// one sent after the finish committed is CONFLICT.
func SignalTx(ctx context.Context, tx pgx.Tx, id, name string, payload any, opts *SignalOpts) (SignalResult, error) {
	if err := ValidateID(id); err != nil {
		return SignalResult{}, err
	}
	if !nameRe.MatchString(name) {
		return SignalResult{}, fault.New(fault.InvalidArgument, "bad signal name %q", name)
	}
	enc, err := EncodePayload("payload of signal "+name, payload)
	if err != nil {
		return SignalResult{}, err
	}
	var dedup any
	if opts != nil && opts.DedupKey != "" {
		if err := fault.CheckText("signal "+name+" to workflow "+id+": dedup key", opts.DedupKey); err != nil {
			return SignalResult{}, err
		}
		dedup = opts.DedupKey
	}
	b := &pgx.Batch{}
	if dedup != nil {
		b.Queue(dedupWaitSQL, id, dedup)
	}
	b.Queue(signalSQL, id, name, string(enc), dedup, tracing.CauseOrNil(ctx))
	// A second statement, with a snapshot taken after the lock: it sees the
	// wait and the job of a step whose COMMIT this transaction's lock waited
	// for. A wait committing after it waits for this transaction instead, and
	// wakes its own job (see signalSQL).
	b.Queue(jobs.WakeWorkflowJobSQL, id, name, time.Now())
	res := tx.SendBatch(ctx, b)
	var (
		status string
		known  bool
		sigID  *int64
		seen   bool
	)
	if dedup != nil {
		if _, err := res.Exec(); err != nil {
			_ = res.Close()
			return SignalResult{}, pg.Translate(fmt.Errorf("error signalling workflow %s: %w", id, err))
		}
	}
	err = res.QueryRow().Scan(&status, &known, &sigID, &seen)
	if errors.Is(err, pgx.ErrNoRows) {
		_ = res.Close()
		return SignalResult{}, fault.New(fault.NotFound, "no workflow %s", id)
	}
	if err != nil {
		_ = res.Close()
		return SignalResult{}, pg.Translate(fmt.Errorf("error signalling workflow %s: %w", id, err))
	}
	woke, werr := res.Exec()
	if err := res.Close(); err != nil && werr == nil {
		werr = err
	}
	if werr == nil && woke.RowsAffected() > 0 {
		jobs.WakeAfterCommit(tx, id)
	}
	switch {
	case !known:
		return SignalResult{}, fault.New(fault.InvalidArgument, "workflow %s does not take signal %s", id, name)
	case sigID == nil && seen && werr == nil:
		// A repeat of a signal already sent (the sender retrying), even if the
		// workflow has finished since: it counted once.
		return SignalResult{Duplicate: true}, nil
	case Status(status).Finished() || Status(status) == Cancelling:
		return SignalResult{}, fault.New(fault.Conflict, "workflow %s is %s: it takes no more signals", id, status)
	case werr != nil:
		return SignalResult{}, pg.Translate(fmt.Errorf("error waking workflow %s: %w", id, werr))
	case sigID == nil:
		return SignalResult{Duplicate: true}, nil
	}
	return SignalResult{ID: *sigID}, nil
}

// lockInfoSQL locks the instance row and reads it: $1 id. FOR NO KEY UPDATE
// serializes every transaction that moves the instance (steps, re-arms,
// cancels, retries, a child waking its parent) and lets signals through
// (FOR KEY SHARE): nothing here changes the row's key, and no FOR UPDATE is
// held across a round trip of the client (see signalSQL).
const lockInfoSQL = `SELECT ` + infoColumns + ` FROM compute_workflows w WHERE w.id = $1 FOR NO KEY UPDATE`

// CancelTx cancels workflow id and its unfinished descendants in the caller's
// transaction, with reason: their outstanding step jobs are cancelled (a
// running one is fenced by the seq), and each one's compensation step, if its
// kind declares one, is scheduled to run once. Cancelling a cancelled (or
// cancelling) workflow does nothing; a completed or failed one is CONFLICT; an
// unknown one NOT_FOUND. A bad id or a reason that is not valid UTF-8 or holds
// a NUL byte is INVALID_ARGUMENT before any statement is sent.
func CancelTx(ctx context.Context, tx pgx.Tx, id, reason string) error {
	if err := ValidateID(id); err != nil {
		return err
	}
	if err := fault.CheckText("cancel of workflow "+id+": reason", reason); err != nil {
		return err
	}
	if reason == "" {
		reason = "cancelled"
	}
	root, err := scanInfo(tx.QueryRow(ctx, lockInfoSQL, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return fault.New(fault.NotFound, "no workflow %s", id)
	}
	if err != nil {
		return pg.Translate(fmt.Errorf("error cancelling workflow %s: %w", id, err))
	}
	switch root.Status {
	case Cancelled, Cancelling:
		return nil
	case Completed, Failed:
		return fault.New(fault.Conflict, "workflow %s is %s: there is nothing to cancel", id, root.Status)
	}
	// The unfinished descendants, parents first, locked.
	rows, err := tx.Query(ctx, `
WITH RECURSIVE t AS (
    SELECT c.id, 1 AS depth FROM compute_workflows c WHERE c.parent_id = $1
    UNION ALL
    SELECT c.id, t.depth + 1 FROM compute_workflows c JOIN t ON c.parent_id = t.id
)
SELECT `+infoColumns+` FROM compute_workflows w JOIN t ON t.id = w.id
WHERE w.finished_at IS NULL AND w.status <> 'cancelling'
ORDER BY t.depth, w.id FOR NO KEY UPDATE OF w`, id)
	if err != nil {
		return pg.Translate(fmt.Errorf("error cancelling the children of workflow %s: %w", id, err))
	}
	all := []*Info{root}
	for rows.Next() {
		i, err := scanInfo(rows)
		if err != nil {
			rows.Close()
			return pg.Translate(err)
		}
		all = append(all, i)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return pg.Translate(err)
	}
	kinds := map[string]string{} // kind -> compensation step
	krows, err := tx.Query(ctx, `SELECT kind, coalesce(compensate, '') FROM compute_workflow_kinds`)
	if err != nil {
		return pg.Translate(err)
	}
	for krows.Next() {
		var k, c string
		if err := krows.Scan(&k, &c); err != nil {
			krows.Close()
			return pg.Translate(err)
		}
		kinds[k] = c
	}
	krows.Close()
	count, err := jobs.ShardCountTx(ctx, tx)
	if err != nil {
		return pg.Translate(err)
	}
	var oldJobs []int64
	for _, i := range all {
		why := reason
		if i != root {
			why = fmt.Sprintf("parent workflow %s cancelled: %s", root.ID, reason)
		}
		if i.JobID != nil {
			oldJobs = append(oldJobs, *i.JobID)
		}
		t := Transition{Status: Cancelled, Step: i.Step, Error: why, Outcome: "cancelled"}
		if comp := kinds[i.Kind]; comp != "" {
			t = Transition{Status: Cancelling, Step: comp, Error: why, Outcome: "cancelled", NextStep: comp,
				Job: true, Queue: jobs.ShardQueue(jobs.ShardOf(i.ID, count)), RunAt: time.Now(), MaxAttempts: DefaultAttempts}
		}
		if _, err := AdvanceTx(ctx, tx, i, t); err != nil {
			return err
		}
	}
	if len(oldJobs) > 0 {
		if _, err := tx.Exec(ctx, jobs.CancelWorkflowJobsSQL, oldJobs, "workflow cancelled: "+reason, time.Now()); err != nil {
			return pg.Translate(fmt.Errorf("error cancelling the step jobs of workflow %s: %w", id, err))
		}
	}
	return nil
}

// RetryTx resumes a failed workflow at its failed step (a fresh set of
// attempts), in the caller's transaction. An unfinished workflow whose step
// job is no longer live (cancelled, discarded or deleted by hand: see
// FindStuck) gets a new job where it stands. Any other workflow is CONFLICT;
// an unknown one NOT_FOUND.
func RetryTx(ctx context.Context, tx pgx.Tx, id string) error {
	if err := ValidateID(id); err != nil {
		return err
	}
	i, err := scanInfo(tx.QueryRow(ctx, lockInfoSQL, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return fault.New(fault.NotFound, "no workflow %s", id)
	}
	if err != nil {
		return pg.Translate(err)
	}
	if i.Status.Finished() && i.Status != Failed {
		return fault.New(fault.Conflict, "workflow %s is %s: only a failed workflow, or one whose step job is gone, can be retried", id, i.Status)
	}
	if i.Status != Failed && i.JobID != nil {
		state, found, err := jobs.JobState(ctx, tx, *i.JobID)
		if err != nil {
			return pg.Translate(err)
		}
		if found && isLive(state) {
			return fault.New(fault.Conflict, "workflow %s is %s and its step job %d is %s: there is nothing to retry", id, i.Status, *i.JobID, state)
		}
	}
	queue, err := jobs.ShardQueueOfTx(ctx, tx, id)
	if err != nil {
		return pg.Translate(err)
	}
	t := Transition{Status: Running, Step: i.Step, Outcome: "retried", NextStep: i.Step,
		Job: true, Queue: queue, RunAt: time.Now(), MaxAttempts: DefaultAttempts}
	if i.Status != Failed {
		// A new job where it stands: the same wait, deadline and error.
		t = RearmTransition(i, queue, DefaultAttempts)
		t.RunAt, t.Outcome, t.NextStep = time.Now(), "retried", i.Step
	}
	_, err = AdvanceTx(ctx, tx, i, t)
	return err
}

func isLive(state string) bool {
	switch state {
	case "available", "pending", "running", "scheduled", "retryable":
		return true
	}
	return false
}

// tenantRootsSQL: tenant $1's unfinished workflows whose parent is not one of
// them (CancelTx cancels a workflow's descendants with it), oldest first.
const tenantRootsSQL = `SELECT w.id FROM compute_workflows w
WHERE w.tenant = $1 AND w.status IN ('running', 'sleeping', 'waiting')
  AND NOT EXISTS (SELECT 1 FROM compute_workflows p WHERE p.id = w.parent_id AND p.tenant = $1
                  AND p.status IN ('running', 'sleeping', 'waiting'))
ORDER BY w.created_at, w.id`

// CancelTenantTx cancels every unfinished workflow of tenant with reason, in
// the caller's transaction (CancelTx of each, with its descendants: each
// compensation runs once), and returns how many it cancelled (descendants not
// counted). It is the workflow half of deleting a tenant (tenancy.DeleteTx).
func CancelTenantTx(ctx context.Context, tx pgx.Tx, tenant, reason string) (int, error) {
	if err := jobs.ValidateTenant(tenant); err != nil {
		return 0, err
	}
	rows, err := tx.Query(ctx, tenantRootsSQL, tenant)
	if err != nil {
		return 0, pg.Translate(fmt.Errorf("error listing the workflows of tenant %s: %w", tenant, err))
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return 0, pg.Translate(fmt.Errorf("error listing the workflows of tenant %s: %w", tenant, err))
	}
	for n, id := range ids {
		if err := CancelTx(ctx, tx, id, reason); err != nil {
			return n, err
		}
	}
	return len(ids), nil
}
