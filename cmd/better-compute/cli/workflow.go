package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/bettercompute/bettercompute/domain/workflow"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/workers/workflowworker"
)

const workflowUsage = "list [--kind K] [--status S] [--limit N] [--before ID] [--json] | show ID [--json] | " +
	"start KIND JSON [--id ID] | signal ID NAME [JSON] [--dedup KEY] | cancel ID [--reason R] | retry ID"

// workflowOpts are the workflow command's flags: the operator verbs over
// durable workflows (domain/workflow).
type workflowOpts struct {
	kind   string
	status string
	limit  int
	before string
	asJSON bool
	id     string
	dedup  string
	reason string
}

func (o *workflowOpts) bind(fs *flag.FlagSet) {
	fs.StringVar(&o.kind, "kind", "", "list: only workflows of this kind")
	fs.StringVar(&o.status, "status", "", "list: only workflows of this status ("+statusNames()+")")
	fs.IntVar(&o.limit, "limit", workflowsListLimit, "list: at most this many workflows, newest first (1 to 1000)")
	fs.StringVar(&o.before, "before", "", "list: the next page, the workflows created before this workflow id")
	fs.BoolVar(&o.asJSON, "json", false, "list, show: print JSON instead of text")
	fs.StringVar(&o.id, "id", "", "start: the workflow's id (default a new random one); starting the same id with the same kind and input again is the same workflow")
	fs.StringVar(&o.dedup, "dedup", "", "signal: a dedup key; a second signal to the workflow with the same key counts once")
	fs.StringVar(&o.reason, "reason", "", "cancel: why, recorded as the workflow's error (default \"cancelled\")")
}

// statusNames is the statuses, for help and errors.
func statusNames() string {
	names := make([]string, len(workflow.Statuses))
	for i, s := range workflow.Statuses {
		names[i] = string(s)
	}
	return strings.Join(names, ", ")
}

// workflowVerbArgs are each verb's positional arguments, as usage shows them
// (the required ones, then the optional ones), and the flags that apply to it.
var workflowVerbArgs = map[string]struct {
	required, optional []string
	flags              []string
}{
	"list":   {flags: []string{"kind", "status", "limit", "before", "json"}},
	"show":   {required: []string{"ID"}, flags: []string{"json"}},
	"start":  {required: []string{"KIND", "JSON"}, flags: []string{"id"}},
	"signal": {required: []string{"ID", "NAME"}, optional: []string{"JSON"}, flags: []string{"dedup"}},
	"cancel": {required: []string{"ID"}, flags: []string{"reason"}},
	"retry":  {required: []string{"ID"}},
}

// Validate checks the verb, its arguments and the flags, before anything runs.
func (o *workflowOpts) Validate(args []string) error {
	if len(args) == 0 {
		return usageErr("workflow needs a verb: %s", workflowUsage)
	}
	verb, rest := args[0], args[1:]
	spec, ok := workflowVerbArgs[verb]
	if !ok {
		return usageErr("workflow: unknown verb %q; want %s", verb, workflowUsage)
	}
	if n := len(rest); n < len(spec.required) || n > len(spec.required)+len(spec.optional) {
		want := strings.Join(spec.required, " ")
		for _, a := range spec.optional {
			want += " [" + a + "]"
		}
		if want == "" {
			return usageErr("workflow %s takes no arguments, got %q", verb, rest)
		}
		return usageErr("workflow %s takes %s, got %q", verb, want, rest)
	}
	// A flag given to a verb it does not apply to is a mistake worth saying.
	set := map[string]bool{
		"kind": o.kind != "", "status": o.status != "", "limit": o.limit != workflowsListLimit, "before": o.before != "",
		"json": o.asJSON, "id": o.id != "", "dedup": o.dedup != "", "reason": o.reason != "",
	}
	if err := flagsApply("workflow", verb, set, spec.flags); err != nil {
		return err
	}
	switch verb {
	case "list":
		if o.status != "" {
			if _, err := workflow.ParseStatus(o.status); err != nil {
				return usageErr("workflow list --status %q: want one of %s", o.status, statusNames())
			}
		}
		if o.limit < 1 || o.limit > 1000 {
			return usageErr("workflow list --limit %d: want 1 to 1000", o.limit)
		}
		if o.before != "" {
			if err := workflow.ValidateID(o.before); err != nil {
				return usageErr("workflow list --before: %s", messageOf(err))
			}
		}
	case "start":
		if !json.Valid([]byte(rest[1])) {
			return usageErr("workflow start %s: the input %q is not valid JSON (quote it for the shell: '{\"key\": \"value\"}')", rest[0], oneLine(rest[1], 80))
		}
		if o.id != "" {
			if err := workflow.ValidateID(o.id); err != nil {
				return usageErr("workflow start --id: %s", messageOf(err))
			}
		}
	default: // show, signal, cancel, retry: the first argument is an id
		if err := workflow.ValidateID(rest[0]); err != nil {
			return usageErr("workflow %s: %s", verb, messageOf(err))
		}
		if verb == "signal" && len(rest) == 3 && !json.Valid([]byte(rest[2])) {
			return usageErr("workflow signal %s %s: the payload %q is not valid JSON", rest[0], rest[1], oneLine(rest[2], 80))
		}
	}
	return nil
}

