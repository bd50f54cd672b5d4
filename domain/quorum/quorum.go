package quorum

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
)

// State is a batch's state.
type State string

// The batch states: see the package doc's diagram.
const (
	Open      State = "open"
	Committed State = "committed"
	Rejected  State = "rejected"
	Expired   State = "expired"
	Applied   State = "applied"
)

// Limits on a proposal.
const (
	MaxVoters = 1000
	MaxItems  = 10000
)

// Batch is a proposed batch of changes.
type Batch struct {
	ID         int64      `db:"id"`
	Kind       string     `db:"kind"`
	Agent      string     `db:"agent"`
	State      State      `db:"state"`
	Quorum     int        `db:"quorum"`
	VoterCount int        `db:"voter_count"`
	Approvals  int        `db:"approvals"`
	Rejections int        `db:"rejections"`
	Deadline   time.Time  `db:"deadline"`
	CreatedAt  time.Time  `db:"created_at"`
	DecidedAt  *time.Time `db:"decided_at"`
	AppliedAt  *time.Time `db:"applied_at"`
	// ApplyJobID is the apply job the committing vote enqueued.
	ApplyJobID *int64 `db:"apply_job_id"`
	// ExpireJobID is the job scheduled for the deadline.
	ExpireJobID *int64 `db:"expire_job_id"`

	// Voters and Items are filled by Get and for appliers, not by VoteTx.
	Voters []string          `db:"-"`
	Items  []json.RawMessage `db:"-"`
}

// Key is the batch's shard key: its jobs go to the shard queue of this key.
func Key(id int64) string { return "quorum/" + strconv.FormatInt(id, 10) }

var kindRe = regexp.MustCompile(`^[a-z][a-z0-9_]{0,62}$`)

// ProposeParams are ProposeTx's parameters.
type ProposeParams struct {
	// Kind selects the applier: [a-z][a-z0-9_]{0,62}.
	Kind string
	// Agent names who proposes the batch (a service, an operator).
	Agent string
	// Items are the changes, in order; each is marshalled to JSON (a
	// json.RawMessage is kept as is).
	Items []any
	// Voters are the eligible voters, distinct.
	Voters []string
	// Quorum is the approvals that commit the batch: 1 to len(Voters).
	Quorum int
	// Deadline is when the batch expires if still open, by compute_now(); it must
	// be later than compute_now().
	Deadline time.Time
}

func (p *ProposeParams) validate() ([]string, error) {
	if p == nil {
		return nil, fault.New(fault.InvalidArgument, "propose: no parameters")
	}
	if !kindRe.MatchString(p.Kind) {
		return nil, fault.New(fault.InvalidArgument, "propose: kind %q: want [a-z][a-z0-9_]{0,62}", p.Kind)
	}
	if p.Agent == "" || len(p.Agent) > 200 {
		return nil, fault.New(fault.InvalidArgument, "propose: the agent must be named (1 to 200 bytes)")
	}
	if err := fault.CheckText("propose: agent", p.Agent); err != nil {
		return nil, err
	}
	if len(p.Items) > MaxItems {
		return nil, fault.New(fault.InvalidArgument, "propose: %d items: at most %d", len(p.Items), MaxItems)
	}
	if len(p.Voters) == 0 || len(p.Voters) > MaxVoters {
		return nil, fault.New(fault.InvalidArgument, "propose: %d voters: want 1 to %d", len(p.Voters), MaxVoters)
	}
	seen := make(map[string]bool, len(p.Voters))
	for _, v := range p.Voters {
		if v == "" || len(v) > 200 {
			return nil, fault.New(fault.InvalidArgument, "propose: voter %q: want 1 to 200 bytes", v)
		}
		if err := fault.CheckText("propose: voter", v); err != nil {
			return nil, err
		}
		if seen[v] {
			return nil, fault.New(fault.InvalidArgument, "propose: voter %q is listed twice", v)
		}
		seen[v] = true
	}
	if p.Quorum < 1 || p.Quorum > len(p.Voters) {
		return nil, fault.New(fault.InvalidArgument, "propose: quorum %d: want 1 to %d (the voters)", p.Quorum, len(p.Voters))
	}
	if p.Deadline.IsZero() {
		return nil, fault.New(fault.InvalidArgument, "propose: a deadline is required")
	}
	items := make([]string, len(p.Items))
	for i, it := range p.Items {
		b, err := json.Marshal(it)
		if err != nil {
			return nil, fault.Wrap(fault.InvalidArgument, err, "propose: item %d does not marshal to JSON", i)
		}
		if err := fault.CheckJSON(fmt.Sprintf("propose: item %d", i), b); err != nil {
			return nil, err
		}
		items[i] = string(b)
	}
	return items, nil
}

