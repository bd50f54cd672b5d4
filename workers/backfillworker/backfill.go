package backfillworker

import (
	"slices"
	"strings"
	"time"

	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/workers"
)

// Defaults of a Backfill's options.
const (
	// DefaultBatchSize is the default BatchSize, and the size of a run's first
	// batch when BatchSize is larger.
	DefaultBatchSize     = 1000
	DefaultBatchTime     = 25 * time.Millisecond
	DefaultEstimateEvery = 10 * time.Second
	// MaxBatchSize bounds BatchSize: a batch is one transaction.
	MaxBatchSize = 100_000
)

// drainFor is how long one batch job keeps taking batches while they come back
// full, each in its own transaction, before it hands the backfill on to a new
// job: River fetches a queue once per poll interval, so this is what lets a
// backfill run faster than one batch per poll. It is at most half the job's
// timeout.
const drainFor = time.Second

// withDefaults returns b with its zero options defaulted.
func withDefaults(b workers.Backfill) workers.Backfill {
	if b.BatchSize == 0 {
		b.BatchSize = DefaultBatchSize
	}
	if b.BatchTime == 0 {
		b.BatchTime = DefaultBatchTime
	}
	if b.EstimateEvery == 0 {
		b.EstimateEvery = DefaultEstimateEvery
	}
	return b
}

// validate returns INVALID_CONFIG naming what is wrong with b.
func validate(b workers.Backfill) error {
	if err := jobs.ValidateBackfillName(b.Name); err != nil {
		return fault.Wrap(fault.InvalidConfig, err, "bad backfill")
	}
	switch {
	case b.Batch == nil:
		return fault.New(fault.InvalidConfig, "backfill %s has no Batch function", b.Name)
	case b.BatchSize < 0 || b.BatchSize > MaxBatchSize:
		return fault.New(fault.InvalidConfig, "backfill %s: BatchSize %d is out of range (1 to %d, 0 for %d)", b.Name, b.BatchSize, MaxBatchSize, DefaultBatchSize)
	case b.BatchTime < 0:
		return fault.New(fault.InvalidConfig, "backfill %s: BatchTime %s is negative", b.Name, b.BatchTime)
	case b.Pause < 0:
		return fault.New(fault.InvalidConfig, "backfill %s: backfill.Pause %s is negative", b.Name, b.Pause)
	case b.MaxRowsPerSecond < 0:
		return fault.New(fault.InvalidConfig, "backfill %s: MaxRowsPerSecond %g is negative", b.Name, b.MaxRowsPerSecond)
	case b.EstimateEvery < 0:
		return fault.New(fault.InvalidConfig, "backfill %s: EstimateEvery %s is negative", b.Name, b.EstimateEvery)
	case b.Timeout < 0:
		return fault.New(fault.InvalidConfig, "backfill %s: Timeout %s is negative", b.Name, b.Timeout)
	}
	return nil
}

// delayAfter is how long the next batch waits after a batch that handled rows in
// took: the larger of Pause and what MaxRowsPerSecond still asks for.
func delayAfter(b workers.Backfill, rows int, took time.Duration) time.Duration {
	d := b.Pause
	if b.MaxRowsPerSecond > 0 && rows > 0 {
		if r := time.Duration(float64(rows)/b.MaxRowsPerSecond*float64(time.Second)) - took; r > d {
			d = r
		}
	}
	return d
}

// maxBatch is the most rows a batch of b asks for: BatchSize, and with sizing
// by time and a rate limit, no more than MaxRowsPerSecond × BatchTime (at least
// 1), so that the limit spreads small batches rather than waiting out big ones.
func maxBatch(b workers.Backfill) int {
	hi := b.BatchSize
	if !b.FixedBatchSize && b.MaxRowsPerSecond > 0 {
		hi = min(hi, max(1, int(b.MaxRowsPerSecond*b.BatchTime.Seconds())))
	}
	return hi
}