func workflowCommand() *command {
	o := &workflowOpts{}
	return &command{
		name:    "workflow",
		summary: "look at and steer durable workflows: " + workflowUsage,
		usage:   workflowUsage,
		opts:    o,
		run:     o.run,
	}
}

// run runs one verb. start checks the kind and the input against this
// binary's definitions before the database is touched.
func (o *workflowOpts) run(ctx context.Context, s *Session, args []string) error {
	if err := s.setup(); err != nil {
		return err
	}
	verb, rest := args[0], args[1:]
	if verb == "start" {
		reg, err := s.Registry()
		if err != nil {
			return err
		}
		kind, input := rest[0], json.RawMessage(rest[1])
		def, err := workflowworker.Lookup(reg, kind)
		if err != nil {
			return err
		}
		if err := def.CheckInput(input); err != nil {
			return err
		}
		db, err := s.Pool(ctx)
		if err != nil {
			return err
		}
		var id string
		err = pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
			id, err = def.StartJSONTx(ctx, tx, input, &workflow.StartOpts{ID: o.id})
			return err
		})
		if err != nil {
			return err
		}
		fmt.Fprintln(s.Env.Stdout, id)
		return nil
	}
	db, err := s.Pool(ctx)
	if err != nil {
		return err
	}
	out := s.Env.Stdout
	switch verb {
	case "list":
		return o.list(ctx, out, db)
	case "show":
		return o.show(ctx, out, db, rest[0])
	case "signal":
		return o.signal(ctx, out, db, rest)
	case "cancel":
		return o.cancel(ctx, out, db, rest[0])
	default: // retry
		return retryWorkflow(ctx, out, db, rest[0])
	}
}

