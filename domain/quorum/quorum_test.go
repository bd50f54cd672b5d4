package quorum_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"regexp"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/domain/quorum"
	"github.com/bettercompute/bettercompute/platform/clock"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/quorumworker"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// contendedTimeout is the statement timeout of the tests whose voters queue on
// one batch's row lock: on a loaded machine the last of 64 waits longer than
// the default 15 s, which is not what those tests are about.
const contendedTimeout = 2 * time.Minute

var t0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

func voters(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("v%03d", i)
	}
	return out
}

func propose(t testing.TB, db pg.DBTX, p quorum.ProposeParams) *quorum.Batch {
	t.Helper()
	var b *quorum.Batch
	require.NoError(t, pg.InTx(context.Background(), db, func(ctx context.Context, tx pgx.Tx) error {
		var err error
		b, err = quorum.ProposeTx(context.Background(), tx, &p)
		return err
	}))
	return b
}

func vote(db pg.DBTX, batch int64, voter string, approve bool) (*quorum.VoteResult, error) {
	var res *quorum.VoteResult
	err := pg.InTx(context.Background(), db, func(ctx context.Context, tx pgx.Tx) error {
		var err error
		res, err = quorum.VoteTx(context.Background(), tx, &quorum.VoteParams{BatchID: batch, Voter: voter, Approve: approve})
		return err
	})
	return res, err
}

func applyJobs(t testing.TB, db *pgtest.DB, batch int64) int {
	return db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'quorum_apply' AND (args->>'batch_id')::bigint = $1`, batch)
}

func TestProposeVoteCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	require.NoError(t, clock.UseSim(ctx, db.Pool, t0))
	b := propose(t, db.Pool, quorum.ProposeParams{
		Kind: "rules", Agent: "planner", Items: []any{map[string]int{"port": 22}, json.RawMessage(`"second"`)},
		Voters: []string{"alice", "bob", "carol"}, Quorum: 2, Deadline: t0.Add(time.Hour),
	})
	require.Equal(t, quorum.Open, b.State)
	require.NotNil(t, b.ExpireJobID)
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'quorum_expiry' AND id = $1`, *b.ExpireJobID),
		"the expiry job is scheduled in the proposal's transaction")

	res, err := vote(db.Pool, b.ID, "alice", true)
	require.NoError(t, err)
	require.Equal(t, quorum.VoteResult{State: quorum.Open, Approvals: 1}, *res)
	require.Zero(t, applyJobs(t, db, b.ID))
	res, err = vote(db.Pool, b.ID, "carol", true)
	require.NoError(t, err)
	require.Equal(t, quorum.Committed, res.State)
	require.NotZero(t, res.ApplyJobID)
	require.Equal(t, 1, applyJobs(t, db, b.ID), "the committing vote enqueued the apply job")

	got, err := quorum.Get(ctx, db.Pool, b.ID)
	require.NoError(t, err)
	require.Equal(t, "planner", got.Agent)
	require.Equal(t, quorum.Committed, got.State)
	require.Equal(t, []string{"alice", "bob", "carol"}, got.Voters)
	require.Len(t, got.Items, 2)
	require.JSONEq(t, `{"port": 22}`, string(got.Items[0]))
	require.JSONEq(t, `"second"`, string(got.Items[1]))
	require.Equal(t, t0, got.DecidedAt.UTC())
	require.Equal(t, res.ApplyJobID, *got.ApplyJobID)

	_, err = vote(db.Pool, b.ID, "bob", true)
	require.True(t, fault.Has(err, fault.Conflict), "a vote on a committed batch: %v", err)
}

