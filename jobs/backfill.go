package jobs

import (
	"encoding/json"
	"regexp"
)

// BackfillBatch is the River job that runs one batch of a backfill (workers/backfillworker).
// Its kind is BackfillKindPrefix + Name, one kind per backfill, so that River UI
// lists each backfill's jobs under their own kind; every backfill job also carries
// the tag "backfill". A backfill inserts its own jobs (start, resume, and each
// batch the next one), never an application.
//
// Epoch and Batch guard the backfill's progress row: a job runs only while the
// backfill is running with this epoch and has committed exactly Batch batches,
// so a stale or duplicate job finds its batch taken and completes doing nothing.
type BackfillBatch struct {
	Name  string `json:"name"`
	Epoch int64  `json:"epoch"`
	Batch int64  `json:"batch"`
}

// BackfillKindPrefix starts the kind of every backfill job: backfill_<name>.
const BackfillKindPrefix = "backfill_"

// backfillTag is the River tag every backfill job carries.
const backfillTag = "backfill"

// Kind implements river.JobArgs: backfill_<name>.
func (b BackfillBatch) Kind() string { return BackfillKindPrefix + b.Name }

// UnmarshalJSON rejects args without a valid name, epoch or batch, so a
// malformed job fails at decode (and is cancelled) instead of running anything.
func (b *BackfillBatch) UnmarshalJSON(data []byte) error {
	type plain BackfillBatch
	var p plain
	if err := json.Unmarshal(data, &p); err != nil {
		return err
	}
	if err := ValidateBackfillName(p.Name); err != nil {
		return err
	}
	if p.Epoch < 1 || p.Batch < 0 {
		return invalid("backfill %s job args: epoch %d, batch %d out of range", p.Name, p.Epoch, p.Batch)
	}
	*b = BackfillBatch(p)
	return nil
}

var backfillNameRe = regexp.MustCompile(`^[a-z][a-z0-9_]{0,62}$`)

// ValidateBackfillName checks a backfill name: lowercase letters, digits and _,
// at most 63 characters, starting with a letter.
func ValidateBackfillName(name string) error {
	if !backfillNameRe.MatchString(name) {
		return invalid("backfill name %q: want [a-z][a-z0-9_]{0,62}", name)
	}
	return nil
}

// BackfillShardKey is the key whose shard queue runs the backfill's jobs:
// backfill/<name> (see ShardQueueOfTx).
func BackfillShardKey(name string) string { return "backfill/" + name }