func (o *workflowOpts) list(ctx context.Context, out io.Writer, db *pg.Pool) error {
	lo := workflow.ListOpts{Kind: o.kind, Status: workflow.Status(o.status), Limit: o.limit, Before: o.before}
	ws, err := workflow.List(ctx, db, lo)
	if err != nil {
		return err
	}
	if o.asJSON {
		if ws == nil {
			ws = []workflow.Info{}
		}
		return writeJSON(out, ws)
	}
	if len(ws) == 0 {
		fmt.Fprintln(out, "no workflows"+listFilterText(lo))
		return nil
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tKIND\tSTATUS\tSTEP\tSEQ\tUPDATED\tERROR")
	for _, w := range ws {
		errText := "-"
		if w.Error != "" {
			errText = oneLine(w.Error, 60)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s ago\t%s\n", w.ID, w.Kind, w.Status, w.Step, w.Seq, ago(w.Now.Sub(w.UpdatedAt)), errText)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(ws) == o.limit {
		fmt.Fprintf(out, "(%d shown, the limit; the next page: --before %s)\n", len(ws), ws[len(ws)-1].ID)
	}
	return nil
}

// listFilterText says which filters an empty list had.
func listFilterText(lo workflow.ListOpts) string {
	var f []string
	if lo.Kind != "" {
		f = append(f, "of kind "+lo.Kind)
	}
	if lo.Status != "" {
		f = append(f, "with status "+string(lo.Status))
	}
	if lo.Before != "" {
		f = append(f, "created before "+lo.Before)
	}
	if len(f) == 0 {
		return ""
	}
	return " " + strings.Join(f, " ")
}

// workflowDetail is one workflow with its history: show --json and
// GET /v1/workflows/{id}.
type workflowDetail struct {
	Workflow *workflow.Info        `json:"workflow"`
	History  []workflow.HistoryRow `json:"history"`
}

// getWorkflowDetail reads workflow id and its history.
func getWorkflowDetail(ctx context.Context, db pg.DBTX, id string) (*workflowDetail, error) {
	i, err := workflow.Get(ctx, db, id)
	if err != nil {
		return nil, err
	}
	h, err := workflow.History(ctx, db, id)
	if err != nil {
		return nil, err
	}
	if h == nil {
		h = []workflow.HistoryRow{}
	}
	return &workflowDetail{Workflow: i, History: h}, nil
}

func (o *workflowOpts) show(ctx context.Context, out io.Writer, db *pg.Pool, id string) error {
	d, err := getWorkflowDetail(ctx, db, id)
	if err != nil {
		return err
	}
	if o.asJSON {
		return writeJSON(out, d)
	}
	i := d.Workflow
	var b strings.Builder
	line := func(k, format string, args ...any) {
		fmt.Fprintf(&b, "%-10s %s\n", k+":", fmt.Sprintf(format, args...))
	}
	line("workflow", "%s", i.ID)
	line("kind", "%s", i.Kind)
	line("status", "%s", workflowStatusLine(i))
	line("step", "%s", i.Step)
	line("seq", "%d", i.Seq)
	if i.JobID != nil {
		line("job", "%d (River UI: /jobs/%d)", *i.JobID, *i.JobID)
	}
	if i.ParentID != "" {
		line("parent", "%s (started at its seq %d)", i.ParentID, i.ParentSeq)
	}
	line("created", "%s", fmtTime(i.CreatedAt))
	line("updated", "%s (%s ago)", fmtTime(i.UpdatedAt), ago(i.Now.Sub(i.UpdatedAt)))
	if i.FinishedAt != nil {
		line("finished", "%s", fmtTime(*i.FinishedAt))
	}
	line("input", "%s", compactJSON(i.Input))
	if len(i.State) > 0 {
		line("state", "%s", compactJSON(i.State))
	}
	if len(i.Result) > 0 {
		line("result", "%s", compactJSON(i.Result))
	}
	if i.Error != "" {
		line("error", "%s", oneLine(i.Error, 0))
	}
	fmt.Fprint(out, b.String())
	fmt.Fprintln(out)
	if len(d.History) == 0 {
		fmt.Fprintln(out, "history: none yet (no step has committed)")
		return nil
	}
	fmt.Fprintln(out, "history:")
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tSTEP\tOUTCOME\tNEXT STEP\tATTEMPT\tJOB\tEPOCH\tSTARTED\tCOMMITTED\tTOOK\tERROR")
	for _, h := range d.History {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", h.Seq, h.Step, h.Outcome, dash(h.NextStep),
			attemptText(h.Attempt), optInt(h.JobID), optInt(h.LeaseEpoch), fmtTime(h.StartedAt), fmtTime(h.CommittedAt),
			tookText(h.Took), dash(oneLine(h.Error, 60)))
	}
	return tw.Flush()
}

// workflowStatusLine is the status with what a sleeping or waiting workflow
// waits for.
func workflowStatusLine(i *workflow.Info) string {
	s := string(i.Status)
	until := ""
	if i.WakeAt != nil {
		until = " until " + fmtTime(*i.WakeAt)
		if d := i.WakeAt.Sub(i.Now); d > 0 {
			until += " (in " + ago(d) + ")"
		}
	}
	switch {
	case i.Status == workflow.Sleeping:
		return s + until + ", then step " + i.Step
	case i.Status == workflow.Waiting && i.Wait != nil:
		what := "signal " + i.Wait.Signal
		if i.Wait.Signal == "" {
			what = i.Wait.Children + " of its children"
		}
		s += " for " + what + until + ", then step " + i.Step
		if i.Wait.TimeoutStep != "" {
			s += " (step " + i.Wait.TimeoutStep + " at the deadline)"
		}
		return s
	case i.Status == workflow.Failed:
		return s + " at step " + i.Step + " (workflow retry resumes it there)"
	}
	return s
}

func (o *workflowOpts) signal(ctx context.Context, out io.Writer, db *pg.Pool, args []string) error {
	id, name := args[0], args[1]
	var payload any
	if len(args) == 3 {
		payload = json.RawMessage(args[2])
	}
	var res workflow.SignalResult
	err := pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
		var err error
		res, err = workflow.SignalTx(ctx, tx, id, name, payload, &workflow.SignalOpts{DedupKey: o.dedup})
		return err
	})
	if err != nil {
		return err
	}
	if res.Duplicate {
		fmt.Fprintf(out, "duplicate: workflow %s already has a signal with dedup key %s; not stored again\n", id, o.dedup)
		return nil
	}
	fmt.Fprintf(out, "sent signal %s to workflow %s (signal id %d)\n", name, id, res.ID)
	return nil
}

