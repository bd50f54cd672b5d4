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
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/bettercompute/bettercompute/domain/workflow"
	"github.com/bettercompute/bettercompute/domain/workflow/confirmation"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
)

const confirmationUsage = "create --workflow ID --signal NAME [--payload JSON] [--ttl D] [--json] | " +
	"list [--workflow ID] [--state S] [--limit N] [--json] | revoke ID"

// confirmationsListLimit is list's default --limit (and the API's limit=).
const confirmationsListLimit = 100

// confirmationOpts are the confirmation command's flags: the operator verbs
// over confirmation links (domain/workflow/confirmation). Only create's output holds a
// token, once: list and revoke have none to show (the database keeps its hash).
type confirmationOpts struct {
	workflow string
	signal   string
	payload  string
	ttl      string
	state    string
	limit    int
	asJSON   bool

	ttlValue time.Duration // ttl, parsed by Validate
}

func (o *confirmationOpts) bind(fs *flag.FlagSet) {
	fs.StringVar(&o.workflow, "workflow", "", "create: the workflow the link signals (required); list: only this workflow's confirmations")
	fs.StringVar(&o.signal, "signal", "", "create: the signal the link sends, one the workflow's kind declares (required)")
	fs.StringVar(&o.payload, "payload", "", "create: the signal's payload, JSON (default none)")
	fs.StringVar(&o.ttl, "ttl", "", fmt.Sprintf("create: how long the link works, a Go duration such as 30m or 24h (default %s; %s to %s)",
		shortDuration(confirmation.DefaultTTL), shortDuration(confirmation.MinTTL), shortDuration(confirmation.MaxTTL)))
	fs.StringVar(&o.state, "state", "", "list: only confirmations in this state (pending, confirmed, revoked or expired)")
	fs.IntVar(&o.limit, "limit", confirmationsListLimit, "list: at most this many confirmations, newest first (1 to 1000)")
	fs.BoolVar(&o.asJSON, "json", false, "create, list: print JSON instead of text")
}

// confirmationVerbArgs are each verb's positional arguments and the flags that
// apply to it.
var confirmationVerbArgs = map[string]struct {
	args  []string
	flags []string
}{
	"create": {flags: []string{"workflow", "signal", "payload", "ttl", "json"}},
	"list":   {flags: []string{"workflow", "state", "limit", "json"}},
	"revoke": {args: []string{"ID"}},
}

// Validate checks the verb, its arguments and flags before anything is touched.
func (o *confirmationOpts) Validate(args []string) error {
	if len(args) == 0 {
		return usageErr("confirmation needs a verb: %s", confirmationUsage)
	}
	verb, rest := args[0], args[1:]
	spec, ok := confirmationVerbArgs[verb]
	if !ok {
		return usageErr("confirmation: unknown verb %q; want %s", verb, confirmationUsage)
	}
	if len(rest) != len(spec.args) {
		if len(spec.args) == 0 {
			return usageErr("confirmation %s takes no arguments, got %q (its input is flags: see confirmation --help)", verb, rest)
		}
		return usageErr("confirmation %s takes %s, got %q", verb, strings.Join(spec.args, " "), rest)
	}
	// A flag given to a verb it does not apply to is a mistake worth saying.
	set := map[string]bool{
		"workflow": o.workflow != "", "signal": o.signal != "", "payload": o.payload != "", "ttl": o.ttl != "",
		"state": o.state != "", "limit": o.limit != confirmationsListLimit, "json": o.asJSON,
	}
	if err := flagsApply("confirmation", verb, set, spec.flags); err != nil {
		return err
	}
	switch verb {
	case "create":
		if o.workflow == "" || o.signal == "" {
			return usageErr("confirmation create needs --workflow ID and --signal NAME")
		}
		if err := workflow.ValidateID(o.workflow); err != nil {
			return usageErr("confirmation create --workflow: %s", messageOf(err))
		}
		if o.payload != "" && !json.Valid([]byte(o.payload)) {
			return usageErr("confirmation create --payload %q is not valid JSON (quote it for the shell: '{\"key\": \"value\"}')", oneLine(o.payload, 80))
		}
		o.ttlValue = confirmation.DefaultTTL
		if o.ttl != "" {
			d, err := time.ParseDuration(o.ttl)
			if err != nil {
				return usageErr("confirmation create --ttl %q: want a Go duration such as 30m, 24h or 72h", o.ttl)
			}
			if d < confirmation.MinTTL || d > confirmation.MaxTTL {
				return usageErr("confirmation create --ttl %s: want %s to %s", o.ttl, shortDuration(confirmation.MinTTL), shortDuration(confirmation.MaxTTL))
			}
			o.ttlValue = d
		}
	case "list":
		if o.workflow != "" {
			if err := workflow.ValidateID(o.workflow); err != nil {
				return usageErr("confirmation list --workflow: %s", messageOf(err))
			}
		}
		if _, err := parseConfirmationState(o.state); err != nil {
			return usageErr("confirmation list --state %q: want pending, confirmed, revoked or expired", o.state)
		}
		if o.limit < 1 || o.limit > 1000 {
			return usageErr("confirmation list --limit %d: want 1 to 1000", o.limit)
		}
	default: // revoke
		if _, err := parseConfirmationID(rest[0]); err != nil {
			return usageErr("confirmation revoke: %s", messageOf(err))
		}
	}
	return nil
}

// parseConfirmationState is a state filter: "" for any (INVALID_ARGUMENT for
// a state that is none of the four).
func parseConfirmationState(s string) (confirmation.State, error) {
	switch st := confirmation.State(s); st {
	case "", confirmation.Pending, confirmation.Confirmed, confirmation.Revoked, confirmation.Expired:
		return st, nil
	}
	return "", fault.New(fault.InvalidArgument, "state %q: want pending, confirmed, revoked or expired", s)
}

