package jobs

import (
	"encoding/json"

	"github.com/riverqueue/river"
)

// QuorumApply applies a committed quorum batch with the applier registered for
// its kind, in the fenced job transaction that also marks the batch applied. The
// vote that commits the batch enqueues it in its own transaction
// (domain/quorum.VoteTx), in the shard queue of the batch id; workers/quorum
// works it. BatchKind is informational (River UI shows it); the applier is
// chosen by the batch's stored kind.
type QuorumApply struct {
	BatchID   int64  `json:"batch_id"`
	BatchKind string `json:"batch_kind"`
}

// QuorumApplyKind is QuorumApply's River job kind.
const QuorumApplyKind = "quorum_apply"

// Kind implements river.JobArgs.
func (QuorumApply) Kind() string { return QuorumApplyKind }

// InsertOpts makes the job unique by batch among live jobs.
func (QuorumApply) InsertOpts() river.InsertOpts {
	return river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true, ByState: LiveStates}}
}

// UnmarshalJSON rejects args without a batch id.
func (a *QuorumApply) UnmarshalJSON(b []byte) error {
	type plain QuorumApply
	var p plain
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	if p.BatchID <= 0 {
		return invalid("quorum_apply args need a batch_id, got %s", b)
	}
	*a = QuorumApply(p)
	return nil
}

// QuorumExpiry expires a quorum batch still open at its deadline. ProposeTx
// enqueues it in the proposing transaction, scheduled for the deadline (River
// schedules in real time); the worker checks compute_now() against the deadline
// and snoozes while it is early, so it also works under the sim clock. A batch
// decided before its deadline makes it a no-op.
type QuorumExpiry struct {
	BatchID int64 `json:"batch_id"`
}

// QuorumExpiryKind is QuorumExpiry's River job kind.
const QuorumExpiryKind = "quorum_expiry"

// Kind implements river.JobArgs.
func (QuorumExpiry) Kind() string { return QuorumExpiryKind }

// InsertOpts makes the job unique by batch among live jobs.
func (QuorumExpiry) InsertOpts() river.InsertOpts {
	return river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true, ByState: LiveStates}}
}

// UnmarshalJSON rejects args without a batch id.
func (a *QuorumExpiry) UnmarshalJSON(b []byte) error {
	type plain QuorumExpiry
	var p plain
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	if p.BatchID <= 0 {
		return invalid("quorum_expiry args need a batch_id, got %s", b)
	}
	*a = QuorumExpiry(p)
	return nil
}
