package capacity_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/domain/capacity"
	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/clock"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/capacityworker"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

// tortureSize is the torture test's size: the normal suite runs small, `go tool
// task torture` (BETTER_COMPUTE_TORTURE=large) runs large.
type tortureSize struct {
	Clients, Phases, OpsPerPhase int // every client runs OpsPerPhase operations per phase
	Nodes, PerNode               int // the pool: Nodes × PerNode devices
	Tenants, Quota               int // tenants t0..t(n-1), each with Quota devices
	// StatementTimeout of the test's pool: at the large size, when go tool task
	// torture runs several copies at a load of 20 or more, a reservation can
	// queue on its tenant's quota row (charged first, held to the commit) behind
	// a dozen slowed transactions for longer than the default 15 s. A timeout
	// would fail the run without saying anything about the invariants.
	StatementTimeout time.Duration
}

func tortureSizeFromEnv() (string, tortureSize) {
	if strings.EqualFold(os.Getenv("BETTER_COMPUTE_TORTURE"), "large") {
		return "large", tortureSize{Clients: 64, Phases: 8, OpsPerPhase: 60, Nodes: 4, PerNode: 5, Tenants: 6, Quota: 6, StatementTimeout: 2 * time.Minute}
	}
	return "small", tortureSize{Clients: 32, Phases: 3, OpsPerPhase: 16, Nodes: 3, PerNode: 4, Tenants: 4, Quota: 5}
}

// tortureTTL is the holds' TTL; during a phase the sim clock moves every
// tortureTickEvery by the real time elapsed, so holds lapse while clients still
// confirm, extend and release them and the expiry jobs run. The sim clock runs
// at real speed, never faster: shard leases expire by compute_now() too, and
// the worker's (tortureLeaseTTL, renewed every tortureLeaseRenew of real time)
// must not lapse because the machine is slow.
const (
	tortureTTL        = 2 * time.Second
	tortureTickEvery  = 50 * time.Millisecond
	tortureLeaseTTL   = 10 * time.Second
	tortureLeaseRenew = time.Second
)