// TestRefusedVotesChangeNothing: each refused vote has its code, leaves the
// batch and the votes as they were, and leaves the caller's transaction usable.
func TestRefusedVotesChangeNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	require.NoError(t, clock.UseSim(ctx, db.Pool, t0))
	b := propose(t, db.Pool, quorum.ProposeParams{Kind: "k", Agent: "a", Voters: []string{"alice", "bob", "carol"}, Quorum: 3, Deadline: t0.Add(time.Minute)})
	_, err := vote(db.Pool, b.ID, "alice", true)
	require.NoError(t, err)

	refused := func(voter string, batch int64, want fault.Code) {
		t.Helper()
		err := pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
			_, err := quorum.VoteTx(ctx, tx, &quorum.VoteParams{BatchID: batch, Voter: voter, Approve: false})
			require.Equal(t, want, fault.CodeOf(err), "%s on %d: %v", voter, batch, err)
			_, err = tx.Exec(ctx, `SELECT 1`)
			return err
		})
		require.NoError(t, err, "the transaction is still usable")
		got, err := quorum.Get(ctx, db.Pool, b.ID)
		require.NoError(t, err)
		require.Equal(t, 1, got.Approvals)
		require.Zero(t, got.Rejections)
		require.Equal(t, quorum.Open, got.State)
		require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM quorum_votes`))
	}
	refused("mallory", b.ID, fault.InvalidArgument) // not a voter
	refused("alice", b.ID, fault.Conflict)          // a second vote
	refused("bob", b.ID+1000, fault.NotFound)       // no such batch

	_, err = clock.Advance(ctx, db.Pool, time.Minute)
	require.NoError(t, err)
	refused("bob", b.ID, fault.Conflict) // at the deadline, before the expiry job ran

	require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		res, err := quorum.ExpireTx(ctx, tx, b.ID)
		require.NoError(t, err)
		require.True(t, res.Expired)
		return nil
	}))
	// Expired: refused, and now for the state.
	err = pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		_, err := quorum.VoteTx(ctx, tx, &quorum.VoteParams{BatchID: b.ID, Voter: "carol", Approve: true})
		require.True(t, fault.Has(err, fault.Conflict), "%v", err)
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM quorum_votes`))

	// Bad proposals.
	for _, p := range []quorum.ProposeParams{
		{Kind: "Bad Kind", Agent: "a", Voters: []string{"x"}, Quorum: 1, Deadline: t0.Add(time.Hour)},
		{Kind: "k", Voters: []string{"x"}, Quorum: 1, Deadline: t0.Add(time.Hour)},
		{Kind: "k", Agent: "a", Voters: []string{"x", "x"}, Quorum: 1, Deadline: t0.Add(time.Hour)},
		{Kind: "k", Agent: "a", Voters: []string{"x"}, Quorum: 2, Deadline: t0.Add(time.Hour)},
		{Kind: "k", Agent: "a", Voters: []string{"x"}, Quorum: 1, Deadline: t0}, // not after compute_now()
	} {
		err := pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
			_, err := quorum.ProposeTx(ctx, tx, &p)
			return err
		})
		require.True(t, fault.Has(err, fault.InvalidArgument), "%+v: %v", p, err)
	}
}

// TestConcurrentVotersCommitOnce: many voters approve at once; the batch
// commits exactly once, with exactly one apply job; the votes after the commit
// are refused.
func TestConcurrentVotersCommitOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{MaxConns: 40, StatementTimeout: contendedTimeout})
	const n, q = 64, 40
	b := propose(t, db.Pool, quorum.ProposeParams{Kind: "k", Agent: "a", Voters: voters(n), Quorum: q, Deadline: time.Now().Add(time.Hour)})

	var (
		wg        sync.WaitGroup
		accepted  atomic.Int64
		refused   atomic.Int64
		commits   atomic.Int64
		committed atomic.Int64 // the apply job id the committing vote saw
	)
	start := make(chan struct{})
	for _, v := range voters(n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			res, err := vote(db.Pool, b.ID, v, true)
			switch {
			case err == nil:
				accepted.Add(1)
				if res.State == quorum.Committed {
					commits.Add(1)
					committed.Store(res.ApplyJobID)
				}
			case fault.Has(err, fault.Conflict):
				refused.Add(1)
			default:
				t.Errorf("vote %s: %v", v, err)
			}
		}()
	}
	close(start)
	wg.Wait()
	require.EqualValues(t, q, accepted.Load(), "exactly the quorum's votes count")
	require.EqualValues(t, n-q, refused.Load())
	require.EqualValues(t, 1, commits.Load(), "one vote committed it")
	require.Equal(t, 1, applyJobs(t, db, b.ID), "exactly one apply job")
	got, err := quorum.Get(ctx, db.Pool, b.ID)
	require.NoError(t, err)
	require.Equal(t, quorum.Committed, got.State)
	require.Equal(t, q, got.Approvals)
	require.Equal(t, committed.Load(), *got.ApplyJobID)
	require.Equal(t, q, db.MustCount(t, `SELECT count(*) FROM quorum_votes WHERE batch_id = $1`, b.ID))
}

