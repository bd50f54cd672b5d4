package jobs

import (
	"encoding/json"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
)

// CapacityHoldExpiry releases one reservation's hold once it has expired by
// compute_now(), refunding its quota: the capacity module's fenced hold-expiry
// job. domain/capacity.ReserveTx enqueues it in the reservation's transaction,
// scheduled for the hold's expiry, in the shard queue of the pool; the worker
// (workers/capacityworker) snoozes it while the hold is not yet due (an extended hold,
// or a sim clock behind real time) and completes it as a no-op once the
// reservation is no longer a hold.
//
// It is unique by args among live jobs, so the expiry sweep can re-enqueue an
// overdue hold whose job was lost without ever running two at once.
type CapacityHoldExpiry struct {
	PoolID        string `json:"pool_id"`
	ReservationID int64  `json:"reservation_id"`
}

// CapacityHoldExpiryKind is CapacityHoldExpiry's River job kind.
const CapacityHoldExpiryKind = "capacity_hold_expiry"

// Kind implements river.JobArgs.
func (CapacityHoldExpiry) Kind() string { return CapacityHoldExpiryKind }

// InsertOpts makes the job unique by args among live jobs.
func (CapacityHoldExpiry) InsertOpts() river.InsertOpts {
	return river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true, ByState: LiveStates}}
}

// UnmarshalJSON rejects args without a pool or a reservation, so a malformed job
// is cancelled instead of expiring nothing forever.
func (a *CapacityHoldExpiry) UnmarshalJSON(b []byte) error {
	type plain CapacityHoldExpiry
	var p plain
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	if p.PoolID == "" || p.ReservationID <= 0 {
		return invalid("capacity_hold_expiry args need a pool_id and a reservation_id, got %s", b)
	}
	*a = CapacityHoldExpiry(p)
	return nil
}

// LiveStates are the states in which a unique job blocks a duplicate: every
// state but the finished ones, so a cancelled or discarded job can be replaced.
var LiveStates = []rivertype.JobState{
	rivertype.JobStateAvailable, rivertype.JobStatePending, rivertype.JobStateRetryable,
	rivertype.JobStateRunning, rivertype.JobStateScheduled,
}
