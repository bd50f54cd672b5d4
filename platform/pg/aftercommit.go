package pg

import (
	"context"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
)

// AfterCommit runs fn once the transaction tx belongs to commits (the
// top-level COMMIT, when tx is a savepoint), on the goroutine that committed,
// and never when it rolls back or its connection is lost. It reports false,
// and does nothing, when tx is not a transaction of a pool this package
// opened (Open, Sibling): only those tell their commits.
//
// It is how a write wakes work in this process without LISTEN/NOTIFY (which
// PgBouncer in transaction mode does not carry): workflow starts and signals
// wake the River producer of this process that works their queue, once the
// rows are visible to it. fn must be quick and must not block: it runs
// before the connection goes back to the pool.
func AfterCommit(tx pgx.Tx, fn func()) bool {
	c := tx.Conn()
	if c == nil {
		return false
	}
	t, ok := c.Config().Tracer.(*commitTracer)
	if !ok {
		return false
	}
	t.mu.Lock()
	t.hooks[c] = append(t.hooks[c], fn)
	t.mu.Unlock()
	return true
}

// commitTracer is the pool's pgx query tracer: it runs the AfterCommit hooks
// of a connection when its COMMIT succeeds, and drops them at its ROLLBACK,
// at the connection's next BEGIN (a transaction that ended any other way) or
// when the connection is closed.
type commitTracer struct {
	mu    sync.Mutex
	hooks map[*pgx.Conn][]func()
}

func newCommitTracer() *commitTracer { return &commitTracer{hooks: map[*pgx.Conn][]func(){}} }

type endsTx struct{}

// TraceQueryStart implements pgx.QueryTracer: it marks pgx's COMMIT and
// ROLLBACK (the statements a pgx.Tx ends with).
func (t *commitTracer) TraceQueryStart(ctx context.Context, c *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	switch {
	case len(data.SQL) <= len("rollback") && (strings.EqualFold(data.SQL, "commit") || strings.EqualFold(data.SQL, "rollback")):
		return context.WithValue(ctx, endsTx{}, true)
	case len(data.SQL) >= len("begin") && strings.EqualFold(data.SQL[:len("begin")], "begin"):
		t.take(c)
	}
	return ctx
}

// TraceQueryEnd implements pgx.QueryTracer.
func (t *commitTracer) TraceQueryEnd(ctx context.Context, c *pgx.Conn, data pgx.TraceQueryEndData) {
	if ctx.Value(endsTx{}) == nil {
		return
	}
	hooks := t.take(c)
	if data.Err != nil || data.CommandTag.String() != "COMMIT" {
		return
	}
	for _, fn := range hooks {
		fn()
	}
}

// take removes and returns c's hooks.
func (t *commitTracer) take(c *pgx.Conn) []func() {
	t.mu.Lock()
	defer t.mu.Unlock()
	hooks, ok := t.hooks[c]
	if ok {
		delete(t.hooks, c)
	}
	return hooks
}
