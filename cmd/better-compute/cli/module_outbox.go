package cli

import (
	"github.com/bettercompute/bettercompute/workers"
	outboxw "github.com/bettercompute/bettercompute/workers/outbox"
)

func init() {
	builtinSet = append(builtinSet, func() Module {
		return Module{
			Name: "outbox",
			// The outbox machinery runs in every worker process: sink delivery,
			// table dispatcher passes, and retention of the event log (which runs
			// even without a sink, keeping the replay window). Applications add
			// sinks and dispatchers from their own modules (outboxw.RegisterSink,
			// outboxw.RegisterDispatcher) and options (outboxw.Configure).
			Register: func(r *workers.Registry) error {
				outboxw.Install(r)
				return nil
			},
		}
	})
}
