package lease

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/bettercompute/bettercompute/platform/pg"
)

// Worker is what compute_workers and compute_leases say of one worker
// identity's current incarnation, for doctor and the metrics.
type Worker struct {
	Identity    string
	Incarnation int64
	Host        string
	PID         int
	Silent      time.Duration // since its last heartbeat, by compute_now()
	DeadAfter   time.Duration // 0: it declared none (a binary before heartbeat takeovers)
	Leases      int           // unexpired leases it holds
}

// workerStatus is a row of Workers' query.
type workerStatus struct {
	Identity    string  `db:"identity"`
	Incarnation int64   `db:"incarnation"`
	Host        string  `db:"host"`
	PID         int     `db:"pid"`
	Silent      float64 `db:"silent_secs"`
	DeadAfter   float64 `db:"dead_after_secs"`
	Leases      int     `db:"leases"`
}

// Owner is the lease owner of the incarnation.
func (w Worker) Owner() string { return ownerOf(w.Identity, w.Incarnation) }

// Silenced says whether other owners may take its leases now: it has been
// silent past the dead_after it declared.
func (w Worker) Silenced() bool { return w.DeadAfter > 0 && w.Silent > w.DeadAfter }

// Workers lists the worker identities that have not stopped and either beat
// within recent (a process killed long ago drops out) or still hold an
// unexpired lease, by identity.
func Workers(ctx context.Context, db pg.DBTX, recent time.Duration) ([]Worker, error) {
	rows, err := db.Query(ctx, `
SELECT w.identity, w.incarnation, w.host, w.pid,
       extract(epoch FROM compute_now() - w.seen_at)::float8 AS silent_secs,
       coalesce(extract(epoch FROM w.dead_after)::float8, 0) AS dead_after_secs,
       h.leases
FROM compute_workers w,
LATERAL (SELECT count(*)::int AS leases FROM compute_leases l
         WHERE l.owner = w.identity || '#' || w.incarnation AND l.expires_at > compute_now()) h
WHERE w.stopped_at IS NULL
  AND (w.seen_at > compute_now() - make_interval(secs => $1) OR h.leases > 0)
ORDER BY w.identity`, recent.Seconds())
	if err != nil {
		return nil, pg.Translate(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByName[workerStatus])
	if err != nil {
		return nil, pg.Translate(err)
	}
	ws := make([]Worker, len(got))
	for i, r := range got {
		ws[i] = Worker{Identity: r.Identity, Incarnation: r.Incarnation, Host: r.Host, PID: r.PID,
			Silent: secs(r.Silent), DeadAfter: secs(r.DeadAfter), Leases: r.Leases}
	}
	return ws, nil
}

// Takeover is one reason's row of compute_lease_takeovers: how many leases
// changed hands for it (Reason is one of the Reason… constants), and the last
// one.
type Takeover struct {
	Reason    string    `db:"reason"`
	Count     int64     `db:"count"`
	LastAt    time.Time `db:"last_at"`
	LastLease string    `db:"last_lease"`
	LastFrom  string    `db:"last_from"`
	LastTo    string    `db:"last_to"`
}

// Takeovers returns the takeovers counted so far, by reason.
func Takeovers(ctx context.Context, db pg.DBTX) ([]Takeover, error) {
	rows, err := db.Query(ctx, `SELECT reason, count, last_at, last_lease, last_from, last_to
FROM compute_lease_takeovers ORDER BY reason`)
	if err != nil {
		return nil, pg.Translate(err)
	}
	ts, err := pgx.CollectRows(rows, pgx.RowToStructByName[Takeover])
	return ts, pg.Translate(err)
}

func secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
