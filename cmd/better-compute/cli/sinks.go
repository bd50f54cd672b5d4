package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/bettercompute/bettercompute/domain/outbox"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	outboxw "github.com/bettercompute/bettercompute/workers/outbox"
)

func init() { commandSet = append(commandSet, sinksCommand) }

const sinksUsage = "list [--json] | pause NAME | resume NAME | reset NAME [--to start|end|TXID:SEQ]"

// sinksCmd is the operator verbs over the outbox's sinks.
type sinksCmd struct {
	to     string
	asJSON bool
	fset   *flag.FlagSet
}

func sinksCommand() *command {
	c := &sinksCmd{}
	return &command{
		name:    "sinks",
		summary: "watch and steer the outbox's sinks: " + sinksUsage,
		usage:   sinksUsage,
		flags: func(fs *flag.FlagSet, s *Session) {
			c.fset = fs
			fs.StringVar(&c.to, "to", "start", "reset: where the cursor goes: start (replay every retained event), end (skip to now), or TXID:SEQ (deliver what follows that event; refused when retention has deleted events after it)")
			fs.BoolVar(&c.asJSON, "json", false, "list: print JSON instead of a table")
		},
		run: c.run,
	}
}

// sinksArgs parses c's flags wherever they stand among the arguments (sinks
// reset NAME --to end) and returns the positional ones.
func (c *sinksCmd) args(args []string) ([]string, error) {
	var pos []string
	for {
		if err := c.fset.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, usageErr("usage: sinks [flags] %s (see sinks --help)", sinksUsage)
			}
			return nil, usageErr("sinks: %v", err)
		}
		args = c.fset.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

func (c *sinksCmd) run(ctx context.Context, s *Session, args []string) error {
	args, err := c.args(args)
	if err != nil {
		return err
	}
	if len(args) == 0 {
		return usageErr("sinks needs a verb: %s", sinksUsage)
	}
	verb, rest := args[0], args[1:]
	wantName := func() (string, error) {
		if len(rest) != 1 {
			return "", usageErr("sinks %s takes one sink name, got %q", verb, rest)
		}
		return rest[0], nil
	}
	switch verb {
	case "list", "pause", "resume", "reset":
	default:
		return usageErr("sinks: unknown verb %q: want %s", verb, sinksUsage)
	}
	reg, err := s.Registry()
	if err != nil {
		return err
	}
	db, err := s.Pool(ctx)
	if err != nil {
		return err
	}
	// A registered sink is listed (and can be steered) before any worker ran.
	if err := outboxw.EnsureSinks(ctx, db, reg); err != nil {
		return notMigrated(err)
	}
	switch verb {
	case "list":
		if len(rest) > 0 {
			return usageErr("sinks list takes no arguments, got %q", rest)
		}
		return c.list(ctx, s, db)
	case "pause", "resume":
		name, err := wantName()
		if err != nil {
			return err
		}
		f := outbox.PauseSink
		if verb == "resume" {
			f = outbox.ResumeSink
		}
		if err := f(ctx, db, name); err != nil {
			return notMigrated(err)
		}
		fmt.Fprintf(s.Env.Stdout, "sink %s %sd\n", name, verb)
		return nil
	default: // reset
		name, err := wantName()
		if err != nil {
			return err
		}
		pos, err := outbox.ParsePosition(c.to)
		if err != nil {
			return fault.New(fault.InvalidArgument, "sinks reset --to %q: want start, end or TXID:SEQ", c.to)
		}
		before, err := outbox.SinkCursor(ctx, db, name)
		if err != nil {
			return notMigrated(err)
		}
		// A TXID:SEQ whose later events retention deleted is refused with
		// INVALID_ARGUMENT naming the horizon and what to reset to instead.
		after, err := outbox.ResetSink(ctx, db, name, pos)
		if err != nil {
			return err
		}
		fmt.Fprintf(s.Env.Stdout, "sink %s reset to %s (was %s); it delivers what follows\n", name, after, before.Cursor)
		return nil
	}
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

func (c *sinksCmd) list(ctx context.Context, s *Session, db *pg.Pool) error {
	sinks, err := outbox.ListSinks(ctx, db)
	if err != nil {
		return notMigrated(err)
	}
	if c.asJSON {
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

// oneLine shortens s to one line of at most n characters.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

// notMigrated turns "the outbox tables do not exist" into a clear INVALID_CONFIG.
func notMigrated(err error) error {
	if pg.SQLState(err) == "42P01" {
		return fault.Wrap(fault.InvalidConfig, err, "the database has no outbox tables: run better-compute migrate first")
	}
	return err
}
