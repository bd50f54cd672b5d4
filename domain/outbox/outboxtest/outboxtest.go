// Package outboxtest appends and reads outbox events for tests: each append in
// its own transaction, each read following the cursor until the events it
// waits for are readable.
package outboxtest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/domain/outbox"
	"github.com/bettercompute/bettercompute/platform/pg"
)

// Append appends one event in its own transaction.
func Append(tb testing.TB, db pg.DBTX, topic, key string, payload any) {
	tb.Helper()
	ctx := context.Background()
	require.NoError(tb, pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
		return outbox.AppendTx(ctx, tx, outbox.Message{Topic: topic, Key: key, Payload: payload})
	}))
}

// ReadN reads after c (only topics, if any), following the cursor, until it
// has n events, and returns them and the cursor after them. Every test
// database shares one cluster, and the read rule waits for every older
// transaction of the cluster (another test creating its database, say), so a
// committed event may take a moment to become readable.
func ReadN(tb testing.TB, db pg.DBTX, c outbox.Cursor, n int, topics ...string) ([]outbox.Event, outbox.Cursor) {
	tb.Helper()
	var out []outbox.Event
	deadline := time.Now().Add(20 * time.Second)
	for len(out) < n {
		evs, next, _, err := outbox.Read(context.Background(), db, outbox.ReadOptions{After: c, Limit: 3, Topics: topics})
		require.NoError(tb, err)
		out = append(out, evs...)
		c = next
		if time.Now().After(deadline) {
			tb.Fatalf("read %d events, want %d", len(out), n)
		}
		if len(evs) == 0 {
			time.Sleep(5 * time.Millisecond)
		}
	}
	require.Len(tb, out, n)
	return out, c
}

// AppendIDs appends n events of topic "t", one transaction each, keyed key0,
// key1 …, and returns their ids once they are readable after after.
func AppendIDs(tb testing.TB, db pg.DBTX, after outbox.Cursor, key string, n int) []outbox.Cursor {
	tb.Helper()
	for i := 0; i < n; i++ {
		Append(tb, db, "t", key+string(rune('0'+i)), i)
	}
	evs, _ := ReadN(tb, db, after, n)
	ids := make([]outbox.Cursor, n)
	for i, e := range evs {
		ids[i] = e.ID
	}
	return ids
}
