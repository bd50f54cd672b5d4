package workers

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river/rivertype"

	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/workers/internal/lease"
	"github.com/bettercompute/bettercompute/workers/internal/riverjob"
)

// A batch that takes its keys in its own transaction (see "How reconciles
// run" in reconcile.go).

// takeKey names a dirty row: reconciler kind and key.
type takeKey struct{ kind, key string }

// inFlight is the keys of one shard that its batches have taken and not yet
// ended. Its lock is held across a take statement, so the takes of a shard's
// batches never overlap and a key is taken by one batch at a time.
type inFlight struct {
	mu   sync.Mutex
	keys map[takeKey]struct{}
	// last is the group (a tenant, "" for none) the shard's last take served:
	// the next take serves the first group after it (round-robin).
	last string
}

// skip returns the keys in flight as the two aligned arrays TakeDirtySQL
// skips. The caller holds f.mu.
func (f *inFlight) skip() (kinds, keys []string) {
	kinds, keys = make([]string, 0, len(f.keys)), make([]string, 0, len(f.keys))
	for k := range f.keys {
		kinds, keys = append(kinds, k.kind), append(keys, k.key)
	}
	return kinds, keys
}

// taking is one batch's part in its shard's takes.
type taking struct {
	shard  int
	kinds  []string
	sizes  []int
	flight *inFlight
	mine   []takeKey
	tenant string      // the tenant of the keys taken ("" for none)
	took   chan<- bool // told once, after the first take: whether it came back full
}

// report tells the claim loop how the first take went (nothing more after).
func (t *taking) report(full bool) {
	if t.took != nil {
		t.took <- full
		t.took = nil
	}
}

// takeSQL, when set, is the statement a take runs in place of TakeDirtySQL
// (with the same arguments and columns): only for the benchmark that measures
// what compute_take_fair costs work of no tenant against the take before it
// (export_test.go).
var takeSQL atomic.Pointer[string]

// take runs TakeDirtySQL in tx for the batch, first giving back the keys an
// earlier take of the batch held (a redo takes afresh). It returns the rows
// taken (nil if none is due), and FENCED when the lease is not held.
func (t *taking) take(ctx context.Context, tx pgx.Tx, l lease.Lease) (kind string, claimed []claimedKey, links []int32, err error) {
	t.flight.mu.Lock()
	defer t.flight.mu.Unlock()
	t.release()
	t.tenant = ""
	skipKinds, skipKeys := t.flight.skip()
	sql := riverjob.TakeDirtySQL
	if p := takeSQL.Load(); p != nil {
		sql = *p
	}
	rows, err := tx.Query(ctx, sql, t.shard, l.Name, l.Owner, l.Epoch, t.kinds, t.sizes, skipKinds, skipKeys, t.flight.last)
	if err != nil {
		return "", nil, nil, pg.Translate(fmt.Errorf("error taking the dirty keys of shard %d: %w", t.shard, err))
	}
	fenced := false
	for rows.Next() {
		var k, tenant *string
		var c claimedKey
		var n *int32
		if err := rows.Scan(&k, &c.key, &c.gen, &c.dirtied, &c.causes, &n, &tenant); err != nil {
			rows.Close()
			return "", nil, nil, err
		}
		if k == nil {
			fenced = true
			continue
		}
		kind = *k
		if tenant != nil {
			t.tenant = *tenant
		}
		claimed, links = append(claimed, c), append(links, *n)
	}
	if err := rows.Err(); err != nil {
		return "", nil, nil, pg.Translate(fmt.Errorf("error taking the dirty keys of shard %d: %w", t.shard, err))
	}
	if fenced {
		return "", nil, nil, fault.New(fault.Fenced, "shard %d: lease %s (owner %s, epoch %d) is no longer held", t.shard, l.Name, l.Owner, l.Epoch)
	}
	if len(claimed) > 0 {
		t.flight.last = t.tenant
	}
	for _, c := range claimed {
		k := takeKey{kind, c.key}
		t.flight.keys[k] = struct{}{}
		t.mine = append(t.mine, k)
	}
	full := false
	for i, k := range t.kinds {
		if k == kind {
			full = len(claimed) >= t.sizes[i]
		}
	}
	t.report(full)
	return kind, claimed, links, nil
}

