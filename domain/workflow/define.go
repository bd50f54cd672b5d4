package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/bettercompute/bettercompute/platform/fault"
)

// Workflow is the definition of a workflow kind: its input In, its state S, its
// result Out and its steps. Register it in a worker process with
// workers.AddWorkflow; start one with its StartTx.
//
//	var Order = &workflow.Workflow[OrderInput, OrderState, OrderResult]{
//		Kind: "order",
//		Init: func(in OrderInput) (OrderState, error) { return OrderState{OrderID: in.OrderID}, nil },
//		Steps: []workflow.Step[OrderState]{
//			{Name: "reserve", Tx: reserve},
//			{Name: "confirm", Tx: confirm},
//			{Name: "release", Tx: release},
//		},
//		Signals: []string{"paid"},
//	}
type Workflow[In, S, Out any] struct {
	// Kind names the workflow: [a-z][a-z0-9_]{0,62}.
	Kind string
	// Init makes the state from the input. It runs at the start (StartTx), on
	// the input decoded into In, only to check it: an error refuses the start
	// (INVALID_ARGUMENT, nothing written) and the state it returns is
	// dropped. It runs again whenever a step runs while the state is still
	// empty (the first step, at each of its attempts until one commits, or
	// the compensation of a workflow cancelled before that), and that state
	// is the one the step gets and saves. So it must depend only on the input.
	// Nil starts from S's zero value.
	Init func(in In) (S, error)
	// Steps are the workflow's steps; the first is where every instance starts.
	Steps []Step[S]
	// Signals are the names SignalTx accepts for this kind.
	Signals []string
	// Compensate, optional, names the step that runs once when the workflow is
	// cancelled (Call.Cancelled is true). Meanwhile the workflow is
	// cancelling, and the cancel's reason is its error throughout; the
	// compensation may Goto further steps (they run cancelling too), Finish or
	// Fail, and the workflow is then cancelled, with that reason (and
	// "; compensation failed: …" after a Fail or an exhausted step). It may
	// not Sleep, AwaitSignal or StartChildren: that fails the compensation.
	Compensate string
}

// Step is one named step. Exactly one of Tx and External is set.
type Step[S any] struct {
	Name string
	// Tx is a transactional step: it runs inside the step's fenced transaction,
	// and its writes in tx commit with the new state, the history row and the
	// next step's job, exactly once, or not at all.
	Tx func(ctx context.Context, tx pgx.Tx, c *Call[S]) (Next, error)
	// External is an external step: it calls the outside world (at least once,
	// with c.IdempotencyKey, the same on every retry) and its result is recorded
	// in a fenced transaction afterwards. It must not write the database.
	External func(ctx context.Context, c *Call[S]) (Next, error)
	// Retry is the step's retry policy (attempts and backoff) for errors.
	Retry Retry
	// OnError, optional, names the step the workflow goes to when this step
	// exhausts its attempts (Call.Err holds the error); without it the
	// workflow fails.
	OnError string
}

// Retry is a step's retry policy.
type Retry struct {
	// Attempts is how many times the step runs before it gives up (default
	// DefaultAttempts; at most River's 25 for a workflow's first step).
	Attempts int
	// Backoff is the wait before the second attempt, doubled at each later one
	// (default 1 s), up to MaxBackoff (default 5 min).
	Backoff    time.Duration
	MaxBackoff time.Duration
}

// DefaultAttempts is Retry.Attempts' default.
const DefaultAttempts = 10

// Attempts returns the policy's attempts, defaulted.
func (r Retry) attempts() int {
	if r.Attempts <= 0 {
		return DefaultAttempts
	}
	return r.Attempts
}

// Delay returns the wait before attempt+1 after attempt failed.
func (r Retry) Delay(attempt int) time.Duration {
	base, max := r.Backoff, r.MaxBackoff
	if base <= 0 {
		base = time.Second
	}
	if max <= 0 {
		max = 5 * time.Minute
	}
	d := base
	for i := 1; i < attempt && d < max; i++ {
		d *= 2
	}
	return min(d, max)
}

