package cli

import (
	"github.com/bettercompute/bettercompute/workers"
	capworkers "github.com/bettercompute/bettercompute/workers/capacity"
	quorumworkers "github.com/bettercompute/bettercompute/workers/quorum"
)

func init() {
	builtinSet = append(builtinSet,
		func() Module {
			return Module{
				Name: "capacity",
				// Every worker process expires the holds of the shards it
				// holds (the fenced hold-expiry job) and runs the periodic
				// safety sweep when River elects it leader.
				Register: func(r *workers.Registry) error { return capworkers.Register(r, nil) },
			}
		},
		func() Module {
			return Module{
				Name: "quorum",
				// The apply and expiry jobs of quorum batches. Applications add
				// an applier per batch kind from their own module's Register
				// (quorumworkers.Handle).
				Register: func(r *workers.Registry) error { return quorumworkers.Register(r, nil) },
			}
		},
	)
}
