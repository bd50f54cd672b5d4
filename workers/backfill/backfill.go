package backfill

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
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

// DrainFor is how long one batch job keeps taking batches while they come back
// full, each in its own transaction, before it hands the backfill on to a new
// job: River fetches a queue once per poll interval, so this is what lets a
// backfill run faster than one batch per poll. It is at most half the job's
// timeout.
const DrainFor = time.Second

// Backfill is a backfill an application registers: a name and a batch function,
// with options that keep it gentle with the live system.
type Backfill struct {
	// Name identifies the backfill in the CLI, in compute_backfills and in River
	// (its jobs' kind is backfill_<Name>): [a-z][a-z0-9_]{0,62}.
	Name string

	// Batch handles at most batchSize unfinished rows inside tx, the batch's
	// fenced transaction, and returns how many it handled. It must select only
	// unfinished rows (WHERE new_column IS NULL) and write with upserts or guarded
	// updates, so that a retry reaches the same final state. The backfill is done
	// when a batch returns 0. An error rolls the batch back and is retried with
	// backoff (INVALID_ARGUMENT cancels the job instead: the backfill stalls); so
	// does a panic, as INTERNAL_ERROR.
	//
	// Give its selection an index (a partial index WHERE new_column IS NULL, or a
	// cursor of its own kept in a table of its own, in tx): otherwise each batch
	// scans past every row already done and the backfill slows down as it goes.
	Batch func(ctx context.Context, tx pgx.Tx, batchSize int) (rows int, err error)

	// Estimate, optional, returns how many rows are left, for the progress bar's
	// total and the ETA. It runs in the batch's transaction at most every
	// EstimateEvery, and at Start; keep it cheap (a count over a partial index, or
	// the planner's estimate).
	Estimate func(ctx context.Context, db pg.DBTX) (rowsLeft int64, err error)

	// BatchSize is the most rows one batch handles (1 to MaxBatchSize; default
	// 1000). Batches are sized by time up to it (see BatchTime); a run's first
	// batch asks for min(BatchSize, DefaultBatchSize) rows.
	BatchSize int
	// BatchTime is how long a batch should take; default 25 ms. After each
	// batch the next one asks for size × BatchTime / took rows, at least half
	// and at most twice the size, between 1 and BatchSize (and, with
	// MaxRowsPerSecond, at most MaxRowsPerSecond × BatchTime): short
	// transactions that hold their rows briefly, as many rows as that allows.
	BatchTime time.Duration
	// FixedBatchSize turns the sizing off: every batch asks for BatchSize rows.
	FixedBatchSize bool
	// Pause is the least time between the end of a batch and the start of the
	// next; default 0 (the worker's poll interval still separates them).
	Pause time.Duration
	// MaxRowsPerSecond caps the average rate: after a batch of n rows the next
	// waits until n/MaxRowsPerSecond has passed since this one began. 0: no cap.
	MaxRowsPerSecond float64
	// EstimateEvery is how often a batch refreshes the estimate; default 10 s.
	EstimateEvery time.Duration
	// Timeout bounds one batch job; default the worker's job timeout (1 min).
	// A batch still running then is cancelled (its context ends), rolls back
	// and fails with UNAVAILABLE; River retries it.
	Timeout time.Duration

	// drain, for tests, replaces DrainFor (0: DrainFor).
	drain time.Duration
}

// withDefaults returns b with its zero options defaulted.
func (b Backfill) withDefaults() Backfill {
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

// Validate returns INVALID_CONFIG naming what is wrong with b.
func (b Backfill) Validate() error {
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
		return fault.New(fault.InvalidConfig, "backfill %s: Pause %s is negative", b.Name, b.Pause)
	case b.MaxRowsPerSecond < 0:
		return fault.New(fault.InvalidConfig, "backfill %s: MaxRowsPerSecond %g is negative", b.Name, b.MaxRowsPerSecond)
	case b.EstimateEvery < 0:
		return fault.New(fault.InvalidConfig, "backfill %s: EstimateEvery %s is negative", b.Name, b.EstimateEvery)
	case b.Timeout < 0:
		return fault.New(fault.InvalidConfig, "backfill %s: Timeout %s is negative", b.Name, b.Timeout)
	}
	return nil
}

