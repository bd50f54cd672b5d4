package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/bettercompute/bettercompute/domain/backfill"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/backfillworker"
)

// backfillOpts are the backfill command's flags: the operator verbs over the
// backfills this binary registers (workers/backfillworker).
type backfillOpts struct {
	watch    bool
	every    time.Duration
	progress string
	demo     bool // deprecated, no effect
}

const backfillUsage = "list | start NAME | pause NAME | resume NAME | cancel NAME | status NAME [--watch]"

func (o *backfillOpts) bind(fs *flag.FlagSet) {
	fs.BoolVar(&o.watch, "watch", false, "status: follow the backfill until it is done or cancelled")
	fs.DurationVar(&o.every, "every", time.Second, "status --watch: how often to read the progress")
	fs.StringVar(&o.progress, "progress", "auto", "status: bar, lines, or auto (a bar when stdout is a terminal)")
	fs.BoolVar(&o.demo, "demo", false, "deprecated, no effect: the better-compute binary always knows its demo backfills")
}

// Validate checks the verb, its arguments and the flags.
func (o *backfillOpts) Validate(args []string) error {
	if len(args) == 0 {
		return usageErr("backfill needs a verb: %s", backfillUsage)
	}
	verb, rest := args[0], args[1:]
	switch verb {
	case "list":
		if len(rest) > 0 {
			return usageErr("backfill list takes no arguments, got %q", rest)
		}
	case "start", "pause", "resume", "cancel", "status":
		if len(rest) != 1 {
			return usageErr("backfill %s takes one backfill name, got %q", verb, rest)
		}
	default:
		return usageErr("backfill: unknown verb %q; want %s", verb, backfillUsage)
	}
	switch o.progress {
	case "auto", "bar", "lines":
	default:
		return usageErr("backfill --progress %q: want auto, bar or lines", o.progress)
	}
	if o.every <= 0 {
		return usageErr("backfill --every %s: want a positive duration", o.every)
	}
	return nil
}

func backfillCommand() *command {
	o := &backfillOpts{}
	return &command{
		name:    "backfill",
		summary: "run and watch the backfills this binary registers: " + backfillUsage,
		usage:   backfillUsage,
		opts:    o,
		run:     o.run,
	}
}

// run runs one verb. A name must be one this binary registers: that is decided
// before the database is touched.
func (o *backfillOpts) run(ctx context.Context, s *Session, args []string) error {
	if err := s.setup(); err != nil {
		return err
	}
	reg, err := s.Registry()
	if err != nil {
		return err
	}
	verb := args[0]
	var b workers.Backfill
	if verb != "list" {
		if b, err = backfillworker.Lookup(reg, args[1]); err != nil {
			return err
		}
	}
	db, err := s.Pool(ctx)
	if err != nil {
		return err
	}
	out := s.Env.Stdout
	switch verb {
	case "list":
		return backfillList(ctx, out, db, backfillworker.Registered(reg))
	case "start":
		return backfillStart(ctx, s, db, b)
	case "pause", "resume", "cancel":
		return backfillSteer(ctx, s, db, verb, b)
	default: // status
		bar := o.progress == "bar" || o.progress == "auto" && isTerminal(out)
		if o.watch {
			return watchBackfill(ctx, out, db, b, bar, o.every)
		}
		return backfillStatus(ctx, out, db, b, bar)
	}
}

// backfillStart starts b (a new epoch) and says how to watch it.
func backfillStart(ctx context.Context, s *Session, db *pg.Pool, b workers.Backfill) error {
	p, err := backfill.Start(ctx, db, b.Name, b.Estimate)
	if err != nil {
		return err
	}
	out := s.Env.Stdout
	fmt.Fprintf(out, "started backfill %s (epoch %d, batches of %d rows)", b.Name, p.Epoch, b.BatchSize)
	if left, ok := p.Left(); ok {
		fmt.Fprintf(out, ": ~%d rows to go", left)
	}
	fmt.Fprintf(out, "\nwatch it: %s backfill status %s --watch\n", s.App.name(), b.Name)
	return nil
}

// backfillSteer pauses, resumes or cancels b.
func backfillSteer(ctx context.Context, s *Session, db *pg.Pool, verb string, b workers.Backfill) error {
	out := s.Env.Stdout
	switch verb {
	case "pause":
		p, err := backfill.Pause(ctx, db, b.Name)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "paused backfill %s after %d rows in %d batches; no batch starts until: %s backfill resume %s\n",
			b.Name, p.RowsDone, p.Batches, s.App.name(), b.Name)
	case "resume":
		p, err := backfill.Resume(ctx, db, b.Name)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "resumed backfill %s at batch %d (%d rows done)\n", b.Name, p.Batches, p.RowsDone)
	default: // cancel
		p, err := backfill.Cancel(ctx, db, b.Name)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "cancelled backfill %s after %d rows in %d batches; start runs it again from the beginning\n",
			b.Name, p.RowsDone, p.Batches)
	}
	return nil
}