// ProposeTx proposes a batch in the caller's transaction and, in the same
// transaction, schedules its expiry job (jobs.QuorumExpiry) for the deadline. It
// returns INVALID_ARGUMENT for bad parameters, including a deadline that is not
// later than compute_now(); an agent or voter that is not valid UTF-8 or holds a
// NUL byte, or an item whose JSON jsonb refuses (a string holding a NUL byte),
// is refused before any statement is sent: tx stays usable.
func ProposeTx(ctx context.Context, tx pgx.Tx, p *ProposeParams) (*Batch, error) {
	items, err := p.validate()
	if err != nil {
		return nil, err
	}
	var (
		b      = &Batch{Kind: p.Kind, Agent: p.Agent, State: Open, Quorum: p.Quorum, VoterCount: len(p.Voters), Voters: slices.Clone(p.Voters)}
		dueIn  float64
		shards int
	)
	err = tx.QueryRow(ctx, `
WITH b AS (
    INSERT INTO quorum_batches (kind, agent, quorum, voter_count, deadline)
    SELECT $1, $2, $3, $4, $5 WHERE $5 > compute_now()
    RETURNING id, deadline, created_at
), v AS (
    INSERT INTO quorum_batch_voters (batch_id, voter) SELECT b.id, unnest($6::text[]) FROM b
), i AS (
    INSERT INTO quorum_batch_items (batch_id, position, payload)
    SELECT b.id, t.ord - 1, t.payload::jsonb FROM b, unnest($7::text[]) WITH ORDINALITY AS t(payload, ord)
)
SELECT id, deadline, created_at, extract(epoch FROM deadline - compute_now())::float8,
       (SELECT shard_count FROM compute_settings)
  FROM b`, p.Kind, p.Agent, p.Quorum, len(p.Voters), p.Deadline, p.Voters, items).Scan(&b.ID, &b.Deadline, &b.CreatedAt, &dueIn, &shards)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fault.New(fault.InvalidArgument, "propose: the deadline %s is not later than compute_now()", p.Deadline.Format(time.RFC3339Nano))
	}
	if err != nil {
		return nil, pg.Translate(fmt.Errorf("error proposing a %s batch: %w", p.Kind, err))
	}
	for _, it := range items {
		b.Items = append(b.Items, json.RawMessage(it))
	}
	res, err := jobs.InsertTx(ctx, tx, jobs.QuorumExpiry{BatchID: b.ID}, &river.InsertOpts{
		Queue:       jobs.ShardQueue(jobs.ShardOf(Key(b.ID), shards)),
		ScheduledAt: time.Now().Add(time.Duration(dueIn * float64(time.Second))),
	})
	if err != nil {
		return nil, pg.Translate(fmt.Errorf("error scheduling the expiry of batch %d: %w", b.ID, err))
	}
	if _, err := tx.Exec(ctx, `UPDATE quorum_batches SET expire_job_id = $2 WHERE id = $1`, b.ID, res.Job.ID); err != nil {
		return nil, pg.Translate(fmt.Errorf("error recording the expiry job of batch %d: %w", b.ID, err))
	}
	b.ExpireJobID = &res.Job.ID
	return b, nil
}

// VoteParams are VoteTx's parameters.
type VoteParams struct {
	BatchID int64
	Voter   string
	Approve bool
	Reason  string // optional, at most 2,000 bytes
}

// VoteResult is the batch after a vote.
type VoteResult struct {
	State      State // open, or the decision this vote took (committed, rejected)
	Approvals  int
	Rejections int
	// ApplyJobID is the apply job enqueued by this vote, when it committed the
	// batch; 0 otherwise.
	ApplyJobID int64
}

