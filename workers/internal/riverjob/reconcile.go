package riverjob

import (
	"encoding/json"
	"regexp"

	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/fault"
)

// Reconcile is the River job that reconciles one key of a reconciler kind on its
// own: a key whose reconcile failed in a batch gets one, retried with River's
// backoff, its errors and attempts shown in River UI. It is inserted by the
// workers, never directly.
type Reconcile struct {
	Reconciler string `json:"reconciler"` // the reconciler kind
	Key        string `json:"key"`
}

// ReconcileKind is Reconcile's River job kind.
const ReconcileKind = "reconcile"

// Kind implements river.JobArgs.
func (Reconcile) Kind() string { return ReconcileKind }

// UnmarshalJSON rejects args without a kind or a key, so a malformed job fails
// at decode (and is cancelled) instead of reconciling nothing.
func (r *Reconcile) UnmarshalJSON(b []byte) error {
	type plain Reconcile
	var p plain
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	if err := ValidateKind(p.Reconciler); err != nil {
		return err
	}
	if p.Key == "" {
		return invalid("reconcile job args have no key")
	}
	*r = Reconcile(p)
	return nil
}

// invalid is the INVALID_ARGUMENT error of a call or of job args that cannot be
// worked (workers cancel such a job rather than retry it), as jobs' own.
func invalid(format string, args ...any) error {
	return fault.New(fault.InvalidArgument, format, args...)
}

var kindRe = regexp.MustCompile(`^[a-z][a-z0-9_]{0,62}$`)

// ValidateKind checks a reconciler kind: lowercase letters, digits and _, at most
// 63 characters, starting with a letter. It returns INVALID_ARGUMENT.
func ValidateKind(kind string) error {
	if !kindRe.MatchString(kind) {
		return invalid("reconciler kind %q: want [a-z][a-z0-9_]{0,62}", kind)
	}
	return nil
}

// MaxKeyLen is the longest key workers.DirtyTx and workers.InsertForKeyTx accept.
const MaxKeyLen = 512

// CheckKey is INVALID_ARGUMENT, prefixed with what, for a key that is empty,
// longer than MaxKeyLen, or not text PostgreSQL stores (fault.CheckText).
func CheckKey(what, key string) error {
	if key == "" || len(key) > MaxKeyLen {
		return invalid("%s: key must be 1 to %d bytes, got %d", what, MaxKeyLen, len(key))
	}
	return fault.CheckText(what+": key", key)
}

// ReconcileBatch is the River job that carries a batch of dirty keys of one
// reconciler and shard: the shard's holder claims due keys from compute_dirty,
// inserts this job running under itself (as River's fetch would mark it) and
// reconciles the keys in one fenced transaction that completes it. If that
// process dies first, the next holder hands the job back and River works it.
// Keys lists the batch's keys when it was claimed, for operators; the job
// reconciles the keys whose dirty rows point at it. Its kind is
// jobs.ReconcileBatchKind, the one jobs.ClaimDirtySQL inserts.
type ReconcileBatch struct {
	Reconciler string   `json:"reconciler"`
	Keys       []string `json:"keys"`
}

// Kind implements river.JobArgs.
func (ReconcileBatch) Kind() string { return jobs.ReconcileBatchKind }

// UnmarshalJSON rejects args without a valid reconciler kind.
func (r *ReconcileBatch) UnmarshalJSON(b []byte) error {
	type plain ReconcileBatch
	var p plain
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	if err := ValidateKind(p.Reconciler); err != nil {
		return err
	}
	*r = ReconcileBatch(p)
	return nil
}

// Resync is the periodic job that re-dirties every key a reconciler owns. Its
// kind is jobs.ResyncKind.
type Resync struct {
	Reconciler string `json:"reconciler"`
}

// Kind implements river.JobArgs.
func (Resync) Kind() string { return jobs.ResyncKind }