// TestRejectedWhenTheQuorumIsUnreachable: the rejection that leaves too few
// voters to reach the quorum rejects the batch, once, even when they vote at
// once; nothing is applied.
func TestRejectedWhenTheQuorumIsUnreachable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{MaxConns: 30, StatementTimeout: contendedTimeout})

	// In turn: 5 voters, quorum 3: the third rejection decides.
	b := propose(t, db.Pool, quorum.ProposeParams{Kind: "k", Agent: "a", Voters: voters(5), Quorum: 3, Deadline: time.Now().Add(time.Hour)})
	for i, approve := range []bool{true, false, false} {
		res, err := vote(db.Pool, b.ID, voters(5)[i], approve)
		require.NoError(t, err)
		require.Equal(t, quorum.Open, res.State, "3 approvals are still reachable after vote %d", i)
	}
	res, err := vote(db.Pool, b.ID, "v003", false)
	require.NoError(t, err)
	require.Equal(t, quorum.Rejected, res.State, "1 approval + 1 voter left < 3")
	_, err = vote(db.Pool, b.ID, "v004", true)
	require.True(t, fault.Has(err, fault.Conflict))

	// At once: 24 voters, quorum 20, everyone rejects: the fifth rejection decides.
	b2 := propose(t, db.Pool, quorum.ProposeParams{Kind: "k", Agent: "a", Voters: voters(24), Quorum: 20, Deadline: time.Now().Add(time.Hour)})
	var wg sync.WaitGroup
	var decided, accepted atomic.Int64
	for _, v := range voters(24) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := vote(db.Pool, b2.ID, v, false)
			switch {
			case err == nil:
				accepted.Add(1)
				if res.State == quorum.Rejected {
					decided.Add(1)
				}
			case !fault.Has(err, fault.Conflict):
				t.Errorf("vote: %v", err)
			}
		}()
	}
	wg.Wait()
	require.EqualValues(t, 1, decided.Load())
	require.EqualValues(t, 5, accepted.Load())
	got, err := quorum.Get(ctx, db.Pool, b2.ID)
	require.NoError(t, err)
	require.Equal(t, quorum.Rejected, got.State)
	require.Zero(t, applyJobs(t, db, b.ID)+applyJobs(t, db, b2.ID), "nothing to apply")
}