// TestTorture runs many concurrent clients reserving, confirming, extending and
// releasing devices of a small pool over overlapping ranges (so conflicts are
// frequent) while the sim clock moves, holds lapse and the fenced expiry job
// releases them, and an operator drains and reactivates nodes. After every phase
// and at the end it checks, by queries on the tables: no two live bookings of a
// device overlap; node resources, pool rollups and quota usage equal a recount;
// no quota was ever exceeded (also sampled during the phases); no deadlock
// (SQLSTATE 40P01) anywhere; and every lapsed hold was expired exactly once.
func TestTorture(t *testing.T) {
	t.Parallel()
	sizeName, size := tortureSizeFromEnv()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{MaxConns: int32(size.Clients + 24), StatementTimeout: size.StatementTimeout})
	require.NoError(t, clock.UseSim(ctx, db.Pool, t0))
	fx := newForensics(t, db)
	var stats opStats
	defer func() { // for go tool task torture, pass or fail
		t.Logf("torture result: reservations=%d violations=%d", stats.get("reserve", "ok"), fx.violations.Load())
	}()

	tenants := map[string]int{}
	for i := 0; i < size.Tenants; i++ {
		tenants[fmt.Sprintf("t%d", i)] = size.Quota
	}
	links := map[string][]int{}
	for i := 0; i+1 < size.Nodes*size.PerNode; i += 2 {
		links[fmt.Sprintf("pair%02d", i/2)] = []int{i, i + 1} // pairs
	}
	links["group"] = []int{0, 3, 5, 6} // and a group across nodes
	makePool(t, db, poolSpec{ID: "p", Nodes: size.Nodes, PerNode: size.PerNode, Tenants: tenants, Links: links})

	// An audit of every state change of a reservation, written by a trigger (not
	// by the code under test), with the sim time it happened at.
	db.MustExec(t, `CREATE TABLE torture_transitions (reservation_id bigint, from_state text, to_state text, at_sim timestamptz DEFAULT compute_now())`)
	db.MustExec(t, `CREATE FUNCTION torture_log() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state <> OLD.state THEN
        INSERT INTO torture_transitions (reservation_id, from_state, to_state) VALUES (NEW.id, OLD.state, NEW.state);
    END IF;
    RETURN NEW;
END $$`)
	db.MustExec(t, `CREATE TRIGGER torture_log AFTER UPDATE ON capacity_reservations FOR EACH ROW EXECUTE FUNCTION torture_log()`)

	reg := workers.NewRegistry()
	require.NoError(t, capacityworker.Register(reg, &capacityworker.Options{SweepEvery: -1}))
	// The pool's expiry jobs all go to its shard: serve only that one, so the
	// worker does not poll fifteen idle queues.
	rt := workertest.Start(t, db.Pool, reg, &workers.Options{Shards: []int{jobs.ShardOf("p", pgtest.DefaultShardCount)},
		LeaseTTL: tortureLeaseTTL, LeaseRenew: tortureLeaseRenew})

	var (
		deadlocks atomic.Int64
		known     knownReservations
	)
	start := time.Now()
	for phase := 1; phase <= size.Phases; phase++ {
		phaseStart := time.Now()
		stop := make(chan struct{})
		var bg sync.WaitGroup
		var monitorViolations atomic.Int64
		bg.Add(3)
		go func() { // the sim clock moves: holds lapse mid-phase
			defer bg.Done()
			tick := time.NewTicker(tortureTickEvery)
			defer tick.Stop()
			last := time.Now()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
					elapsed := time.Since(last)
					last = last.Add(elapsed)
					if _, err := clock.Advance(ctx, db.Pool, elapsed); err != nil {
						t.Errorf("advancing the sim clock: %v", err)
						return
					}
				}
			}
		}()
		go func() { // an operator drains and reactivates nodes
			defer bg.Done()
			rng := rand.New(rand.NewPCG(uint64(phase), 7))
			for {
				select {
				case <-stop:
					return
				case <-time.After(30 * time.Millisecond):
				}
				state := capacity.NodeActive
				if rng.IntN(3) == 0 {
					state = capacity.NodeDraining
				}
				node := nodeName("p", rng.IntN(size.Nodes))
				err := pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
					return capacity.SetNodeStateTx(ctx, tx, &capacity.SetNodeStateParams{NodeID: node, State: state})
				})
				stats.record("node_state", err, &deadlocks, t)
			}
		}()
		go func() { // a monitor samples the quota and overlap invariants during the phase
			defer bg.Done()
			for {
				select {
				case <-stop:
					return
				case <-time.After(20 * time.Millisecond):
				}
				for _, name := range []string{"quota usage over its limit (by recount)", "overlapping live bookings of one device"} {
					var n int
					if err := db.QueryRow(ctx, invariantQueries[name]).Scan(&n); err != nil {
						t.Errorf("monitor: %v", err)
						return
					}
					if n > 0 {
						monitorViolations.Add(1)
						fx.violation(t, "phase %d, mid-phase: %d %s", phase, n, name)
					}
				}
			}
		}()

		var clients sync.WaitGroup
		for c := 0; c < size.Clients; c++ {
			clients.Add(1)
			go func(c int) {
				defer clients.Done()
				rng := rand.New(rand.NewPCG(uint64(phase), uint64(c)))
				for i := 0; i < size.OpsPerPhase; i++ {
					tortureOp(ctx, t, db, rng, &known, &stats, &deadlocks, size)
				}
			}(c)
		}
		clients.Wait()
		close(stop)
		bg.Wait()
		opsDone := time.Now()

		// Every hold lapses; the expiry jobs release them all.
		_, err := clock.Advance(ctx, db.Pool, time.Hour)
		require.NoError(t, err)
		workertest.WaitFor(t, 60*time.Second, fmt.Sprintf("phase %d: every lapsed hold expired", phase), func() bool {
			return db.MustCount(t, `SELECT count(*) FROM capacity_reservations WHERE state = 'hold' AND expires_at <= compute_now()`) == 0
		})
		fx.checkInvariants(t, fmt.Sprintf("after phase %d", phase))
		checkExpiredOnce(t, fx, fmt.Sprintf("after phase %d", phase))
		require.Zero(t, deadlocks.Load(), "deadlocks (40P01) after phase %d", phase)
		require.Zero(t, monitorViolations.Load())
		t.Logf("phase %d: operations %s, then expiry and checks %s", phase, opsDone.Sub(phaseStart).Round(time.Millisecond), time.Since(opsDone).Round(time.Millisecond))
	}
	elapsed := time.Since(start)

	require.NoError(t, rt.Stop(ctx))
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM river_job j, jsonb_array_elements(to_jsonb(j.errors)) e WHERE e->>'error' LIKE '%40P01%' OR e->>'error' LIKE '%deadlock%'`),
		"jobs that failed on a deadlock")
	// The server's own count: every backend of the database has exited (and
	// flushed its statistics) once the pool is closed.
	db.Pool.Reset()
	workertest.WaitFor(t, 20*time.Second, "the test's backends to exit", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`) == 0
	})
	require.Zero(t, db.MustCount(t, `SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()`), "deadlocks counted by the server")

	expired := db.MustCount(t, `SELECT count(*) FROM capacity_reservations WHERE state = 'expired'`)
	require.Positive(t, expired, "holds expired")
	t.Logf("torture %s: %d clients × %d phases × %d ops in %s; %s; %d holds expired by the job",
		sizeName, size.Clients, size.Phases, size.OpsPerPhase, elapsed.Round(time.Millisecond), stats.String(), expired)
	require.Positive(t, stats.get("reserve", "CONFLICT"), "conflicts must be frequent")
	require.Positive(t, stats.get("reserve", "ok"))
	require.Positive(t, stats.get("extend", "ok"))
	require.Positive(t, stats.get("confirm", "ok"))
	require.Positive(t, stats.get("release", "ok"))
}