// Call is what a step gets: the workflow, the state it may change, and the
// event that resumed it.
type Call[S any] struct {
	WorkflowID string
	Kind       string
	Step       string
	// Seq is the instance's sequence number this step execution advances.
	Seq int64
	// Attempt is the River job's attempt (1 for the first).
	Attempt int
	// IdempotencyKey is the same on every retry of this step execution, and
	// differs between executions: give it to an outside API.
	IdempotencyKey string
	// State is the saved state; the step changes it in place, and the change is
	// saved with the transition.
	State *S
	// Input is the workflow's input as started.
	Input json.RawMessage
	// Signal is the signal that resumed an AwaitSignal, or nil.
	Signal *Signal
	// TimedOut is true when an await's deadline resumed the step instead.
	TimedOut bool
	// Children are the outcomes of the children a StartChildren awaited.
	Children []ChildOutcome
	// Cancelled is true in the compensation step of a cancelled workflow.
	Cancelled bool
	// Err is the error of the step that failed, in its OnError step.
	Err string
}

// Signal is a received signal.
type Signal struct {
	Name    string
	Payload json.RawMessage
	SentAt  time.Time
	id      int64
	cause   string
}

// Cause is the W3C traceparent of the span that sent the signal (SignalTx's
// context), "" when it had no sampled span: the step that consumes the signal
// links to it.
func (s *Signal) Cause() string { return s.cause }

// Decode decodes the signal's payload into v.
func (s *Signal) Decode(v any) error {
	if len(s.Payload) == 0 {
		return nil
	}
	if err := json.Unmarshal(s.Payload, v); err != nil {
		return fault.Wrap(fault.InvalidArgument, err, "signal %s does not decode", s.Name)
	}
	return nil
}

// ChildOutcome is a child workflow's outcome as its parent sees it.
type ChildOutcome struct {
	ID     string
	Kind   string
	Status Status
	Result json.RawMessage
	Error  string
}

// Decode decodes the child's result into v.
func (c ChildOutcome) Decode(v any) error {
	if len(c.Result) == 0 {
		return nil
	}
	return json.Unmarshal(c.Result, v)
}

// Child is a child workflow a step starts.
type Child struct {
	Kind  string
	Input any
	// ID, optional, is the child's id; by default <parent id>/<seq>.<index>.
	ID string
}

// Status is a workflow's status.
type Status string

// The statuses (see the package doc's diagram).
const (
	Running    Status = "running"
	Sleeping   Status = "sleeping"
	Waiting    Status = "waiting"
	Cancelling Status = "cancelling"
	Completed  Status = "completed"
	Failed     Status = "failed"
	Cancelled  Status = "cancelled"
)

// Finished reports whether s is a final status.
func (s Status) Finished() bool { return s == Completed || s == Failed || s == Cancelled }

// Statuses are all statuses, in the diagram's order.
var Statuses = []Status{Running, Sleeping, Waiting, Cancelling, Completed, Failed, Cancelled}

// Next is what a step asks for next: build it with Goto, Sleep, AwaitSignal,
// StartChildren, StartChildrenAny, Finish or Fail.
type Next struct {
	op          string // goto, sleep, await, children, finish, fail
	step        string
	timeoutStep string
	d           time.Duration
	signal      string
	children    []Child
	any         bool
	result      any
	reason      string
}

// Goto runs step next.
func Goto(step string) Next { return Next{op: "goto", step: step} }

// Sleep runs step after d on compute_now(), holding no worker meanwhile.
func Sleep(d time.Duration, step string) Next { return Next{op: "sleep", step: step, d: d} }

// AwaitSignal waits for the signal name: when it comes, step runs with
// Call.Signal; if timeout (> 0) passes first, onTimeout runs with
// Call.TimedOut. A signal sent earlier waits in the inbox and resumes at once.
func AwaitSignal(name string, timeout time.Duration, step, onTimeout string) Next {
	return Next{op: "await", signal: name, d: timeout, step: step, timeoutStep: onTimeout}
}

// StartChildren starts children and runs step when all of them have finished
// (Call.Children holds their outcomes: completed, failed or cancelled).
func StartChildren(children []Child, step string) Next {
	return Next{op: "children", children: children, step: step}
}

// StartChildrenAny starts children and runs step as soon as any of them has
// finished.
func StartChildrenAny(children []Child, step string) Next {
	return Next{op: "children", children: children, step: step, any: true}
}