func (o *workflowOpts) cancel(ctx context.Context, out io.Writer, db *pg.Pool, id string) error {
	var before, after *workflow.Info
	err := pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
		var err error
		if before, err = workflow.Get(ctx, tx, id); err != nil {
			return err
		}
		if err := workflow.CancelTx(ctx, tx, id, o.reason); err != nil {
			return err
		}
		after, err = workflow.Get(ctx, tx, id)
		return err
	})
	if err != nil {
		return err
	}
	switch {
	case before.Status == workflow.Cancelled || before.Status == workflow.Cancelling:
		fmt.Fprintf(out, "workflow %s is already %s: nothing to do\n", id, before.Status)
	case after.Status == workflow.Cancelling:
		fmt.Fprintf(out, "cancelling workflow %s (was %s at step %s): its compensation step %s runs once, then it is cancelled\n",
			id, before.Status, before.Step, after.Step)
	default:
		fmt.Fprintf(out, "cancelled workflow %s (was %s at step %s)\n", id, before.Status, before.Step)
	}
	return nil
}

func retryWorkflow(ctx context.Context, out io.Writer, db *pg.Pool, id string) error {
	var before, after *workflow.Info
	err := pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
		var err error
		if before, err = workflow.Get(ctx, tx, id); err != nil {
			return err
		}
		if err := workflow.RetryTx(ctx, tx, id); err != nil {
			return err
		}
		after, err = workflow.Get(ctx, tx, id)
		return err
	})
	if err != nil {
		return err
	}
	if before.Status == workflow.Failed {
		fmt.Fprintf(out, "retrying workflow %s at step %s, with fresh attempts (seq %d)\n", id, after.Step, after.Seq)
		return nil
	}
	// An unfinished workflow whose step job was gone: a new job where it stands.
	fmt.Fprintf(out, "workflow %s (%s at step %s) had no live step job: it has a new one, job %s (seq %d)\n",
		id, after.Status, after.Step, optInt(after.JobID), after.Seq)
	return nil
}

// writeJSON writes v as indented JSON.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// fmtTime is t in UTC, to the millisecond.
func fmtTime(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }

// tookText is a step's duration, from its seconds.
func tookText(secs *float64) string {
	if secs == nil {
		return "-"
	}
	d := time.Duration(*secs * float64(time.Second))
	switch {
	case d < time.Millisecond:
		return d.Round(time.Microsecond).String()
	case d < time.Second:
		return d.Round(100 * time.Microsecond).String()
	default:
		return d.Round(time.Millisecond).String()
	}
}

// compactJSON is a stored JSON value on one line.
func compactJSON(raw json.RawMessage) string {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return string(raw)
	}
	return b.String()
}

// messageOf is err's text without its code, to quote in another error.
func messageOf(err error) string {
	return strings.TrimPrefix(err.Error(), string(fault.CodeOf(err))+": ")
}

func optInt(p *int64) string {
	if p == nil {
		return "-"
	}
	return strconv.FormatInt(*p, 10)
}

// attemptText is a history row's job attempt; "-" for a row no job wrote (a
// cancel, a retry).
func attemptText(n int) string {
	if n <= 0 {
		return "-"
	}
	return strconv.Itoa(n)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// flagsApply refuses (a usage error) a flag of set, by name, given to a verb
// of command whose flags it is not: a flag given where it does nothing is a
// mistake worth saying. The first such flag in name order is named.
func flagsApply(command, verb string, set map[string]bool, flags []string) error {
	names := make([]string, 0, len(set))
	for name, on := range set {
		if on && !slices.Contains(flags, name) {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return nil
	}
	sort.Strings(names)
	return usageErr("%s %s: --%s does not apply to it (see %s --help)", command, verb, names[0], command)
}
