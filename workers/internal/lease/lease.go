package lease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
)

// Lease is one holding of a name.
type Lease struct {
	Name      string    `db:"name"`
	Owner     string    `db:"owner"`
	Epoch     int64     `db:"epoch"`
	ExpiresAt time.Time `db:"expires_at"`
}

// acquireSQL takes or renews every name in $1 for owner $2 for $3 seconds: the one
// guarded statement of seed 000, as an upsert so a name needs no row beforehand.
// For each name it returns the holding after the statement: ours when acquired,
// otherwise the current holder's (read before the statement), so a caller can wait
// for it to become takeable (takeable_at).
//
// An owner "<identity>#<n>" ($4, $5) is a worker incarnation: it acts only while
// compute_workers names no other incarnation of its identity (a superseded
// process takes and renews nothing), and it takes a name an earlier incarnation
// of its identity holds at once, unexpired or not: that process is gone (Claim).
//
// Any owner takes, unexpired, a name whose holder is a worker incarnation that
// is gone (cur.gone): superseded by a later incarnation of its identity,
// stopped, or silent for longer than the dead_after it declared. The upsert
// checks that the row still has the owner judged gone, so two standbys that
// judged together do not take it from each other in turn.
//
// A name with no row that the caller did not take comes back with no owner.
// previous_owner is the owner before the statement (the main query sees the
// rows as they were, not the upsert's changes), and reason why the caller could
// take it from that owner (” when it is not a takeover: a first acquisition, a
// renewal, or a name not taken).
const acquireSQL = `
WITH me AS (
    SELECT NOT EXISTS (SELECT 1 FROM compute_workers w
           WHERE w.identity = $4 AND w.incarnation <> $5) AS current
), names AS (
    SELECT DISTINCT unnest($1::text[]) AS name
), cur AS (
    SELECT c.name, c.owner, c.epoch, c.expires_at,
           CASE WHEN w.identity IS NULL THEN NULL
                WHEN c.owner <> w.identity || '#' || w.incarnation THEN 'restart'
                WHEN w.stopped_at IS NOT NULL THEN 'released'
                WHEN w.seen_at + w.dead_after < compute_now() THEN 'heartbeat_lost'
           END AS gone,
           CASE WHEN c.owner = w.identity || '#' || w.incarnation AND w.stopped_at IS NULL
                THEN least(c.expires_at, w.seen_at + w.dead_after)
                ELSE c.expires_at END AS takeable_at
    FROM compute_leases c
    LEFT JOIN compute_workers w ON strpos(c.owner, '#') > 0 AND w.identity = split_part(c.owner, '#', 1)
    WHERE c.name IN (SELECT name FROM names)
), want AS (
    -- A name another owner holds unexpired is not touched unless that owner is
    -- gone: the upsert would lock its row and stall the holder's fenced
    -- transactions for nothing.
    SELECT n.name FROM names n, me
    WHERE me.current
      AND NOT EXISTS (SELECT 1 FROM cur c
                      WHERE c.name = n.name AND c.owner <> $2 AND c.expires_at >= compute_now()
                        AND NOT coalesce(starts_with(c.owner, $4 || '#'), false)
                        AND c.gone IS NULL)
), took AS (
    INSERT INTO compute_leases AS l (name, owner, epoch, expires_at, acquired_at)
    SELECT name, $2, 1, compute_now() + make_interval(secs => $3), compute_now() FROM want
    ON CONFLICT (name) DO UPDATE
       SET owner = EXCLUDED.owner,
           epoch = CASE WHEN l.owner = EXCLUDED.owner THEN l.epoch ELSE l.epoch + 1 END,
           expires_at = EXCLUDED.expires_at,
           acquired_at = CASE WHEN l.owner = EXCLUDED.owner THEN l.acquired_at ELSE EXCLUDED.acquired_at END
     WHERE l.owner = EXCLUDED.owner OR l.expires_at < compute_now()
        OR coalesce(starts_with(l.owner, $4 || '#'), false)
        OR EXISTS (SELECT 1 FROM cur c WHERE c.name = l.name AND c.owner = l.owner AND c.gone IS NOT NULL)
    RETURNING l.name, l.owner, l.epoch, l.expires_at
), res AS (
    SELECT n.name,
       coalesce(t.owner, c.owner, '') AS owner,
       coalesce(t.epoch, c.epoch, 0) AS epoch,
       coalesce(t.expires_at, c.expires_at, 'epoch') AS expires_at,
       coalesce(c.owner, '') AS previous_owner,
       greatest(coalesce(c.takeable_at, 'epoch'), 'epoch') AS takeable_at,
       CASE WHEN t.name IS NULL OR c.owner IS NULL OR c.owner = $2 THEN ''
            WHEN c.expires_at = '-infinity' THEN 'released'
            WHEN coalesce(starts_with(c.owner, $4 || '#'), false) THEN 'restart'
            WHEN c.expires_at < compute_now() THEN 'lease_expired'
            ELSE coalesce(c.gone, 'lease_expired')
       END AS reason
    FROM names n
    LEFT JOIN took t ON t.name = n.name
    LEFT JOIN cur c ON c.name = n.name
), counted AS (
    -- Each takeover counted by its reason, in this statement, so the count
    -- commits with the new epoch.
    INSERT INTO compute_lease_takeovers AS k (reason, count, last_at, last_lease, last_from, last_to)
    SELECT reason, count(*), compute_now(), min(name), min(previous_owner), $2
    FROM res WHERE reason <> '' GROUP BY reason
    ON CONFLICT (reason) DO UPDATE
       SET count = k.count + EXCLUDED.count, last_at = EXCLUDED.last_at,
           last_lease = EXCLUDED.last_lease, last_from = EXCLUDED.last_from, last_to = EXCLUDED.last_to
)
SELECT * FROM res`