// VoteTx casts one vote in the caller's transaction. It locks the batch row, so
// concurrent votes on a batch take turns; the vote that reaches the quorum
// before the deadline commits the batch and enqueues its apply job
// (jobs.QuorumApply) in tx, and the vote that makes the quorum unreachable
// rejects it. A refused vote changes nothing: it returns NOT_FOUND for an
// unknown batch, INVALID_ARGUMENT for a voter who is not eligible, and CONFLICT
// for a second vote, a closed batch, or a deadline that has passed by
// compute_now(). A voter or reason that is not valid UTF-8 or holds a NUL byte
// is INVALID_ARGUMENT before any statement is sent: tx stays usable.
func VoteTx(ctx context.Context, tx pgx.Tx, p *VoteParams) (*VoteResult, error) {
	if p == nil || p.BatchID <= 0 || p.Voter == "" || len(p.Voter) > 200 || len(p.Reason) > 2000 {
		return nil, fault.New(fault.InvalidArgument, "vote: a batch id and a voter are required (reason at most 2,000 bytes)")
	}
	if err := fault.CheckText("vote: voter", p.Voter); err != nil {
		return nil, err
	}
	if err := fault.CheckText("vote: reason", p.Reason); err != nil {
		return nil, err
	}
	// The lock: every vote and the expiry take it, so what follows reads the
	// batch, its votes and the clock as they are now.
	var locked int64
	err := tx.QueryRow(ctx, `SELECT id FROM quorum_batches WHERE id = $1 FOR NO KEY UPDATE`, p.BatchID).Scan(&locked)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fault.New(fault.NotFound, "batch %d does not exist", p.BatchID)
	}
	if err != nil {
		return nil, pg.Translate(fmt.Errorf("error locking batch %d: %w", p.BatchID, err))
	}
	var (
		state             State
		deadline          time.Time
		inTime, eligible  bool
		voted             bool
		newState          *State
		approvals, rejcts *int
		shards            int
		kind              string
	)
	err = tx.QueryRow(ctx, `
WITH b AS (
    SELECT id, kind, state, quorum, voter_count, deadline, deadline > compute_now() AS in_time, compute_now() AS at
      FROM quorum_batches WHERE id = $1
), c AS (
    SELECT b.*,
           EXISTS (SELECT 1 FROM quorum_batch_voters v WHERE v.batch_id = b.id AND v.voter = $2) AS eligible,
           EXISTS (SELECT 1 FROM quorum_votes v WHERE v.batch_id = b.id AND v.voter = $2) AS voted
      FROM b
), ins AS (
    INSERT INTO quorum_votes (batch_id, voter, approve, reason, cast_at)
    SELECT c.id, $2, $3, $4, c.at FROM c
     WHERE c.state = 'open' AND c.in_time AND c.eligible AND NOT c.voted
    RETURNING approve
), upd AS (
    UPDATE quorum_batches q
       SET approvals = q.approvals + ins.approve::int,
           rejections = q.rejections + (NOT ins.approve)::int,
           state = CASE
               WHEN q.approvals + ins.approve::int >= q.quorum THEN 'committed'
               WHEN q.rejections + (NOT ins.approve)::int > q.voter_count - q.quorum THEN 'rejected'
               ELSE 'open' END,
           decided_at = CASE
               WHEN q.approvals + ins.approve::int >= q.quorum
                 OR q.rejections + (NOT ins.approve)::int > q.voter_count - q.quorum THEN (SELECT at FROM c)
               END
      FROM ins
     WHERE q.id = $1
    RETURNING q.state, q.approvals, q.rejections
)
SELECT c.state, c.deadline, c.in_time, c.eligible, c.voted, c.kind,
       upd.state, upd.approvals, upd.rejections, (SELECT shard_count FROM compute_settings)
  FROM c LEFT JOIN upd ON true`, p.BatchID, p.Voter, p.Approve, p.Reason).Scan(
		&state, &deadline, &inTime, &eligible, &voted, &kind, &newState, &approvals, &rejcts, &shards)
	if err != nil {
		return nil, pg.Translate(fmt.Errorf("error voting on batch %d: %w", p.BatchID, err))
	}
	switch {
	case !eligible:
		return nil, fault.New(fault.InvalidArgument, "%s is not a voter of batch %d", p.Voter, p.BatchID)
	case voted:
		return nil, fault.New(fault.Conflict, "%s has already voted on batch %d", p.Voter, p.BatchID)
	case state != Open:
		return nil, fault.New(fault.Conflict, "batch %d is %s: it takes no more votes", p.BatchID, state)
	case !inTime:
		return nil, fault.New(fault.Conflict, "batch %d's deadline %s has passed", p.BatchID, deadline.Format(time.RFC3339Nano))
	case newState == nil:
		return nil, fault.New(fault.Internal, "vote on batch %d: the vote was not recorded", p.BatchID)
	}
	res := &VoteResult{State: *newState, Approvals: *approvals, Rejections: *rejcts}
	if res.State != Committed {
		return res, nil
	}
	// This vote committed the batch: its apply job, in the same transaction.
	job, err := jobs.InsertTx(ctx, tx, jobs.QuorumApply{BatchID: p.BatchID, BatchKind: kind}, &river.InsertOpts{
		Queue: jobs.ShardQueue(jobs.ShardOf(Key(p.BatchID), shards)),
	})
	if err != nil {
		return nil, pg.Translate(fmt.Errorf("error enqueueing the apply job of batch %d: %w", p.BatchID, err))
	}
	if _, err := tx.Exec(ctx, `UPDATE quorum_batches SET apply_job_id = $2 WHERE id = $1`, p.BatchID, job.Job.ID); err != nil {
		return nil, pg.Translate(fmt.Errorf("error recording the apply job of batch %d: %w", p.BatchID, err))
	}
	res.ApplyJobID = job.Job.ID
	return res, nil
}