// backfillStatus prints b's progress once: a bar (on a terminal) and the
// status block.
func backfillStatus(ctx context.Context, out io.Writer, db pg.DBTX, b workers.Backfill, bar bool) error {
	p, err := getProgress(ctx, db, b.Name)
	if err != nil {
		return err
	}
	if bar {
		r := newBarRenderer(out, b.Name)
		r.update(p)
		r.finish()
	}
	fmt.Fprint(out, statusBlock(p))
	return nil
}

// getProgress is backfill.Get, with a backfill that was never started read as
// pending.
func getProgress(ctx context.Context, db pg.DBTX, name string) (*backfill.Progress, error) {
	p, err := backfill.Get(ctx, db, name)
	if fault.Has(err, fault.NotFound) {
		return &backfill.Progress{Name: name, State: backfill.Pending}, nil
	}
	return p, err
}

// isTerminal says whether w is a terminal (a bar is drawn there).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// backfillList prints one line per registered backfill.
func backfillList(ctx context.Context, out io.Writer, db pg.DBTX, known []workers.Backfill) error {
	rows, err := backfill.List(ctx, db)
	if err != nil {
		return err
	}
	byName := map[string]*backfill.Progress{}
	for _, p := range rows {
		byName[p.Name] = p
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSTATE\tROWS\tBATCHES\tPROGRESS\tRATE\tLAST BATCH\tLAST ERROR")
	for _, b := range known {
		p, ok := byName[b.Name]
		if !ok {
			fmt.Fprintf(tw, "%s\tpending\t-\t-\t-\t-\t-\t-\n", b.Name)
			continue
		}
		delete(byName, b.Name)
		pct := "-"
		if total, ok := p.Total(); ok && total > 0 {
			pct = fmt.Sprintf("%d%%", p.RowsDone*100/total)
		}
		rate := "-"
		if p.Rate != nil && p.State == backfill.Running {
			rate = fmt.Sprintf("%.0f/s", *p.Rate)
		}
		last := "-"
		if p.LastBatchAt != nil {
			last = ago(p.Now.Sub(*p.LastBatchAt))
		}
		lastErr := "-"
		if p.LastError != nil {
			lastErr = oneLine(*p.LastError, 60)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\n", b.Name, stateWord(p), p.RowsDone, p.Batches, pct, rate, last, lastErr)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(byName) > 0 {
		var others []string
		for _, p := range rows {
			if _, ok := byName[p.Name]; ok {
				others = append(others, p.Name+" ("+string(p.State)+")")
			}
		}
		fmt.Fprintf(out, "also in the database, not registered by this binary: %s\n", strings.Join(others, ", "))
	}
	return nil
}

// stateWord is the state, or "stalled" for a running backfill without a live job.
func stateWord(p *backfill.Progress) string {
	if p.Stalled() {
		return "stalled"
	}
	return string(p.State)
}

// stateLine says what the backfill is doing now.
func stateLine(p *backfill.Progress) string {
	switch {
	case p.State == backfill.Pending:
		return "pending (never started)"
	case p.Stalled():
		if p.JobID == nil || p.JobState == nil {
			return "stalled: its batch job is gone; resume carries it on"
		}
		return fmt.Sprintf("stalled: its batch job %d is %s; resume carries it on", *p.JobID, *p.JobState)
	case p.State == backfill.Running && p.JobState != nil && *p.JobState == "retryable":
		return fmt.Sprintf("running, retrying batch %d (attempt %d of %d failed; next at %s)", p.Batches,
			deref(p.JobAttempt), deref(p.JobMaxAttempts), p.JobScheduledAt.UTC().Format(time.RFC3339))
	case p.State == backfill.Running && p.JobScheduledAt != nil && p.JobScheduledAt.After(p.Now.Add(time.Second)):
		return fmt.Sprintf("running, next batch at %s", p.JobScheduledAt.UTC().Format(time.RFC3339))
	}
	return string(p.State)
}

// progressText is "rows in batches", with the share of the estimate.
func progressText(p *backfill.Progress) string {
	s := fmt.Sprintf("%d rows in %d batches", p.RowsDone, p.Batches)
	if total, ok := p.Total(); ok && p.State != backfill.Done {
		pct := int64(100)
		if total > 0 {
			pct = p.RowsDone * 100 / total
		}
		s += fmt.Sprintf(" of ~%d (%d%%)", total, pct)
	}
	return s
}

// rateText is the rate and the ETA, where known.
func rateText(p *backfill.Progress) string {
	if p.Rate == nil || p.State != backfill.Running {
		return ""
	}
	s := fmt.Sprintf("%.0f rows/s", *p.Rate)
	if eta, ok := p.ETA(); ok {
		s += ", ETA " + eta.Round(time.Second).String()
	}
	return s
}

// statusBlock is status's report: one line per fact.
func statusBlock(p *backfill.Progress) string {
	var b strings.Builder
	line := func(k, format string, args ...any) {
		fmt.Fprintf(&b, "%-11s %s\n", k+":", fmt.Sprintf(format, args...))
	}
	line("backfill", "%s", p.Name)
	line("state", "%s", stateLine(p))
	if p.State == backfill.Pending {
		return b.String()
	}
	line("progress", "%s", progressText(p))
	if r := rateText(p); r != "" {
		line("rate", "%s", r)
	}
	if p.LastBatchAt != nil {
		line("last batch", "%d rows in %d ms, %s (%s ago)", deref(p.LastBatchRows), deref(p.LastBatchMS),
			p.LastBatchAt.UTC().Format(time.RFC3339), ago(p.Now.Sub(*p.LastBatchAt)))
	}
	if p.StartedAt != nil {
		line("started", "%s", p.StartedAt.UTC().Format(time.RFC3339))
	}
	if p.FinishedAt != nil {
		line("finished", "%s", p.FinishedAt.UTC().Format(time.RFC3339))
	}
	if p.JobID != nil {
		line("job", "%d, %s, attempt %d of %d (River UI: kind backfill_%s)", *p.JobID, deref(p.JobState),
			deref(p.JobAttempt), deref(p.JobMaxAttempts), p.Name)
	}
	if p.LastError != nil {
		line("last error", "%s (%s, %d failed attempts this run)", *p.LastError, p.LastErrorAt.UTC().Format(time.RFC3339), p.Errors)
	}
	return b.String()
}

// watchLine is one plain line of status --watch.
func watchLine(p *backfill.Progress) string {
	parts := []string{p.Name + ": " + stateLine(p)}
	if p.State != backfill.Pending {
		parts = append(parts, progressText(p))
	}
	if r := rateText(p); r != "" {
		parts = append(parts, r)
	}
	if p.LastError != nil && p.State == backfill.Running && (p.LastBatchAt == nil || p.LastErrorAt.After(*p.LastBatchAt)) {
		parts = append(parts, "last error: "+oneLine(*p.LastError, 200))
	}
	return strings.Join(parts, ", ")
}

// watchBackfill follows the backfill until it is done or cancelled (or ctx
// ends): a live progress bar, or a plain line whenever something changed.
func watchBackfill(ctx context.Context, out io.Writer, db pg.DBTX, b workers.Backfill, bar bool, every time.Duration) error {
	var r *barRenderer
	if bar {
		r = newBarRenderer(out, b.Name)
	}
	last := ""
	for {
		p, err := getProgress(ctx, db, b.Name)
		if err != nil && ctx.Err() == nil {
			return err
		}
		if err == nil {
			end := p.State == backfill.Done || p.State == backfill.Cancelled
			if r != nil {
				r.update(p)
			} else if l := watchLine(p); l != last {
				fmt.Fprintf(out, "%s %s\n", time.Now().UTC().Format(time.RFC3339), l)
				last = l
			}
			if end {
				if r != nil {
					r.finish()
					fmt.Fprintln(out, watchLine(p))
				}
				return nil
			}
		}
		select {
		case <-ctx.Done():
			if r != nil {
				r.finish()
			}
			return nil // interrupted: watching ends, the backfill goes on
		case <-time.After(every):
		}
	}
}

// barRenderer draws a backfill's progress with a progress bar: a bar where the
// estimate gives a total, a spinner where it does not, with the rate and the ETA.
type barRenderer struct {
	out  io.Writer
	name string
	bar  *progressbar.ProgressBar
	max  int64
	desc string
	rows int64
}

func newBarRenderer(out io.Writer, name string) *barRenderer {
	return &barRenderer{out: out, name: name}
}

func (r *barRenderer) update(p *backfill.Progress) {
	total, known := p.Total()
	max := int64(-1)
	if known {
		max = total
		if max < p.RowsDone {
			max = p.RowsDone
		}
		if max == 0 {
			max = 1 // the bar needs a positive total
		}
	}
	if r.bar == nil || (r.max == -1) != (max == -1) {
		if r.bar != nil {
			_ = r.bar.Finish()
			fmt.Fprintln(r.out)
		}
		r.bar = progressbar.NewOptions64(max,
			progressbar.OptionSetWriter(r.out),
			progressbar.OptionSetWidth(30),
			progressbar.OptionShowCount(),
			progressbar.OptionSetPredictTime(false),
			progressbar.OptionSetElapsedTime(false),
			progressbar.OptionShowDescriptionAtLineEnd(),
			progressbar.OptionThrottle(0),
			progressbar.OptionSpinnerType(14),
		)
		r.desc, r.rows = "", -1
	} else if max != r.max && max != -1 {
		r.bar.ChangeMax64(max)
	}
	r.max = max
	desc := r.name + " " + stateWord(p)
	if rt := rateText(p); rt != "" {
		desc += " · " + rt
	}
	if desc == r.desc && p.RowsDone == r.rows {
		return // nothing new to draw
	}
	r.desc, r.rows = desc, p.RowsDone
	r.bar.Describe(desc)
	_ = r.bar.Set64(p.RowsDone)
}

func (r *barRenderer) finish() {
	if r.bar != nil {
		_ = r.bar.Exit()
		fmt.Fprintln(r.out)
	}
}
