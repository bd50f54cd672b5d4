package outboxworker

import (
	"github.com/bettercompute/bettercompute/domain/outbox"
	"github.com/bettercompute/bettercompute/workers"
)

// The tests register sinks on bare registries: these install the outbox
// module first, as cli.App does before an application's modules.
type (
	Sink  = workers.Sink
	Event = outbox.Event
)

func AddSink(reg *workers.Registry, s Sink) error {
	if err := Register(reg, nil); err != nil {
		return err
	}
	return workers.AddSink(reg, s)
}
