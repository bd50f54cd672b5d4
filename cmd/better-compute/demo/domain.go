package demo

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/bettercompute/bettercompute/cmd/better-compute/cli"
	"github.com/bettercompute/bettercompute/domain/capacity"
	"github.com/bettercompute/bettercompute/domain/quorum"
	"github.com/bettercompute/bettercompute/platform/clock"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/quorumworker"
)

// The dev demo's capacity fixtures and quorum batch kind.
const (
	DemoPool        = "demo-gpu"
	DemoChangeKind  = "demo_change"
	demoNodes       = 3
	demoDevicesEach = 4
)

var demoTenants = map[string]int{"acme": 6, "globex": 4}

var demoVoters = []string{"alice", "bob", "carol", "dave"}

// domainDemo paces the demo.
type domainDemo struct {
	Every      time.Duration // one step per interval
	HoldTTL    time.Duration // reservations' hold TTL
	VoteWindow time.Duration // batches' deadline, from their proposal
}

var defaultDomainDemo = domainDemo{Every: time.Second, HoldTTL: 20 * time.Second, VoteWindow: 30 * time.Second}

// demoDomainModule is the capacity and quorum demo:
// the applier of demo_change batches, which writes each item to
// demo_domain_changes in the fenced apply transaction.
func demoDomainModule() cli.Module {
	return cli.Module{
		Name:       "demo_domain",
		Migrations: migrationsOf("demo_domain"),
		Dev: func(ctx context.Context, db *pg.Pool, log zerolog.Logger) {
			runDomainDemo(ctx, log, db, defaultDomainDemo)
		},
		Register: func(r *workers.Registry) error {
			return quorumworker.AddApplier(r, DemoChangeKind, func(ctx context.Context, tx pgx.Tx, b *quorum.Batch) error {
				for i, it := range b.Items {
					if _, err := tx.Exec(ctx, `INSERT INTO demo_domain_changes (batch_id, position, payload) VALUES ($1, $2, $3)`,
						b.ID, i, it); err != nil {
						return err
					}
				}
				return nil
			})
		},
	}
}

// ensureDemoPool creates the demo's pool (nodes, devices, device pairs, tenants'
// quotas) in one transaction, unless it exists.
func ensureDemoPool(ctx context.Context, db *pg.Pool) error {
	if _, err := capacity.Capacity(ctx, db, DemoPool); err == nil || !fault.Has(err, fault.NotFound) {
		return err
	}
	err := pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
		if err := capacity.CreatePool(ctx, tx, &capacity.CreatePoolParams{PoolID: DemoPool}); err != nil {
			return err
		}
		for n := 0; n < demoNodes; n++ {
			node := fmt.Sprintf("%s-node%d", DemoPool, n)
			if err := capacity.AddNode(ctx, tx, &capacity.AddNodeParams{PoolID: DemoPool, NodeID: node}); err != nil {
				return err
			}
			for d := 0; d < demoDevicesEach; d++ {
				dev := fmt.Sprintf("%s-gpu%d", node, d)
				if err := capacity.AddDeviceTx(ctx, tx, &capacity.AddDeviceParams{NodeID: node, DeviceID: dev, Kind: "demo-gpu"}); err != nil {
					return err
				}
				if d%2 == 1 { // devices 0+1 and 2+3 of each node are linked pairs
					if err := capacity.LinkDevices(ctx, tx, &capacity.LinkDevicesParams{PoolID: DemoPool, LinkID: dev + "-pair",
						DeviceIDs: []string{fmt.Sprintf("%s-gpu%d", node, d-1), dev}}); err != nil {
						return err
					}
				}
			}
		}
		for tenant, limit := range demoTenants {
			if err := capacity.SetQuota(ctx, tx, &capacity.SetQuotaParams{Tenant: tenant, PoolID: DemoPool, Limit: limit}); err != nil {
				return err
			}
		}
		return nil
	})
	if fault.Has(err, fault.Conflict) {
		return nil // created concurrently
	}
	return err
}