// TestVotesRaceTheDeadline: voters vote while the sim clock moves past the
// deadlines and the worker's expiry jobs run. A vote counts only before the
// deadline; a batch is committed before its deadline with one apply job, or
// expired after it with none; never both, and no vote counts after the
// decision. Refused votes are CONFLICT for either cause, told apart by their
// message: too late (the deadline passed, before or after the expiry job ran),
// or after a decision made in time (the batch was committed or rejected).
//
// The sim clock runs at real speed (shard leases expire by it too, and are
// 10 s here), and rounds of batches repeat (at most maxRounds) until each
// outcome has occurred: a batch applied and one expired, a vote refused too
// late and one refused after a decision.
func TestVotesRaceTheDeadline(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{MaxConns: 60, StatementTimeout: contendedTimeout})
	require.NoError(t, clock.UseSim(ctx, db.Pool, t0))
	reg := workers.NewRegistry()
	require.NoError(t, quorumworker.AddApplier(reg, "k", func(ctx context.Context, tx pgx.Tx, b *quorum.Batch) error { return nil }))
	workertest.Start(t, db.Pool, reg, &workers.Options{LeaseTTL: 10 * time.Second, LeaseRenew: time.Second})

	const batches, n, q, maxRounds = 8, 16, 12, 10
	var (
		tooLate       = regexp.MustCompile(`^CONFLICT: batch \d+('s deadline .* has passed| is expired:)`)
		afterDecision = regexp.MustCompile(`^CONFLICT: batch \d+ is (committed|rejected|applied):`)
		outcomes      = map[quorum.State]int{}
		refusals      = map[string]int{}
		accepted      atomic.Int64
	)
	for round := 1; round <= maxRounds; round++ {
		roundStart := time.Now()
		now, err := clock.Now(ctx, db.Pool)
		require.NoError(t, err)
		var ids []int64
		for i := 0; i < batches; i++ {
			// Deadlines from 50 ms to 2.85 s: early ones expire, late ones
			// commit, even when votes are slow.
			b := propose(t, db.Pool, quorum.ProposeParams{Kind: "k", Agent: "a", Voters: voters(n), Quorum: q,
				Deadline: now.Add(time.Duration(i)*400*time.Millisecond + 50*time.Millisecond)})
			ids = append(ids, b.ID)
		}
		stop := make(chan struct{})
		clockDone := make(chan struct{})
		go func() { // the sim clock, at real speed: by the real time elapsed
			defer close(clockDone)
			last := time.Now()
			for {
				select {
				case <-stop:
					return
				case <-time.After(10 * time.Millisecond):
				}
				elapsed := time.Since(last)
				last = last.Add(elapsed)
				if _, err := clock.Advance(ctx, db.Pool, elapsed); err != nil {
					t.Errorf("advance: %v", err)
					return
				}
			}
		}()
		type refusal struct {
			batch int64
			voter string
			cause string
		}
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			refused []refusal
		)
		for i, id := range ids {
			for j, v := range voters(n) {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(round*1000+i), uint64(j)))
					time.Sleep(time.Duration(rng.IntN(400)) * time.Millisecond) // votes spread over the deadlines
					_, err := vote(db.Pool, id, v, rng.IntN(8) > 0)
					var cause string
					switch {
					case err == nil:
						accepted.Add(1)
						return
					case !fault.Has(err, fault.Conflict):
						t.Errorf("vote: %v", err)
						return
					case tooLate.MatchString(err.Error()):
						cause = "too late"
					case afterDecision.MatchString(err.Error()):
						cause = "after a decision"
					default:
						t.Errorf("vote refused for another cause: %v", err)
						return
					}
					mu.Lock()
					refused = append(refused, refusal{id, v, cause})
					mu.Unlock()
				}()
			}
		}
		wg.Wait()
		close(stop)
		<-clockDone
		voted := time.Since(roundStart)
		// Every deadline passes (all are within 3 s of the round's start),
		// leases (10 s) do not.
		_, err = clock.Advance(ctx, db.Pool, 3*time.Second)
		require.NoError(t, err)
		workertest.WaitFor(t, 60*time.Second, "every batch decided and every commit applied", func() bool {
			return db.MustCount(t, `SELECT count(*) FROM quorum_batches WHERE state IN ('open', 'committed')`) == 0
		})

		byID := map[int64]*quorum.Batch{}
		for _, id := range ids {
			b, err := quorum.Get(ctx, db.Pool, id)
			require.NoError(t, err)
			byID[id] = b
			outcomes[b.State]++
			votes, err := quorum.Votes(ctx, db.Pool, id)
			require.NoError(t, err)
			require.Len(t, votes, b.Approvals+b.Rejections, "batch %d: every recorded vote is counted", id)
			for _, v := range votes {
				require.True(t, v.CastAt.Before(b.Deadline), "batch %d: a vote counted at %s, deadline %s", id, v.CastAt, b.Deadline)
				require.False(t, v.CastAt.After(*b.DecidedAt), "batch %d: a vote counted after the decision", id)
			}
			switch b.State {
			case quorum.Applied:
				require.Equal(t, q, b.Approvals)
				require.True(t, b.DecidedAt.Before(b.Deadline), "batch %d committed at %s, deadline %s", id, b.DecidedAt, b.Deadline)
				require.Equal(t, 1, applyJobs(t, db, id))
			case quorum.Expired:
				require.Less(t, b.Approvals, q)
				require.False(t, b.DecidedAt.Before(b.Deadline), "batch %d expired early", id)
				require.Zero(t, applyJobs(t, db, id))
			case quorum.Rejected:
				require.Greater(t, b.Rejections, n-q)
				require.Zero(t, applyJobs(t, db, id))
			default:
				t.Fatalf("batch %d ended %s", id, b.State)
			}
		}
		// Each refusal against the database's record: the voter has no vote, and
		// the batch ended as the cause says.
		for _, r := range refused {
			refusals[r.cause]++
			require.Zero(t, db.MustCount(t, `SELECT count(*) FROM quorum_votes WHERE batch_id = $1 AND voter = $2`, r.batch, r.voter),
				"batch %d: %s's vote was refused (%s) but recorded", r.batch, r.voter, r.cause)
			b := byID[r.batch]
			if r.cause == "after a decision" {
				require.Contains(t, []quorum.State{quorum.Applied, quorum.Rejected}, b.State, "batch %d: refused after a decision", r.batch)
				require.True(t, b.DecidedAt.Before(b.Deadline), "batch %d: decided in time", r.batch)
			}
		}
		t.Logf("round %d (votes %s, all %s): outcomes %v; refusals %v; %d votes counted", round,
			voted.Round(time.Millisecond), time.Since(roundStart).Round(time.Millisecond), outcomes, refusals, accepted.Load())
		if outcomes[quorum.Applied] > 0 && outcomes[quorum.Expired] > 0 && refusals["too late"] > 0 && refusals["after a decision"] > 0 {
			break
		}
	}
	require.Positive(t, outcomes[quorum.Applied], "a batch committed before its deadline")
	require.Positive(t, outcomes[quorum.Expired], "a batch expired at its deadline")
	require.Positive(t, refusals["too late"], "votes came too late and were refused (CONFLICT)")
	require.Positive(t, refusals["after a decision"], "votes came after a decision in time and were refused (CONFLICT)")
}