// checkExpiredOnce checks the audit: no reservation left the live states twice,
// every expired one was expired once, from hold, at or after its expiry, and no
// ended one came back.
func checkExpiredOnce(t *testing.T, fx *forensics, when string) {
	t.Helper()
	checks := map[string]string{
		"reservations ended more than once": `
SELECT count(*) FROM (SELECT reservation_id FROM torture_transitions WHERE to_state IN ('released', 'expired')
                       GROUP BY reservation_id HAVING count(*) > 1) x`,
		"expired reservations without exactly one expiry": `
SELECT count(*) FROM capacity_reservations r
 WHERE r.state = 'expired'
   AND (SELECT count(*) FROM torture_transitions x WHERE x.reservation_id = r.id AND x.to_state = 'expired' AND x.from_state = 'hold') <> 1`,
		"expiries before the hold lapsed": `
SELECT count(*) FROM torture_transitions x JOIN capacity_reservations r ON r.id = x.reservation_id
 WHERE x.to_state = 'expired' AND x.at_sim < r.expires_at`,
		"transitions out of an ended state": `
SELECT count(*) FROM torture_transitions WHERE from_state IN ('released', 'expired')`,
	}
	for name, q := range checks {
		if n := fx.db.MustCount(t, q); n != 0 {
			fx.violation(t, "%s: %d %s", when, n, name)
		}
	}
}

type knownReservations struct {
	mu  sync.Mutex
	ids []int64
}

func (k *knownReservations) add(id int64) {
	k.mu.Lock()
	k.ids = append(k.ids, id)
	k.mu.Unlock()
}