// AcquireMany acquires or renews each name for owner for ttl and returns the
// holding of every name after the call (in no particular order): Owner == owner
// means the caller holds it now. A name held by another shows that holding, whose
// ExpiresAt says when to try again.
func AcquireMany(ctx context.Context, db pg.DBTX, names []string, owner string, ttl time.Duration) ([]Lease, error) {
	hs, err := acquireMany(ctx, db, names, owner, ttl)
	if err != nil {
		return nil, err
	}
	out := make([]Lease, len(hs))
	for i, h := range hs {
		out[i] = h.Lease
	}
	return out, nil
}

// holding is a row of acquireSQL: the holding after the statement, the owner
// before it, when a holding of another owner can be taken (its expiry, or its
// holder's heartbeat deadline, whichever comes first), and why the caller took
// it from its previous owner ("" when it did not: see Reason).
type holding struct {
	Lease
	Previous   string    `db:"previous_owner"`
	TakeableAt time.Time `db:"takeable_at"`
	Reason     string    `db:"reason"`
}

func acquireMany(ctx context.Context, db pg.DBTX, names []string, owner string, ttl time.Duration) ([]holding, error) {
	if owner == "" {
		return nil, fault.New(fault.InvalidArgument, "lease owner is empty")
	}
	if ttl <= 0 {
		return nil, fault.New(fault.InvalidArgument, "lease ttl %s is not positive", ttl)
	}
	identity, incarnation := ownerArgs(owner)
	rows, err := db.Query(ctx, acquireSQL, names, owner, ttl.Seconds(), identity, incarnation)
	if err != nil {
		return nil, pg.Translate(fmt.Errorf("error acquiring leases: %w", err))
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByName[holding])
	if err != nil {
		return nil, pg.Translate(fmt.Errorf("error acquiring leases: %w", err))
	}
	return out, nil
}

// Acquire acquires or renews name for owner. It returns CONFLICT, with the
// current holding, when another owner holds it.
func Acquire(ctx context.Context, db pg.DBTX, name, owner string, ttl time.Duration) (Lease, error) {
	ls, err := AcquireMany(ctx, db, []string{name}, owner, ttl)
	if err != nil {
		return Lease{}, err
	}
	if len(ls) != 1 || ls[0].Owner != owner {
		var cur Lease
		if len(ls) == 1 {
			cur = ls[0]
		}
		if cur.Owner == "" {
			return cur, fault.New(fault.Conflict, "lease %s not taken: %s is not its worker identity's current incarnation", name, owner)
		}
		return cur, fault.New(fault.Conflict, "lease %s is held by %s until %s", name, cur.Owner, cur.ExpiresAt.Format(time.RFC3339Nano))
	}
	return ls[0], nil
}

