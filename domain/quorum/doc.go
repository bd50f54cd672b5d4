// Package quorum is batches of proposed changes that commit only when a quorum
// of voters approves before a deadline, exactly once, as guarded SQL that runs
// in the caller's transaction.
//
// An agent proposes a batch: a kind, ordered items (JSON), the eligible voters,
// the quorum and a deadline. Voters approve or reject, once each. The vote that
// brings the approvals to the quorum before the deadline commits the batch and,
// in the same transaction, enqueues its apply job (jobs.QuorumApply); the vote
// that makes the quorum unreachable rejects it; at the deadline an open batch
// expires (jobs.QuorumExpiry, scheduled by the proposal's transaction). The
// application registers an applier per kind with workers/quorumworker; applying runs
// in the fenced job transaction and marks the batch applied in it.
//
//	err := pg.InTx(ctx, pool, func(ctx context.Context, tx pgx.Tx) error {
//		b, err := quorum.ProposeTx(ctx, tx, &quorum.ProposeParams{
//			Kind: "firewall_rules", Agent: "planner", Items: []any{rule1, rule2},
//			Voters: []string{"alice", "bob", "carol"}, Quorum: 2, Deadline: deadline,
//		})
//		…
//	})
//
// # States
//
//	               votes (approvals + rejections ≤ voters)
//	              ┌──────┐
//	              ▼      │
//	ProposeTx ──▶ open ──┘
//	              │ │ │
//	              │ │ └─ approvals reach the quorum before the deadline ──▶ committed ──apply job──▶ applied
//	              │ └─── rejections > voters − quorum (quorum unreachable) ─▶ rejected
//	              └───── deadline passes by compute_now() (expiry job) ────▶ expired
//
// # Invariants
//
//   - A batch is decided once: every vote and the expiry lock the batch row and
//     change its state only from open (guarded in the WHERE clause), so many
//     voters voting at once commit it exactly once, with exactly one apply job
//     enqueued by the committing vote's transaction.
//   - A vote counts only if cast before the deadline by compute_now(), on an open
//     batch, by an eligible voter who has not voted: otherwise it is refused and
//     changes nothing. The primary key (batch, voter) and the foreign key to the
//     batch's voters hold the last two whatever the code does.
//   - A committed batch is applied once: the apply transaction locks the batch,
//     runs the applier and marks it applied, fenced by the shard lease and the
//     job's attempt; a crash mid-apply rolls all of it back and the next attempt
//     (another worker, after a takeover) applies it again from scratch.
//
// # Errors
//
// VoteTx returns NOT_FOUND for an unknown batch, INVALID_ARGUMENT for a voter
// who is not eligible, and CONFLICT for a second vote by the same voter, a vote
// on a batch that is no longer open (committed, rejected, expired, applied), or a
// vote at or after the deadline even if the expiry job has not run yet: the
// request was fine, the batch's state refuses it. None of them changes anything.
package quorum