// pick returns a random recent reservation (recent ones are the live ones).
func (k *knownReservations) pick(rng *rand.Rand) (int64, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.ids) == 0 {
		return 0, false
	}
	n := min(len(k.ids), 40)
	return k.ids[len(k.ids)-1-rng.IntN(n)], true
}

// tortureOp runs one random operation in a transaction of its own.
func tortureOp(ctx context.Context, t *testing.T, db *pgtest.DB, rng *rand.Rand, known *knownReservations, stats *opStats, deadlocks *atomic.Int64, size tortureSize) {
	op := "reserve"
	switch x := rng.IntN(100); {
	case x < 40:
	case x < 55:
		op = "confirm"
	case x < 78:
		op = "extend"
	default:
		op = "release"
	}
	id, ok := known.pick(rng)
	if !ok {
		op = "reserve"
	}
	var err error
	switch op {
	case "reserve":
		from := rng.IntN(12)
		var r *capacity.Reservation
		r, err = reserve(t, db.Pool, capacity.ReserveParams{
			PoolID: "p", Tenant: fmt.Sprintf("t%d", rng.IntN(size.Tenants)),
			Devices: 1 + rng.IntN(3)*rng.IntN(2), Linked: rng.IntN(4) == 0,
			Start: t0.Add(time.Duration(from) * time.Hour), End: t0.Add(time.Duration(from+1+rng.IntN(4)) * time.Hour),
			TTL: tortureTTL,
		})
		if err == nil {
			known.add(r.ID)
			stats.addRetries(r.Retries)
		}
	case "confirm":
		_, err = inTx(t, db.Pool, func(tx pgx.Tx) (*capacity.Reservation, error) {
			return capacity.ConfirmTx(ctx, tx, &capacity.ConfirmParams{ReservationID: id})
		})
	case "extend":
		var r *capacity.Reservation
		if r, err = capacity.Get(ctx, db.Pool, id); err == nil {
			p := &capacity.ExtendParams{ReservationID: id, Version: r.Version, By: tortureTTL}
			if rng.IntN(3) == 0 {
				p.End = r.End.Add(time.Hour)
			}
			_, err = inTx(t, db.Pool, func(tx pgx.Tx) (*capacity.Reservation, error) { return capacity.ExtendTx(ctx, tx, p) })
		}
	case "release":
		_, err = inTx(t, db.Pool, func(tx pgx.Tx) (*capacity.Reservation, error) {
			return capacity.ReleaseTx(ctx, tx, &capacity.ReleaseParams{ReservationID: id})
		})
	}
	stats.record(op, err, deadlocks, t)
}

// opStats counts outcomes by operation.
type opStats struct {
	mu      sync.Mutex
	n       map[string]map[string]int
	retries int
}

func (s *opStats) record(op string, err error, deadlocks *atomic.Int64, t *testing.T) {
	outcome := "ok"
	if err != nil {
		outcome = string(fault.CodeOf(err))
		if pg.SQLState(err) == "40P01" {
			deadlocks.Add(1)
			outcome = "DEADLOCK"
		}
		if outcome != string(fault.Conflict) {
			t.Errorf("%s: unexpected error: %v", op, err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n == nil {
		s.n = map[string]map[string]int{}
	}
	if s.n[op] == nil {
		s.n[op] = map[string]int{}
	}
	s.n[op][outcome]++
}

func (s *opStats) addRetries(n int) {
	s.mu.Lock()
	s.retries += n
	s.mu.Unlock()
}

func (s *opStats) get(op, outcome string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n[op][outcome]
}

func (s *opStats) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ops []string
	for op := range s.n {
		ops = append(ops, op)
	}
	sort.Strings(ops)
	var b strings.Builder
	for _, op := range ops {
		fmt.Fprintf(&b, "%s %v; ", op, s.n[op])
	}
	fmt.Fprintf(&b, "device retries %d", s.retries)
	return b.String()
}
