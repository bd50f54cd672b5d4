package quorum_test

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/bettercompute/bettercompute/domain/quorum"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
)

// An agent proposes two changes that two of three voters must approve within
// the hour; alice's vote is one of them.
func ExampleVoteTx() {
	ctx := context.Background()
	db := pgtest.ForExample().Pool // the application's pool
	var id int64
	err := pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
		b, err := quorum.ProposeTx(ctx, tx, &quorum.ProposeParams{
			Kind: "firewall_rules", Agent: "planner",
			Items:  []any{map[string]any{"port": 22, "allow": false}, map[string]any{"port": 443, "allow": true}},
			Voters: []string{"alice", "bob", "carol"}, Quorum: 2, Deadline: time.Now().Add(time.Hour),
		})
		if err != nil {
			return err
		}
		id = b.ID
		return nil
	})
	if err != nil {
		panic(err)
	}
	err = pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
		res, err := quorum.VoteTx(ctx, tx, &quorum.VoteParams{BatchID: id, Voter: "alice", Approve: true, Reason: "looks right"})
		if err != nil {
			return err // INVALID_ARGUMENT: not a voter; CONFLICT: voted already, closed, or too late
		}
		fmt.Println(res.State, res.Approvals) // open 1; the second approval commits it and enqueues the apply job
		return nil
	})
	fmt.Println(err)
	// Output:
	// open 1
	// <nil>
}