// WithTimeout bounds a StartChildren wait: onTimeout runs if the children
// have not finished after d.
func (n Next) WithTimeout(d time.Duration, onTimeout string) Next {
	n.d, n.timeoutStep = d, onTimeout
	return n
}

// Finish completes the workflow with result (of the workflow's Out type).
func Finish(result any) Next { return Next{op: "finish", result: result} }

// Fail fails the workflow now, with reason, without retrying the step.
func Fail(reason string) Next { return Next{op: "fail", reason: reason} }

// Meta is a definition without its types: what the worker, the versioning
// check and the CLI read.
type Meta struct {
	Kind       string
	Steps      []StepMeta
	Signals    []string
	Compensate string
}

// StepMeta is a step without its function.
type StepMeta struct {
	Name     string
	External bool
	Retry    Retry
	OnError  string
}

// Step returns the step named name.
func (m Meta) Step(name string) (StepMeta, bool) {
	for _, s := range m.Steps {
		if s.Name == name {
			return s, true
		}
	}
	return StepMeta{}, false
}

// HasSignal reports whether name is one of the kind's signals.
func (m Meta) HasSignal(name string) bool {
	for _, s := range m.Signals {
		if s == name {
			return true
		}
	}
	return false
}

// Definition is a Workflow of any types: what workers.AddWorkflow registers.
type Definition interface {
	Meta() Meta
	// Validate checks the definition (INVALID_CONFIG).
	Validate() error
	// CheckInput checks that input decodes into the workflow's In and that
	// its Init accepts it (INVALID_ARGUMENT otherwise).
	CheckInput(input json.RawMessage) error
	// StartJSONTx starts a workflow of this definition with input as JSON:
	// see Workflow.StartTx.
	StartJSONTx(ctx context.Context, tx pgx.Tx, input json.RawMessage, opts *StartOpts) (string, error)
	// Run runs a step: see Invocation.
	Run(ctx context.Context, tx pgx.Tx, inv *Invocation) (Next, error)
}

// Invocation is one step execution, untyped: the worker fills it, Run decodes
// the state, calls the step and encodes the state it leaves in NewState.
type Invocation struct {
	WorkflowID, Kind, Step string
	Seq                    int64
	Attempt                int
	Input, State           json.RawMessage
	Signal                 *Signal
	TimedOut, Cancelled    bool
	Children               []ChildOutcome
	Err                    string
	// NewState is the state after the step (set by Run).
	NewState json.RawMessage
}

// ErrUndecodable marks a state or input that no longer decodes into the
// definition's types: the workflow fails, never retried.
var ErrUndecodable = errors.New("does not decode")

// Meta implements Definition.
func (w *Workflow[In, S, Out]) Meta() Meta {
	m := Meta{Kind: w.Kind, Signals: append([]string(nil), w.Signals...), Compensate: w.Compensate}
	for _, s := range w.Steps {
		m.Steps = append(m.Steps, StepMeta{Name: s.Name, External: s.External != nil, Retry: s.Retry, OnError: s.OnError})
	}
	return m
}

var (
	kindRe = regexp.MustCompile(`^[a-z][a-z0-9_]{0,62}$`)
	nameRe = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_.-]{0,62}$`)
	idRe   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:/@-]{0,254}$`)
)

// Validate implements Definition.
func (w *Workflow[In, S, Out]) Validate() error {
	bad := func(format string, args ...any) error {
		return fault.New(fault.InvalidConfig, "workflow %s: "+format, append([]any{w.Kind}, args...)...)
	}
	if !kindRe.MatchString(w.Kind) {
		return fault.New(fault.InvalidConfig, "workflow kind %q: want [a-z][a-z0-9_]{0,62}", w.Kind)
	}
	if len(w.Steps) == 0 {
		return bad("has no steps")
	}
	seen := map[string]bool{}
	for _, s := range w.Steps {
		if !nameRe.MatchString(s.Name) {
			return bad("step name %q: want [A-Za-z][A-Za-z0-9_.-]{0,62}", s.Name)
		}
		if seen[s.Name] {
			return bad("step %s is defined twice", s.Name)
		}
		seen[s.Name] = true
		if (s.Tx == nil) == (s.External == nil) {
			return bad("step %s needs exactly one of Tx and External", s.Name)
		}
		if s.Retry.Attempts < 0 || s.Retry.Backoff < 0 || s.Retry.MaxBackoff < 0 {
			return bad("step %s: a negative retry setting", s.Name)
		}
	}
	for _, s := range w.Steps {
		if s.OnError != "" && !seen[s.OnError] {
			return bad("step %s: OnError step %s is not defined", s.Name, s.OnError)
		}
	}
	if w.Compensate != "" && !seen[w.Compensate] {
		return bad("compensation step %s is not defined", w.Compensate)
	}
	for _, sig := range w.Signals {
		if !nameRe.MatchString(sig) {
			return bad("signal name %q: want [A-Za-z][A-Za-z0-9_.-]{0,62}", sig)
		}
	}
	return nil
}