// Release gives up the holdings in ls at once (expires_at = -infinity), so the
// next owner need not wait for the TTL. A holding that is no longer current is
// left alone.
func Release(ctx context.Context, db pg.DBTX, ls ...Lease) error {
	if len(ls) == 0 {
		return nil
	}
	names := make([]string, len(ls))
	owners := make([]string, len(ls))
	epochs := make([]int64, len(ls))
	for i, l := range ls {
		names[i], owners[i], epochs[i] = l.Name, l.Owner, l.Epoch
	}
	_, err := db.Exec(ctx, `
UPDATE compute_leases l SET expires_at = '-infinity'
FROM unnest($1::text[], $2::text[], $3::bigint[]) AS r(name, owner, epoch)
WHERE l.name = r.name AND l.owner = r.owner AND l.epoch = r.epoch`, names, owners, epochs)
	return pg.Translate(err)
}

// List returns the leases whose name starts with prefix, by name. A released
// lease (expires_at = -infinity, which a time.Time cannot hold) has the Unix
// epoch as its ExpiresAt, as AcquireMany reports a name nobody held.
func List(ctx context.Context, db pg.DBTX, prefix string) ([]Lease, error) {
	rows, err := db.Query(ctx, `SELECT name, owner, epoch, greatest(expires_at, 'epoch') AS expires_at FROM compute_leases
		WHERE starts_with(name, $1) ORDER BY name`, prefix)
	if err != nil {
		return nil, pg.Translate(err)
	}
	ls, err := pgx.CollectRows(rows, pgx.RowToStructByName[Lease])
	return ls, pg.Translate(err)
}

// Fence proves, as the first statement of tx, that l is still current: it locks
// the lease row FOR KEY SHARE, so a takeover (which changes the epoch, a key)
// waits for tx to end, while the holder's own renewal (which changes only
// expires_at) does not. It returns FENCED when the row has another owner or
// epoch, or has expired by compute_now().
func FenceTx(ctx context.Context, tx pgx.Tx, l Lease) error {
	var one int
	err := tx.QueryRow(ctx, fenceSQL, l.Name, l.Owner, l.Epoch).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return fault.New(fault.Fenced, "lease %s (owner %s, epoch %d) is no longer held", l.Name, l.Owner, l.Epoch)
	}
	return pg.Translate(err)
}

// fenceSQL is Fence's statement, for callers that send it in a batch with others:
// $1 name, $2 owner, $3 epoch; no row means FENCED.
//
// The lock is FOR KEY SHARE, not FOR SHARE: both hold a takeover back, since a
// takeover changes (name, epoch), a unique key, and so needs the row's strongest
// lock. But FOR SHARE also conflicts with the holder's renewal, and PostgreSQL
// lets new share lockers overtake a waiting writer: under a steady stream of
// fenced transactions a renewal was measured waiting 16 s, past the lease's TTL.
// FOR KEY SHARE lets the renewal through and still fences every takeover.
const fenceSQL = `SELECT 1 FROM compute_leases
WHERE name = $1 AND owner = $2 AND epoch = $3 AND expires_at > compute_now()
FOR KEY SHARE`

// Renew extends the holdings in ls by ttl and returns those still held (same
// owner and epoch, unexpired or not yet taken; for a worker incarnation, while it
// is still its identity's current one). It changes only expires_at, so it never
// waits for the holder's own fenced transactions.
func Renew(ctx context.Context, db pg.DBTX, ttl time.Duration, ls ...Lease) ([]Lease, error) {
	if len(ls) == 0 {
		return nil, nil
	}
	names := make([]string, len(ls))
	epochs := make([]int64, len(ls))
	for i, l := range ls {
		names[i], epochs[i] = l.Name, l.Epoch
	}
	identity, incarnation := ownerArgs(ls[0].Owner)
	rows, err := db.Query(ctx, `
UPDATE compute_leases l SET expires_at = compute_now() + make_interval(secs => $3)
FROM unnest($1::text[], $2::bigint[]) AS r(name, epoch)
WHERE l.name = r.name AND l.epoch = r.epoch AND l.owner = $4
  AND NOT EXISTS (SELECT 1 FROM compute_workers w WHERE w.identity = $5 AND w.incarnation <> $6)
RETURNING l.name, l.owner, l.epoch, l.expires_at`, names, epochs, ttl.Seconds(), ls[0].Owner, identity, incarnation)
	if err != nil {
		return nil, pg.Translate(fmt.Errorf("error renewing leases: %w", err))
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByName[Lease])
	return out, pg.Translate(err)
}