// parseConfirmationID is a binding's id, a whole number above 0.
func parseConfirmationID(s string) (int64, error) {
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id <= 0 {
		return 0, fault.New(fault.InvalidArgument, "confirmation id %q: want a whole number above 0 (confirmation list shows them)", oneLine(s, 40))
	}
	return id, nil
}

// shortDuration is d without a zero tail: 72h, not 72h0m0s.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

func confirmationCommand() *command {
	o := &confirmationOpts{}
	return &command{
		name: "confirmation",
		summary: "single-use links that signal a workflow once: " + confirmationUsage +
			" (create prints the link, under BETTER_COMPUTE_PUBLIC_URL, once: only its hash is stored, so nothing shows it again; " +
			"revoke stops a pending one)",
		usage: confirmationUsage,
		opts:  o,
		run:   o.run,
	}
}

func (o *confirmationOpts) run(ctx context.Context, s *Session, args []string) error {
	if err := s.setup(); err != nil {
		return err
	}
	db, err := s.Pool(ctx)
	if err != nil {
		return err
	}
	out := s.Env.Stdout
	switch args[0] {
	case "create":
		return o.create(ctx, out, db, s.PublicBase())
	case "list":
		return o.list(ctx, out, db)
	default: // revoke
		id, _ := parseConfirmationID(args[1])
		return revokeConfirmation(ctx, out, db, id)
	}
}

// createdConfirmation is create --json: the binding and its link.
type createdConfirmation struct {
	confirmation.Binding
	URL string `json:"url"`
}

// create makes the binding and prints its link: the one place a token is
// shown.
func (o *confirmationOpts) create(ctx context.Context, out io.Writer, db *pg.Pool, base string) error {
	opts := &confirmation.CreateOpts{TTL: o.ttlValue}
	if o.payload != "" {
		opts.Payload = json.RawMessage(o.payload)
	}
	tok, b, err := confirmation.Create(ctx, db, o.workflow, o.signal, opts)
	if err != nil {
		return err
	}
	if o.asJSON {
		return writeJSON(out, createdConfirmation{Binding: *b, URL: tok.URL(base)})
	}
	fmt.Fprintf(out, "confirmation %d: signal %s to workflow %s (%s), expires %s\n",
		b.ID, b.Signal, b.WorkflowID, b.Kind, b.ExpiresAt.UTC().Format(time.RFC3339))
	fmt.Fprintln(out, tok.URL(base))
	return nil
}

func (o *confirmationOpts) list(ctx context.Context, out io.Writer, db *pg.Pool) error {
	st, _ := parseConfirmationState(o.state)
	bs, err := confirmation.List(ctx, db, confirmation.ListOpts{WorkflowID: o.workflow, State: st, Limit: o.limit})
	if err != nil {
		return err
	}
	if o.asJSON {
		if bs == nil {
			bs = []confirmation.Binding{}
		}
		return writeJSON(out, bs)
	}
	if len(bs) == 0 {
		text := "no confirmations"
		if o.state != "" {
			text = "no " + o.state + " confirmations"
		}
		if o.workflow != "" {
			text += " of workflow " + o.workflow
		}
		fmt.Fprintln(out, text)
		return nil
	}
	printConfirmations(out, bs)
	if len(bs) == o.limit {
		fmt.Fprintf(out, "(%d shown, the limit: the newest; --limit up to 1000, or --workflow and --state, narrow it)\n", len(bs))
	}
	return nil
}

func printConfirmations(out io.Writer, bs []confirmation.Binding) {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tWORKFLOW\tKIND\tSIGNAL\tSTATE\tCREATED\tEXPIRES")
	for _, b := range bs {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", b.ID, b.WorkflowID, b.Kind, b.Signal, b.State, fmtTime(b.CreatedAt), fmtTime(b.ExpiresAt))
	}
	_ = tw.Flush()
}

// revokeConfirmation revokes binding id: its link stops working. A confirmed
// one is CONFLICT (its signal was delivered; nothing changes), an unknown id
// NOT_FOUND.
func revokeConfirmation(ctx context.Context, out io.Writer, db *pg.Pool, id int64) error {
	var before, after *confirmation.Binding
	err := pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
		var err error
		if before, err = confirmation.Get(ctx, tx, id); err != nil {
			return err
		}
		after, err = confirmation.RevokeTx(ctx, tx, id)
		return err
	})
	if err != nil {
		return revokeError(id, after, err)
	}
	switch before.State {
	case confirmation.Revoked:
		fmt.Fprintf(out, "confirmation %d was already revoked: nothing to do\n", id)
	case confirmation.Expired:
		fmt.Fprintf(out, "confirmation %d revoked (it had expired already: its link did not work)\n", id)
	default:
		fmt.Fprintf(out, "confirmation %d revoked: its link no longer works\n", id)
	}
	return nil
}

// revokeError says what a refused revoke means: a confirmed binding's signal
// was delivered, and revoking cannot take it back.
func revokeError(id int64, b *confirmation.Binding, err error) error {
	if !fault.Has(err, fault.Conflict) || b == nil || b.State != confirmation.Confirmed {
		return err
	}
	when := ""
	if b.UsedAt != nil {
		when = " at " + fmtTime(*b.UsedAt)
	}
	return fault.New(fault.Conflict, "confirmation %d is already confirmed: its signal was delivered (signal %s to workflow %s%s); revoking changes nothing",
		id, b.Signal, b.WorkflowID, when)
}
