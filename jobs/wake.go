package jobs

import (
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"

	"github.com/bettercompute/bettercompute/platform/pg"
)

// Wake-ups in process: a transaction that makes a key's job available (a
// workflow's start, a signal that resumes it, a step that hands it to a new
// job) asks, with WakeAfterCommit, that the worker runtimes of this process
// be told once it commits (pg.AfterCommit); a runtime that works the key's
// shard then fetches at once instead of at its next poll. No LISTEN/NOTIFY:
// it works behind PgBouncer in transaction mode, and a job inserted by
// another process is still fetched at the poll.

var (
	wakersMu sync.Mutex
	wakers   = map[*wakeFn]struct{}{}
	nWakers  atomic.Int32
)

type wakeFn struct{ fn func(key string) }

// OnWake registers fn, called with a key (a workflow id) after a
// transaction that made the key's job available commits in this process; the
// function it returns unregisters fn. fn must not block.
func OnWake(fn func(key string)) (stop func()) {
	w := &wakeFn{fn: fn}
	wakersMu.Lock()
	wakers[w] = struct{}{}
	nWakers.Store(int32(len(wakers)))
	wakersMu.Unlock()
	return func() {
		wakersMu.Lock()
		delete(wakers, w)
		nWakers.Store(int32(len(wakers)))
		wakersMu.Unlock()
	}
}

// WakeAfterCommit tells the OnWake functions of this process about key once
// tx commits. It does nothing when none is registered, or when tx is not a
// transaction of a pool of platform/pg (pg.AfterCommit).
func WakeAfterCommit(tx pgx.Tx, key string) {
	if nWakers.Load() == 0 {
		return
	}
	pg.AfterCommit(tx, func() {
		wakersMu.Lock()
		fns := make([]func(string), 0, len(wakers))
		for w := range wakers {
			fns = append(fns, w.fn)
		}
		wakersMu.Unlock()
		for _, fn := range fns {
			fn(key)
		}
	})
}
