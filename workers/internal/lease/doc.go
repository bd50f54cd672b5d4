// Package lease is fencing by table rows: a lease is (name, owner, epoch,
// expires_at) in compute_leases, taken and renewed by one guarded statement, and a
// fenced transaction proves at its start that its lease is still current.
//
// # Invariants
//
//   - At most one owner holds a name at a time: acquiring succeeds only when the
//     caller already owns the row, the row has expired (by compute_now()), or
//     its owner is a worker incarnation that is gone (below). The statement
//     checks, on the row it locks, that the owner is still the one judged gone,
//     so standbys that judged together take a name once, not in turn.
//   - The epoch goes up exactly when the owner changes, so (owner, epoch) names
//     one holding; a lease is never identified by its owner alone.
//   - Fence runs SELECT … FOR KEY SHARE on the row with the caller's owner and
//     epoch and an unexpired expires_at. A takeover changes the epoch, part of the
//     key (name, epoch), so it needs the row's strongest lock and waits until
//     every fenced transaction of the previous holding has ended; after it, those
//     fences find nothing and return FENCED. A bare EXISTS would not fence under
//     read committed: it takes no lock.
//   - A renewal (Renew) changes only expires_at, so it never waits for the
//     holder's own fenced transactions. (With FOR SHARE it would, and PostgreSQL
//     lets new share lockers overtake a waiting writer: a renewal was measured
//     starving for 16 s under a steady stream of fenced transactions.)
//   - A holder that cannot renew (a GC pause, SIGSTOP, a partition) stops its work
//     by its own clock at expiry: the Keeper reports the loss at once.
//
// # States of a name, as seen by one process
//
//	        Acquire ok (epoch+1 if the owner changed)
//	free ─────────────────────────────────────────▶ held ──Renew ok──▶ held
//	 ▲                                               │
//	 │ Release (expires_at = -infinity), expiry,     │ Renew finds another owner,
//	 │ or the holder's heartbeat lost                │ or expiry passes unrenewed
//	 └───────────────────────────────────────────────┴──────────────▶ lost
//
// Every change of hands is counted in compute_lease_takeovers by why it was
// allowed (Reason…: restart, heartbeat_lost, lease_expired, released), in the
// statement that makes it.
//
// # Keeper
//
// A Keeper owns the leases of one process: it acquires the names it wants
// (retrying a name held by another at the moment that holder's lease expires),
// (or, when the holder is a worker incarnation, at its heartbeat deadline, if
// that comes first), renews all it holds in one statement every renewal
// interval (5 s by default;
// shard and sink leases live 15 s), re-samples the clock anchor at each renewal
// (CLOCK_SKEW beyond 1 s is logged at error level; the leases are kept, since
// fencing and expiry are measured on the database's clock), and calls OnLost at
// once when a lease is lost. After
// every round it calls Kept with the leases it holds, so the holder can do what
// it owes them once per renewal interval (a worker hands back its shards' jobs
// that other processes attempted). Held trusts a holding only until it expires
// by the process's own clock, less a margin (a tenth of the TTL, at most 1 s):
// a process that was paused past its lease stops starting work at once, before
// its next round learns that another owner took the lease. A round that cannot
// reach the database (a restart, a network cut) is retried every
// FailedRoundRetry (100 ms), so leases lost to an outage come back within that of
// the server accepting connections again.
//
// # Worker identities and incarnations
//
// A worker process has an identity, stable across restarts (HOST/SLOT by
// default), and claims a new incarnation of it at every start (Claim): a row of
// compute_workers naming the incarnation number, the process (host, pid, boot id,
// start time) and its last heartbeat. Its lease owner is "IDENTITY#N".
//
//	        Claim: no row, or the previous incarnation is gone
//	(none) ─────────────────────────────────────────────────▶ current(N)
//	                                                             │  │
//	        Claim by a live duplicate: CONFLICT, nothing changes │  │ Retire (graceful stop)
//	        ◀────────────────────────────────────────────────────┘  ▼
//	current(N) ── Claim of N+1 (N gone: exited, silent 3 beats) ──▶ superseded(N)
//
// Invariants:
//
//   - At most one current incarnation per identity: Claim moves the row from N
//     to N+1 by compare-and-set, and only after proving N gone: stopped, its
//     process exited (same host and boot: pid and start time), or silent for
//     three heartbeats (watched for 2.5 s when it ran on another host). A live N
//     makes Claim return CONFLICT.
//   - The current incarnation takes any lease an earlier incarnation of its
//     identity holds at once, expired or not, with a new epoch: the earlier
//     process is fenced exactly as after a takeover, with no TTL to wait.
//   - A superseded incarnation takes and renews nothing (AcquireMany and Renew
//     check compute_workers in the same statement), and its next heartbeat
//     returns CONFLICT, so it stops rather than flap.
//
// # Liveness from the heartbeat
//
// Every incarnation beats (Run) every heartbeat interval (500 ms by default)
// and declares, in compute_workers.dead_after, how long it may be silent: the
// interval times the beats it may miss (4 by default: 2 s). Once its last beat
// is older than that by compute_now(), it is gone for every owner, not only
// for its own identity's next incarnation: any standby takes its leases at
// once, with a new epoch, without waiting out their TTL. The TTL stays the
// upper bound (a row that declares no dead_after, written by an older binary,
// is taken at expiry only; so is an owner that is not a worker incarnation).
//
//	holder beats ──(silent > dead_after)──▶ gone: any owner may take its names
//	     ▲                                     │
//	     └──── a beat again (it was paused) ◀──┘ live again, as a standby: its
//	                                             renewals find its names taken
//
// Invariants:
//
//   - Safety never rests on the heartbeat: a holder judged gone while it was
//     only paused or cut off is fenced as after any takeover (its next fenced
//     transaction finds the new epoch), and its renewal finds the names taken.
//   - A live holder keeps its leases under load: a beat is late only by what
//     delays its statement, and dead_after is several beats (see docs/operating.md,
//     "A standby on another host", for the margins).
//   - A process that beats again after a silence longer than its dead_after
//     (Hooks.Resumed) checks its leases at once (Keeper.Wake), so a paused
//     process learns of a takeover within one round of waking.
//   - Held trusts no holding of a process that doubts its own liveness
//     (KeeperOptions.Liveness, the Incarnation): from the moment it finds it
//     attempted no beat for longer than its dead_after (it was frozen) or a
//     beat ended such a silence, until a round that began after that renewed
//     what it still holds (Confirm). So a process woken from a pause starts
//     no job of a shard a standby may have taken, as after its TTL.
package lease
