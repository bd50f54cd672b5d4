package cli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/bettercompute/bettercompute/domain/outbox"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/workers/outboxworker"
)

const sinksUsage = "list [--json] | pause NAME | resume NAME | reset NAME [--to start|end|TXID:SEQ]"

// sinksOpts are the sinks command's flags: the operator verbs over the
// outbox's sinks.
type sinksOpts struct {
	to     string
	asJSON bool
}

func (o *sinksOpts) bind(fs *flag.FlagSet) {
	fs.StringVar(&o.to, "to", "start", "reset: where the cursor goes: start (replay every retained event), end (skip to now), or TXID:SEQ (deliver what follows that event; refused when retention has deleted events after it)")
	fs.BoolVar(&o.asJSON, "json", false, "list: print JSON instead of a table")
}

// Validate checks the verb, its arguments and --to.
func (o *sinksOpts) Validate(args []string) error {
	if len(args) == 0 {
		return usageErr("sinks needs a verb: %s", sinksUsage)
	}
	verb, rest := args[0], args[1:]
	switch verb {
	case "list":
		if len(rest) > 0 {
			return usageErr("sinks list takes no arguments, got %q", rest)
		}
	case "pause", "resume", "reset":
		if len(rest) != 1 {
			return usageErr("sinks %s takes one sink name, got %q", verb, rest)
		}
	default:
		return usageErr("sinks: unknown verb %q: want %s", verb, sinksUsage)
	}
	if verb == "reset" {
		if _, err := outbox.ParsePosition(o.to); err != nil {
			return usageErr("sinks reset --to %q: want start, end or TXID:SEQ", o.to)
		}
	}
	return nil
}

func sinksCommand() *command {
	o := &sinksOpts{}
	return &command{
		name:    "sinks",
		summary: "watch and steer the outbox's sinks: " + sinksUsage,
		usage:   sinksUsage,
		opts:    o,
		run:     o.run,
	}
}

func (o *sinksOpts) run(ctx context.Context, s *Session, args []string) error {
	reg, err := s.Registry()
	if err != nil {
		return err
	}
	db, err := s.Pool(ctx)
	if err != nil {
		return err
	}
	// A registered sink is listed (and can be steered) before any worker ran.
	if err := outboxworker.EnsureSinks(ctx, db, reg); err != nil {
		return pg.Translate(err)
	}
	switch verb := args[0]; verb {
	case "list":
		return o.list(ctx, s, db)
	case "pause", "resume":
		name := args[1]
		f := outbox.PauseSink
		if verb == "resume" {
			f = outbox.ResumeSink
		}
		if err := f(ctx, db, name); err != nil {
			return pg.Translate(err)
		}
		fmt.Fprintf(s.Env.Stdout, "sink %s %sd\n", name, verb)
		return nil
	default: // reset
		return o.reset(ctx, s, db, args[1])
	}
}

// reset moves sink name's cursor to --to. A TXID:SEQ whose later events
// retention deleted is refused with INVALID_ARGUMENT naming the horizon and
// what to reset to instead.
func (o *sinksOpts) reset(ctx context.Context, s *Session, db *pg.Pool, name string) error {
	pos, err := outbox.ParsePosition(o.to)
	if err != nil {
		return usageErr("sinks reset --to %q: want start, end or TXID:SEQ", o.to)
	}
	before, err := outbox.SinkCursor(ctx, db, name)
	if err != nil {
		return pg.Translate(err)
	}
	after, err := outbox.ResetSink(ctx, db, name, pos)
	if err != nil {
		return err
	}
	fmt.Fprintf(s.Env.Stdout, "sink %s reset to %s (was %s); it delivers what follows\n", name, after, before.Cursor)
	return nil
}

// sinkJSON is one sink in `sinks list --json`.
type sinkJSON struct {
	Name        string     `json:"name"`
	Cursor      string     `json:"cursor"`
	LagRows     int64      `json:"lag_rows"`
	LagSeconds  float64    `json:"lag_seconds"`
	Paused      bool       `json:"paused"`
	Owner       string     `json:"owner,omitempty"`
	Delivered   int64      `json:"delivered"`
	DeliveredAt *time.Time `json:"delivered_at,omitempty"`
	Failures    int        `json:"failures"`
	LastError   string     `json:"last_error,omitempty"`
	LastErrorAt *time.Time `json:"last_error_at,omitempty"`
}

func (o *sinksOpts) list(ctx context.Context, s *Session, db *pg.Pool) error {
	sinks, err := outbox.ListSinks(ctx, db)
	if err != nil {
		return pg.Translate(err)
	}
	if o.asJSON {
		out := make([]sinkJSON, 0, len(sinks))
		for _, k := range sinks {
			out = append(out, sinkJSON{Name: k.Name, Cursor: k.Cursor.String(), LagRows: k.LagRows, LagSeconds: k.LagAge.Seconds(),
				Paused: k.Paused, Owner: k.Owner, Delivered: k.Delivered, DeliveredAt: k.DeliveredAt,
				Failures: k.Failures, LastError: k.LastError, LastErrorAt: k.LastErrorAt})
		}
		enc := json.NewEncoder(s.Env.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	if len(sinks) == 0 {
		fmt.Fprintln(s.Env.Stdout, "no sinks (a sink's state is created when a worker that registers it starts)")
		return nil
	}
	tw := tabwriter.NewWriter(s.Env.Stdout, 2, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tCURSOR\tLAG ROWS\tLAG AGE\tPAUSED\tDELIVERED\tOWNER\tLAST ERROR")
	for _, k := range sinks {
		lag := fmt.Sprint(k.LagRows)
		if k.LagRows >= outbox.LagCap {
			lag = fmt.Sprintf(">=%d", outbox.LagCap)
		}
		age := "-"
		if k.LagRows > 0 {
			age = k.LagAge.Round(time.Millisecond).String()
		}
		owner := k.Owner
		if owner == "" {
			owner = "-"
		}
		lastErr := "-"
		if k.LastError != "" {
			lastErr = fmt.Sprintf("%s (%d failures)", oneLine(k.LastError, 80), k.Failures)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%t\t%d\t%s\t%s\n", k.Name, k.Cursor, lag, age, k.Paused, k.Delivered, owner, lastErr)
	}
	return tw.Flush()
}