// ExpireResult is what ExpireTx did.
type ExpireResult struct {
	// Expired is true when this call expired the batch.
	Expired bool
	// State is the batch's state after the call.
	State State
	// DueIn, for an open batch whose deadline has not come by compute_now(), is
	// how long until it does.
	DueIn time.Duration
}

// ExpireTx expires a batch that is still open at its deadline (by
// compute_now()), in the caller's transaction: the expiry job's work. A batch
// already decided is left alone; one whose deadline has not come is left open
// and DueIn says when it will. It returns NOT_FOUND for an unknown batch.
func ExpireTx(ctx context.Context, tx pgx.Tx, batchID int64) (*ExpireResult, error) {
	var (
		res   ExpireResult
		dueIn float64
	)
	err := tx.QueryRow(ctx, `
WITH b AS (
    SELECT id, state, extract(epoch FROM deadline - compute_now())::float8 AS due_in
      FROM quorum_batches WHERE id = $1 FOR NO KEY UPDATE
), upd AS (
    UPDATE quorum_batches q SET state = 'expired', decided_at = compute_now()
      FROM b WHERE q.id = b.id AND b.state = 'open' AND b.due_in <= 0
    RETURNING q.id
)
SELECT b.state, b.due_in, EXISTS (SELECT 1 FROM upd) FROM b`, batchID).Scan(&res.State, &dueIn, &res.Expired)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fault.New(fault.NotFound, "batch %d does not exist", batchID)
	}
	if err != nil {
		return nil, pg.Translate(fmt.Errorf("error expiring batch %d: %w", batchID, err))
	}
	switch {
	case res.Expired:
		res.State = Expired
	case res.State == Open:
		res.DueIn = time.Duration(dueIn * float64(time.Second))
	}
	return &res, nil
}