// batchSize is the size the next batch asks for, given the size the last
// committed batch of the run chose (nil: none yet).
func batchSize(b workers.Backfill, chosen *int32) int {
	hi := maxBatch(b)
	switch {
	case b.FixedBatchSize:
		return b.BatchSize
	case chosen == nil:
		return min(hi, DefaultBatchSize)
	}
	return min(max(int(*chosen), 1), hi)
}

// nextBatchSize is the size of the batch after one that asked for cur rows and
// took took, aiming at target per batch: cur × target / took, at least cur/2
// and at most 2 × cur, and between 1 and hi (the chunk-time rule of gh-ost and
// pt-online-schema-change). A batch can grow only by doubling, so one fast
// outlier does not make the next batch huge, and shrink only by halving, so
// one stall does not make it tiny.
func nextBatchSize(cur int, took, target time.Duration, hi int) int {
	cur = max(cur, 1)
	next := 2 * cur
	if took > 0 {
		ideal := float64(cur) * float64(target) / float64(took)
		if ideal < float64(next) {
			next = max(int(ideal), cur/2)
		}
	}
	return min(max(next, 1), max(hi, 1))
}

// kindOf is the River job kind of b's batches: backfill_<name>.
func kindOf(b workers.Backfill) string { return jobs.BackfillBatch{Name: b.Name}.Kind() }

// set is the backfills of one registry (its workers.Part).
type set struct {
	byName map[string]workers.Backfill
	order  []string
	// drain, a test hook, replaces DrainFor (0: DrainFor).
	drain time.Duration
}

func newSet() *set { return &set{byName: map[string]workers.Backfill{}} }

// Install implements workers.Part: it takes the backfills added with
// workers.AddBackfill.
func (s *set) Install(r *workers.Registry) error {
	return workers.OnAdd(r, func(b workers.Backfill) error { return s.add(r, b) })
}

func setOf(r *workers.Registry) *set {
	s, _ := workers.Use(r, newSet) // Install cannot fail: nothing was added yet
	return s
}

// Register adds the backfill module to r: it runs the backfills added with
// workers.AddBackfill. The built-in backfill module registers it in every
// worker process.
func Register(r *workers.Registry) error {
	_, err := workers.Use(r, newSet)
	return err
}

// add registers b: a River worker for its kind, and b among the backfills the
// CLI knows. It returns INVALID_CONFIG for an invalid b or a name registered
// twice.
func (s *set) add(r *workers.Registry, b workers.Backfill) error {
	if err := validate(b); err != nil {
		return err
	}
	if _, dup := s.byName[b.Name]; dup {
		return fault.New(fault.InvalidConfig, "backfill %s is registered twice", b.Name)
	}
	b = withDefaults(b)
	if err := workers.AddWorkerArgs(r, jobs.BackfillBatch{Name: b.Name}, &worker{b: b, set: s}); err != nil {
		return err
	}
	s.byName[b.Name] = b
	s.order = append(s.order, b.Name)
	return nil
}

// Registered returns the backfills registered on r, sorted by name.
func Registered(r *workers.Registry) []workers.Backfill {
	s := setOf(r)
	names := slices.Clone(s.order)
	slices.Sort(names)
	out := make([]workers.Backfill, len(names))
	for i, n := range names {
		out[i] = s.byName[n]
	}
	return out
}

// Lookup returns the backfill registered on r under name, or NOT_FOUND naming
// the ones that are.
func Lookup(r *workers.Registry, name string) (workers.Backfill, error) {
	s := setOf(r)
	if b, ok := s.byName[name]; ok {
		return b, nil
	}
	known := slices.Clone(s.order)
	slices.Sort(known)
	if len(known) == 0 {
		return workers.Backfill{}, fault.New(fault.NotFound, "unknown backfill %q: this binary registers no backfills", name)
	}
	return workers.Backfill{}, fault.New(fault.NotFound, "unknown backfill %q: this binary knows %s", name, strings.Join(known, ", "))
}