// release gives back the keys the batch took. The caller holds t.flight.mu.
func (t *taking) release() {
	for _, k := range t.mine {
		delete(t.flight.keys, k)
	}
	t.mine = t.mine[:0]
}

// takeSeq numbers the batches that take their keys, for what names a batch by
// a job id (tracking, logs): negative, so it is never a River job's.
var takeSeq atomic.Int64

// takeBatch runs one batch of shard that takes its keys in its own
// transaction, as River would run a job: tracked (a lost lease or the end of
// the stop grace cancels it), within the job timeout, its outcome counted. It
// tells t.took whether its first take came back full.
func (rt *Runtime) takeBatch(l lease.Lease, queue string, t *taking) {
	defer func() {
		t.report(false)
		t.flight.mu.Lock()
		t.release()
		t.flight.mu.Unlock()
	}()
	now := time.Now()
	row := &rivertype.JobRow{ID: -takeSeq.Add(1), Attempt: 1, AttemptedAt: &now, Queue: queue, Kind: jobs.ReconcileBatchKind}
	ctx, cancel := context.WithCancelCause(context.WithValue(rt.runCtx, runtimeKey{}, rt))
	ctx, cancelTimeout := context.WithTimeout(ctx, rt.o.jobTimeout())
	rt.track(queue, row.ID, cancel)
	defer func() {
		rt.untrack(queue, row.ID)
		cancelTimeout()
		cancel(nil)
	}()
	start := time.Now()
	took, err := redoKeys(ctx, rt, l, row, &batchRun{take: t}, nil)
	if err == nil && !took {
		return // nothing was due
	}
	outcome := "completed"
	if err != nil {
		outcome = "failed"
		if fault.Has(err, fault.Fenced) {
			outcome = "fenced"
		}
		rt.log.Warn().Err(rt.redactErr(err)).Str("queue", queue).
			Msg("reconcile batch did not commit; its keys wait for the next batch")
	}
	rt.metrics.jobDone(jobs.ReconcileBatchKind, queue, outcome, time.Since(start))
}

// runTaken is run for a batch that takes its keys: the take (which fences
// the lease), each reconcile, then one round trip that deletes the rows
// still at the gen read and keeps the others waiting.
func (b *batchRun) runTaken(ctx context.Context, rt *Runtime, tx pgx.Tx, l lease.Lease, row *rivertype.JobRow) error {
	b.restart()
	kind, claimed, links, err := b.take.take(ctx, tx, l)
	b.kind = kind
	if err != nil {
		if fault.Has(err, fault.Fenced) {
			_, b.span = reconcileSpan(ctx, rt.TracerProvider(), l, row, "", "", nil)
		}
		return err
	}
	if len(claimed) == 0 {
		return nil
	}
	rec := rt.o.Registry.reconcilers[kind]
	if b.take.tenant != "" {
		ctx = jobs.WithTenant(ctx, b.take.tenant) // what the reconciles enqueue is the tenant's
	}
	ctx, b.span = reconcileSpan(ctx, rt.TracerProvider(), l, row, kind, "", claimed)
	keys, gens, err := b.reconcileAll(ctx, tx, rec, claimed)
	if err != nil {
		return err
	}
	var n int64
	if err := tx.QueryRow(ctx, riverjob.FinishTakenSQL, kind, keys, gens, links).Scan(&n); err != nil {
		return fmt.Errorf("error finishing the reconciles of %s: %w", kind, err)
	}
	if n != int64(len(keys)) {
		return fault.New(fault.Fenced, "shard %d: %d of the %d keys this batch took are no longer waiting", b.take.shard, int64(len(keys))-n, len(keys))
	}
	return b.requeue(ctx, tx, kind)
}