// Delay is how long the next batch waits after a batch that handled rows in
// took: the larger of Pause and what MaxRowsPerSecond still asks for.
func (b Backfill) Delay(rows int, took time.Duration) time.Duration {
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
func (b Backfill) maxBatch() int {
	hi := b.BatchSize
	if !b.FixedBatchSize && b.MaxRowsPerSecond > 0 {
		hi = min(hi, max(1, int(b.MaxRowsPerSecond*b.BatchTime.Seconds())))
	}
	return hi
}

// batchSize is the size the next batch asks for, given the size the last
// committed batch of the run chose (nil: none yet).
func (b Backfill) batchSize(chosen *int32) int {
	hi := b.maxBatch()
	switch {
	case b.FixedBatchSize:
		return b.BatchSize
	case chosen == nil:
		return min(hi, DefaultBatchSize)
	}
	return min(max(int(*chosen), 1), hi)
}

// NextBatchSize is the size of the batch after one that asked for cur rows and
// took took, aiming at target per batch: cur × target / took, at least cur/2
// and at most 2 × cur, and between 1 and hi (the chunk-time rule of gh-ost and
// pt-online-schema-change). A batch can grow only by doubling, so one fast
// outlier does not make the next batch huge, and shrink only by halving, so
// one stall does not make it tiny.
func NextBatchSize(cur int, took, target time.Duration, hi int) int {
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

// Kind is the River job kind of b's batches: backfill_<name>.
func (b Backfill) Kind() string { return jobs.Backfill{Name: b.Name}.Kind() }

// set is the backfills of one registry (its workers.Part).
type set struct {
	byName map[string]Backfill
	order  []string
}

func newSet() *set { return &set{byName: map[string]Backfill{}} }

// Install implements workers.Part: each backfill's worker is added by Register.
func (*set) Install(*workers.Registry) error { return nil }

func setOf(r *workers.Registry) *set {
	s, _ := workers.Use(r, newSet) // Install cannot fail
	return s
}

// Register adds b to the registry: a River worker for its kind, and b to the
// backfills the CLI knows. It returns INVALID_CONFIG for an invalid b or a name
// registered twice.
//
//	func Module() cli.Module {
//		return cli.Module{Name: "inventory", Migrations: …,
//			Register: func(r *workers.Registry) error { return backfill.Add(r, NormalizeNames) }}
//	}
func Add(r *workers.Registry, b Backfill) error {
	if err := b.Validate(); err != nil {
		return err
	}
	s := setOf(r)
	if _, dup := s.byName[b.Name]; dup {
		return fault.New(fault.InvalidConfig, "backfill %s is registered twice", b.Name)
	}
	b = b.withDefaults()
	if err := workers.AddWorkerArgs(r, jobs.Backfill{Name: b.Name}, &worker{b: b}); err != nil {
		return err
	}
	s.byName[b.Name] = b
	s.order = append(s.order, b.Name)
	return nil
}

// Registered returns the backfills registered on r, sorted by name.
func Registered(r *workers.Registry) []Backfill {
	s := setOf(r)
	names := slices.Clone(s.order)
	slices.Sort(names)
	out := make([]Backfill, len(names))
	for i, n := range names {
		out[i] = s.byName[n]
	}
	return out
}

// Lookup returns the backfill registered on r under name, or NOT_FOUND naming
// the ones that are.
func Lookup(r *workers.Registry, name string) (Backfill, error) {
	s := setOf(r)
	if b, ok := s.byName[name]; ok {
		return b, nil
	}
	known := slices.Clone(s.order)
	slices.Sort(known)
	if len(known) == 0 {
		return Backfill{}, fault.New(fault.NotFound, "unknown backfill %q: this binary registers no backfills", name)
	}
	return Backfill{}, fault.New(fault.NotFound, "unknown backfill %q: this binary knows %s", name, strings.Join(known, ", "))
}
