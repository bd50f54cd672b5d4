package cli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/jackc/pgx/v5"

	"github.com/bettercompute/bettercompute/domain/tenancy"
	"github.com/bettercompute/bettercompute/domain/workflow"
	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
)

// tenantOpts are the tenant command's flags: the operator verbs over tenants
// (domain/tenancy).
type tenantOpts struct {
	asJSON bool
	state  string
	reason string
}

const tenantUsage = "list [--state S] [--json] | show NAME [--json] | suspend NAME [--reason R] | resume NAME | " +
	"delete NAME [--reason R] | limit NAME N"

func (o *tenantOpts) bind(fs *flag.FlagSet) {
	fs.BoolVar(&o.asJSON, "json", false, "list, show: print JSON instead of text")
	fs.StringVar(&o.state, "state", "", "list: only tenants in this state (active, suspended or deleted)")
	fs.StringVar(&o.reason, "reason", "", "suspend, delete: why, recorded on the tenant (and on what delete cancels)")
}

// Validate checks the verb, its arguments and flags before anything is touched.
func (o *tenantOpts) Validate(args []string) error {
	if len(args) == 0 {
		return usageErr("tenant needs a verb: %s", tenantUsage)
	}
	verb, rest := args[0], args[1:]
	want := 1
	switch verb {
	case "list":
		want = 0
		switch o.state {
		case "", "active", "suspended", "deleted":
		default:
			return usageErr("tenant list --state %q: want active, suspended or deleted", o.state)
		}
	case "show", "suspend", "resume", "delete":
	case "limit":
		want = 2
	default:
		return usageErr("tenant: unknown verb %q; want %s", verb, tenantUsage)
	}
	if len(rest) != want {
		return usageErr("tenant %s takes %d argument(s), got %q (%s)", verb, want, rest, tenantUsage)
	}
	if want > 0 {
		if err := jobs.ValidateTenant(rest[0]); err != nil {
			return usageErr("tenant %s: %s", verb, strings.TrimPrefix(err.Error(), string(fault.InvalidArgument)+": "))
		}
	}
	if verb == "limit" {
		if n, err := strconv.Atoi(rest[1]); err != nil || n <= 0 {
			return usageErr("tenant limit %s %q: want a whole number of units above 0", rest[0], rest[1])
		}
	}
	if o.asJSON && verb != "list" && verb != "show" {
		return usageErr("tenant %s: --json is for list and show", verb)
	}
	return nil
}

func tenantCommand() *command {
	o := &tenantOpts{}
	return &command{
		name:    "tenant",
		summary: "look at tenants and steer their work: " + tenantUsage,
		usage:   tenantUsage,
		opts:    o,
		run:     o.run,
	}
}

func (o *tenantOpts) run(ctx context.Context, s *Session, args []string) error {
	if err := s.setup(); err != nil {
		return err
	}
	db, err := s.Pool(ctx)
	if err != nil {
		return err
	}
	out := s.Env.Stdout
	verb := args[0]
	switch verb {
	case "list":
		ts, err := tenancy.List(ctx, db, tenancy.State(o.state))
		if err != nil {
			return err
		}
		if o.asJSON {
			return printJSON(out, ts)
		}
		printTenants(out, ts)
		return nil
	case "show":
		t, err := tenancy.Get(ctx, db, args[1])
		if err != nil {
			return err
		}
		if o.asJSON {
			return printJSON(out, t)
		}
		printTenants(out, []tenancy.Tenant{*t})
		return nil
	}
	name := args[1]
	return pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
		switch verb {
		case "suspend":
			if err := tenancy.SuspendTx(ctx, tx, name, o.reason); err != nil {
				return err
			}
			fmt.Fprintf(out, "suspended tenant %s: its work is held (nothing of it starts; what runs finishes); %s tenant resume %s runs it\n", name, s.App.name(), name)
		case "resume":
			if err := tenancy.ResumeTx(ctx, tx, name); err != nil {
				return err
			}
			fmt.Fprintf(out, "resumed tenant %s: its held work runs\n", name)
		case "limit":
			n, _ := strconv.Atoi(args[2])
			if err := tenancy.SetLimitTx(ctx, tx, name, n); err != nil {
				return err
			}
			fmt.Fprintf(out, "tenant %s runs at most %d units at once\n", name, n)
		default: // delete
			d, err := tenancy.DeleteTx(ctx, tx, name, o.reason)
			if err != nil {
				return err
			}
			reason := o.reason
			if reason == "" {
				reason = "tenant deleted"
			}
			if d.Workflows, err = workflow.CancelTenantTx(ctx, tx, name, reason); err != nil {
				return err
			}
			fmt.Fprintf(out, "deleted tenant %s: cancelled %d waiting jobs, dropped %d dirty keys, cancelled %d workflows (their compensation runs once)\n",
				name, d.Jobs, d.Keys, d.Workflows)
		}
		return nil
	})
}

func printTenants(out io.Writer, ts []tenancy.Tenant) {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "TENANT\tSTATE\tRUNNING\tLIMIT\tWAITING\tWORKFLOWS\tREASON")
	for _, t := range ts {
		fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%d\t%d\t%s\n", t.Name, t.State, t.Running, t.MaxRunning, t.Waiting, t.Workflows, t.Reason)
	}
	_ = w.Flush()
}

func printJSON(out io.Writer, v any) error {
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
