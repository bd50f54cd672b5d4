// Package capacity books devices over time ranges: pools of nodes (active,
// draining, down) that hold devices, links between devices that can be booked
// together, tenants' quotas per pool, and reservations of devices over a
// tstzrange, as guarded SQL that runs in the caller's transaction.
//
// Every function takes its transaction explicitly and never begins or commits
// one: those whose name ends in Tx take a pgx.Tx (several statements that must
// commit together; the ones that can fail after writing run in a savepoint, so an
// error leaves the transaction as it was), the others a pg.DBTX (one statement).
// Reservations enqueue their expiry job in the same transaction.
//
//	err := pg.InTx(ctx, pool, func(ctx context.Context, tx pgx.Tx) error {
//		r, err := capacity.ReserveTx(ctx, tx, &capacity.ReserveParams{
//			PoolID: "gpu-eu", Tenant: "acme", Devices: 2, Linked: true,
//			Start: from, End: from.Add(4 * time.Hour), TTL: 10 * time.Minute,
//		})
//		…
//	})
//
// # Invariants
//
//   - No two live bookings (hold or confirmed) of one device overlap in time.
//     The exclusion constraint capacity_bookings_no_overlap, EXCLUDE USING gist
//     over device_id and during for the live states, holds it whatever the code
//     does; the code never leaves it to chance either: every writer of a
//     device's bookings locks the device first, so a booking lost to a
//     concurrent reservation is found under the lock (the fast path's 23P01,
//     the slow path's ON CONFLICT DO NOTHING), a retry on the next device or
//     CONFLICT, never an INTERNAL_ERROR.
//   - Only the constraint's own checks scan its GiST index. Its columns and
//     predicate are expressions no query names (migrations/capacity/0008), so
//     the planner cannot choose it, and device lookups use the btree index
//     capacity_bookings_device_live. PostgreSQL 15's GiST scans, rescanned as
//     the inner side of a nested loop across a split of the index's root, mark
//     live entries dead (docs/postgres-gist-killitems.sql reproduces it): the
//     constraint then misses them and admits an overlap. That was the torture
//     test's rare violation; TestOverlapConstraintSurvivesRescansAcrossItsIndexSplit
//     forces such plans and checks every booking still refuses its overlap.
//   - A tenant's quota usage in a pool equals its live bookings there and never
//     exceeds its limit (a CHECK makes an overdraft impossible).
//   - Every node's resources and every pool's capacity rollup equal a recount of
//     devices and live bookings, at every commit.
//   - Only active nodes take new bookings; a draining or down node keeps the
//     ones it has.
//   - A reservation leaves the live states once: released by its owner or
//     expired by the hold-expiry job, whichever comes first; the quota is
//     refunded by that one transition.
//   - A hold is extended one extension at a time: an extension names the
//     version it read, so a concurrent second extension gets CONFLICT instead
//     of overwriting the first.
//
// # Lock order
//
// Every transaction that locks several capacity rows takes them in this order,
// so concurrent reservations, confirmations, extensions, releases, expiries and
// node changes never wait on each other in a cycle (the torture test counts
// deadlocks, SQLSTATE 40P01: zero):
//
//	quota_usage → pools → nodes → devices → node_resources → pool_capacity_rollup
//
// A reservation and its bookings are locked at the devices step, after the
// devices they book. Several rows of one table are locked in key order (devices
// by id, quota rows by tenant, reservations by id, node resources by node, rollup
// stripes by stripe). The pool rollup is striped over 8 rows (a node's counts
// always go to stripe capacity_stripe(node)), so changes on different nodes do
// not all queue on one row; Capacity sums the stripes. Reserve charges the quota
// first (and takes the pool's key-share lock through the new reservation's
// foreign key); release and expiry lock the quota row first and refund it in the
// same transaction.
//
//	ReserveTx       quota_usage, pools (key share), devices (id order), its bookings, node_resources, rollup
//	ConfirmTx       devices (id order), reservation and bookings, node_resources, rollup
//	ExtendTx        devices (id order), reservation and bookings
//	ReleaseTx       quota_usage, reservation and bookings, node_resources, rollup
//	ExpireHoldsTx   quota_usage (tenant order), reservations (id order) and bookings, node_resources, rollup
//	SetNodeStateTx  nodes, devices (id order, marked bookable or not), node_resources, rollup
//	AddDeviceTx     nodes (share), devices, node_resources, rollup
//
// Every writer of a device's bookings holds the device's lock, so two of them
// are never in flight on one device at once: PostgreSQL's exclusion check never
// waits on another in-flight booking (two such waits could deadlock). A
// reservation first books devices nobody holds (SKIP LOCKED, one statement),
// from a random point of the pool's node-by-node order so that concurrent
// reservations spread over the nodes; only if that finds too few does it wait
// for the others, in device id order, having rolled back what it took.
//
// # Reservations
//
//	        ReserveTx (quota charged, devices booked, expiry job enqueued)
//	             │
//	             ▼            ExtendTx (version guard: one at a time)
//	           hold ◀──────────────┐
//	          │ │ │ └──────────────┘
//	ConfirmTx │ │ └── expires_at passes (compute_now()) ──▶ hold-expiry job ──▶ expired
//	          │ │                                                         (quota refunded)
//	          ▼ └── ReleaseTx ─────────────────────────────────────────▶ released
//	     confirmed ── ReleaseTx ───────────────────────────────────────▶ released
//	                                                                      (quota refunded)
//
// A lapsed hold cannot be confirmed or extended, but keeps its devices until the
// expiry job (workers/capacityworker) releases it, seconds later; its owner may
// release it first. The job is scheduled for the hold's expiry in real time and
// checks compute_now(), snoozing while the hold is not due, so holds expire under
// the sim clock too.
package capacity
