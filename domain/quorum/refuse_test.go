package quorum_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/domain/quorum"
	"github.com/bettercompute/bettercompute/platform/clock"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pgtest"
)

// TestTextPostgreSQLRefusesIsRefusedFirst: an agent, voter or vote reason that
// is not valid UTF-8 or holds a NUL byte, and an item whose JSON jsonb refuses,
// are INVALID_ARGUMENT before any statement is sent: the caller's transaction
// goes on and commits, and the batch is untouched. Sent, each failed with
// INTERNAL_ERROR and aborted the caller's transaction.
func TestTextPostgreSQLRefusesIsRefusedFirst(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	require.NoError(t, clock.UseSim(ctx, db.Pool, t0))
	ok := quorum.ProposeParams{Kind: "rules", Agent: "planner", Items: []any{map[string]int{"port": 22}},
		Voters: []string{"alice", "bob"}, Quorum: 2, Deadline: t0.Add(time.Hour)}
	b := propose(t, db.Pool, ok)
	proposeTx := func(edit func(p *quorum.ProposeParams)) func(ctx context.Context, tx pgx.Tx) error {
		p := ok
		p.Voters = append([]string(nil), ok.Voters...)
		edit(&p)
		return func(ctx context.Context, tx pgx.Tx) error {
			_, err := quorum.ProposeTx(ctx, tx, &p)
			return err
		}
	}
	voteTx := func(voter, reason string) func(ctx context.Context, tx pgx.Tx) error {
		return func(ctx context.Context, tx pgx.Tx) error {
			_, err := quorum.VoteTx(ctx, tx, &quorum.VoteParams{BatchID: b.ID, Voter: voter, Approve: true, Reason: reason})
			return err
		}
	}
	for name, call := range map[string]func(ctx context.Context, tx pgx.Tx) error{
		"propose, NUL agent":           proposeTx(func(p *quorum.ProposeParams) { p.Agent = "plan\x00ner" }),
		"propose, invalid UTF-8 voter": proposeTx(func(p *quorum.ProposeParams) { p.Voters[1] = "b\xf6b" }),
		"propose, NUL in an item":      proposeTx(func(p *quorum.ProposeParams) { p.Items = []any{map[string]string{"rule": "\x00"}} }),
		"propose, raw \\u0000 item":    proposeTx(func(p *quorum.ProposeParams) { p.Items = []any{json.RawMessage(`"\u0000"`)} }),
		"vote, NUL voter":              voteTx("alice\x00", ""),
		"vote, NUL reason":             voteTx("alice", "fine\x00"),
		"vote, invalid UTF-8 reason":   voteTx("alice", "fine\xe9"),
	} {
		t.Run(name, func(t *testing.T) {
			err := db.RequireRefusal(t, fault.InvalidArgument, call)
			require.NotContains(t, err.Error(), "\x00", "the bad bytes are quoted, not echoed")
		})
	}
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM quorum_batches`))
	require.Equal(t, 0, db.MustCount(t, `SELECT count(*) FROM quorum_votes`))
}