// ApplyTx applies a committed batch in the caller's transaction, which must be
// the fenced apply job's: it locks the batch, loads its items, runs apply and
// marks the batch applied. It reports false, having done nothing, for a batch
// already applied (a retried job). It returns NOT_FOUND for an unknown batch and
// INVALID_ARGUMENT for one that is not committed (nothing to apply, ever); apply's
// error rolls everything back and is returned as is.
func ApplyTx(ctx context.Context, tx pgx.Tx, batchID int64, apply func(ctx context.Context, tx pgx.Tx, b *Batch) error) (bool, error) {
	rows, err := tx.Query(ctx, batchSQL+` WHERE id = $1 FOR NO KEY UPDATE`, batchID)
	if err != nil {
		return false, pg.Translate(fmt.Errorf("error locking batch %d: %w", batchID, err))
	}
	b, err := pgx.CollectExactlyOneRow(rows, pgx.RowToAddrOfStructByName[Batch])
	if errors.Is(err, pgx.ErrNoRows) {
		return false, fault.New(fault.NotFound, "batch %d does not exist", batchID)
	}
	if err != nil {
		return false, pg.Translate(fmt.Errorf("error locking batch %d: %w", batchID, err))
	}
	switch b.State {
	case Applied:
		return false, nil
	case Committed:
	default:
		return false, fault.New(fault.InvalidArgument, "batch %d is %s: only a committed batch is applied", batchID, b.State)
	}
	if err := fill(ctx, tx, b); err != nil {
		return false, err
	}
	if err := apply(ctx, tx, b); err != nil {
		return false, err
	}
	tag, err := tx.Exec(ctx, `UPDATE quorum_batches SET state = 'applied', applied_at = compute_now() WHERE id = $1 AND state = 'committed'`, batchID)
	if err != nil {
		return false, pg.Translate(fmt.Errorf("error marking batch %d applied: %w", batchID, err))
	}
	if tag.RowsAffected() != 1 {
		return false, fault.New(fault.Internal, "batch %d changed while locked", batchID)
	}
	return true, nil
}

const batchSQL = `
SELECT id, kind, agent, state, quorum, voter_count, approvals, rejections, deadline, created_at,
       decided_at, applied_at, apply_job_id, expire_job_id
  FROM quorum_batches`

// Get returns a batch with its voters and items, or NOT_FOUND.
func Get(ctx context.Context, db pg.DBTX, id int64) (*Batch, error) {
	rows, err := db.Query(ctx, batchSQL+` WHERE id = $1`, id)
	if err != nil {
		return nil, pg.Translate(fmt.Errorf("error reading batch %d: %w", id, err))
	}
	b, err := pgx.CollectExactlyOneRow(rows, pgx.RowToAddrOfStructByName[Batch])
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fault.New(fault.NotFound, "batch %d does not exist", id)
	}
	if err != nil {
		return nil, pg.Translate(fmt.Errorf("error reading batch %d: %w", id, err))
	}
	if err := fill(ctx, db, b); err != nil {
		return nil, err
	}
	return b, nil
}

// fill loads a batch's voters and items.
func fill(ctx context.Context, db pg.DBTX, b *Batch) error {
	var items []string
	err := db.QueryRow(ctx, `
SELECT ARRAY(SELECT voter FROM quorum_batch_voters WHERE batch_id = $1 ORDER BY voter),
       ARRAY(SELECT payload::text FROM quorum_batch_items WHERE batch_id = $1 ORDER BY position)`, b.ID).Scan(&b.Voters, &items)
	if err != nil {
		return pg.Translate(fmt.Errorf("error reading the items of batch %d: %w", b.ID, err))
	}
	b.Items = make([]json.RawMessage, len(items))
	for i, it := range items {
		b.Items[i] = json.RawMessage(it)
	}
	return nil
}

// Vote is one recorded vote.
type Vote struct {
	Voter   string    `db:"voter"`
	Approve bool      `db:"approve"`
	Reason  string    `db:"reason"`
	CastAt  time.Time `db:"cast_at"`
}

// Votes returns a batch's votes in the order they were cast.
func Votes(ctx context.Context, db pg.DBTX, batchID int64) ([]Vote, error) {
	rows, err := db.Query(ctx, `SELECT voter, approve, reason, cast_at FROM quorum_votes WHERE batch_id = $1 ORDER BY cast_at, voter`, batchID)
	if err != nil {
		return nil, pg.Translate(fmt.Errorf("error reading the votes of batch %d: %w", batchID, err))
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByName[Vote])
	if err != nil {
		return nil, pg.Translate(fmt.Errorf("error reading the votes of batch %d: %w", batchID, err))
	}
	return out, nil
}