// runDomainDemo plays an application of both domain modules until ctx is done.
// Each step reserves devices of the demo pool for a range in the next day (a
// hold that expires after HoldTTL unless confirmed: its hold-expiry job shows in
// River UI), and confirms, extends or releases one of the recent holds; every
// fifth step an agent proposes a batch of changes that voters vote on (four
// voters, quorum three): most commit and show as quorum_apply jobs, some fall
// short and expire at their deadline (quorum_expiry).
func runDomainDemo(ctx context.Context, log zerolog.Logger, db *pg.Pool, cfg domainDemo) {
	if err := ensureDemoPool(ctx, db); err != nil {
		if ctx.Err() == nil {
			log.Warn().Err(err).Msg("domain demo: cannot create the demo pool; the demo does not run")
		}
		return
	}
	t := time.NewTicker(cfg.Every)
	defer t.Stop()
	var (
		recent []int64
		step   int
	)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		step++
		if id, err := demoReserve(ctx, db, cfg); err == nil {
			recent = append(recent, id)
			if len(recent) > 20 {
				recent = recent[1:]
			}
		} else if !fault.Has(err, fault.Conflict) && ctx.Err() == nil {
			log.Warn().Err(err).Msg("domain demo: reserve failed")
		}
		if len(recent) > 0 {
			if err := demoTouch(ctx, db, recent[rand.IntN(len(recent))]); err != nil && !fault.Has(err, fault.Conflict) && ctx.Err() == nil {
				log.Warn().Err(err).Msg("domain demo: a hold change failed")
			}
		}
		if step%5 == 1 {
			if err := demoBatch(ctx, db, cfg, step); err != nil && ctx.Err() == nil {
				log.Warn().Err(err).Msg("domain demo: a quorum batch failed")
			}
		}
	}
}

func demoReserve(ctx context.Context, db *pg.Pool, cfg domainDemo) (int64, error) {
	now, err := clock.Now(ctx, db)
	if err != nil {
		return 0, err
	}
	tenant := "acme"
	if rand.IntN(2) == 0 {
		tenant = "globex"
	}
	start := now.Truncate(time.Hour).Add(time.Duration(1+rand.IntN(24)) * time.Hour)
	var id int64
	err = pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
		r, err := capacity.ReserveTx(ctx, tx, &capacity.ReserveParams{
			PoolID: DemoPool, Tenant: tenant, Devices: 1 + rand.IntN(2), Linked: rand.IntN(3) == 0,
			Start: start, End: start.Add(time.Duration(1+rand.IntN(4)) * time.Hour), TTL: cfg.HoldTTL,
		})
		if err != nil {
			return err
		}
		id = r.ID
		return nil
	})
	return id, err
}

// demoTouch confirms, extends or releases a reservation, or leaves it to expire.
func demoTouch(ctx context.Context, db *pg.Pool, id int64) error {
	return pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
		switch rand.IntN(6) {
		case 0:
			_, err := capacity.ConfirmTx(ctx, tx, &capacity.ConfirmParams{ReservationID: id})
			return err
		case 1:
			r, err := capacity.Get(ctx, tx, id)
			if err != nil {
				return err
			}
			_, err = capacity.ExtendTx(ctx, tx, &capacity.ExtendParams{ReservationID: id, Version: r.Version, By: 10 * time.Second})
			return err
		case 2:
			_, err := capacity.ReleaseTx(ctx, tx, &capacity.ReleaseParams{ReservationID: id})
			return err
		}
		return nil // left alone: a hold expires
	})
}

// demoBatch proposes a batch and casts its votes, each in its own transaction.
func demoBatch(ctx context.Context, db *pg.Pool, cfg domainDemo, step int) error {
	now, err := clock.Now(ctx, db)
	if err != nil {
		return err
	}
	var id int64
	err = pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
		b, err := quorum.ProposeTx(ctx, tx, &quorum.ProposeParams{
			Kind: DemoChangeKind, Agent: "demo-planner",
			Items: []any{
				map[string]any{"op": "resize", "pool": DemoPool, "step": step},
				map[string]any{"op": "label", "node": fmt.Sprintf("%s-node%d", DemoPool, step%demoNodes), "label": "demo"},
			},
			Voters: demoVoters, Quorum: 3, Deadline: now.Add(cfg.VoteWindow),
		})
		if err != nil {
			return err
		}
		id = b.ID
		return nil
	})
	if err != nil {
		return err
	}
	for _, v := range demoVoters {
		approve := rand.IntN(5) > 0
		if rand.IntN(4) == 0 {
			continue // this voter abstains: with too many, the batch expires
		}
		err := pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
			_, err := quorum.VoteTx(ctx, tx, &quorum.VoteParams{BatchID: id, Voter: v, Approve: approve, Reason: "demo"})
			return err
		})
		if err != nil && !fault.Has(err, fault.Conflict) {
			return errors.Join(fmt.Errorf("vote of %s on batch %d", v, id), err)
		}
	}
	return nil
}