// CheckInput implements Definition: the input as the first step will see it
// (decoded from JSON into In) goes through Init, whose state is dropped. An
// error of Init's is INVALID_ARGUMENT: as it is when it has that code, wrapped
// otherwise.
func (w *Workflow[In, S, Out]) CheckInput(input json.RawMessage) (err error) {
	var in In
	if err := json.Unmarshal(input, &in); err != nil {
		return fault.Wrap(fault.InvalidArgument, err, "the input of workflow %s does not decode", w.Kind)
	}
	if w.Init == nil {
		return nil
	}
	defer func() {
		if r := recover(); r != nil {
			err = fault.New(fault.InvalidArgument, "workflow %s refuses its input: Init panicked: %v", w.Kind, r)
		}
	}()
	if _, err := w.Init(in); err != nil {
		if fault.Has(err, fault.InvalidArgument) {
			return err
		}
		return fault.Wrap(fault.InvalidArgument, err, "workflow %s refuses its input (Init)", w.Kind)
	}
	return nil
}

// Run implements Definition.
func (w *Workflow[In, S, Out]) Run(ctx context.Context, tx pgx.Tx, inv *Invocation) (Next, error) {
	var step *Step[S]
	for i := range w.Steps {
		if w.Steps[i].Name == inv.Step {
			step = &w.Steps[i]
		}
	}
	if step == nil {
		return Next{}, fault.New(fault.InvalidConfig, "workflow %s has no step %s", w.Kind, inv.Step)
	}
	var state S
	if len(inv.State) == 0 || string(inv.State) == "null" {
		if w.Init != nil {
			var in In
			if err := json.Unmarshal(inv.Input, &in); err != nil {
				return Next{}, fault.Wrap(fault.InvalidArgument, fmt.Errorf("%w: %w", ErrUndecodable, err), "the input of workflow %s %s does not decode", w.Kind, inv.WorkflowID)
			}
			s, err := w.Init(in)
			if err != nil {
				return Next{}, err
			}
			state = s
		}
	} else if err := json.Unmarshal(inv.State, &state); err != nil {
		return Next{}, fault.Wrap(fault.InvalidArgument, fmt.Errorf("%w: %w", ErrUndecodable, err), "the state of workflow %s %s does not decode", w.Kind, inv.WorkflowID)
	}
	c := &Call[S]{
		WorkflowID: inv.WorkflowID, Kind: w.Kind, Step: inv.Step, Seq: inv.Seq, Attempt: inv.Attempt,
		IdempotencyKey: IdempotencyKey(inv.WorkflowID, inv.Step, inv.Seq),
		State:          &state, Input: inv.Input, Signal: inv.Signal, TimedOut: inv.TimedOut,
		Children: inv.Children, Cancelled: inv.Cancelled, Err: inv.Err,
	}
	var (
		next Next
		err  error
	)
	if step.Tx != nil {
		if tx == nil {
			return Next{}, fault.New(fault.Internal, "workflow %s: transactional step %s run without a transaction", w.Kind, inv.Step)
		}
		next, err = step.Tx(ctx, tx, c)
	} else {
		next, err = step.External(ctx, c)
	}
	if err != nil {
		return Next{}, err
	}
	enc, err := json.Marshal(state)
	if err != nil {
		return Next{}, fault.Wrap(fault.InvalidArgument, err, "the state of workflow %s does not encode", w.Kind)
	}
	inv.NewState = enc
	return next, nil
}

// IdempotencyKey is the idempotency key of one step execution: the same on
// every retry of it.
func IdempotencyKey(id, step string, seq int64) string {
	return fmt.Sprintf("%s/%s/%d", id, step, seq)
}
