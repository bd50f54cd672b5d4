package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/bettercompute/bettercompute/domain/outbox"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
)

// Events are appended in the transaction that changes the state they report:
// both commit, or neither. Events of one call are read back in the order given.
func ExampleAppendTx() {
	ctx := context.Background()
	db := pgtest.ForExample().Pool // the application's pool
	// A transaction that rolls back appends nothing.
	_ = pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
		if err := outbox.AppendTx(ctx, tx, outbox.Message{Topic: "order.placed", Key: "o-0"}); err != nil {
			return err
		}
		return errors.New("the order's insert failed")
	})
	err := pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
		// … the application's own writes in tx …
		return outbox.AppendTx(ctx, tx,
			outbox.Message{Topic: "order.placed", Key: "o-1", Payload: map[string]int{"cents": 1250}},
			outbox.Message{Topic: "order.paid", Key: "o-1", Payload: map[string]int{"cents": 1250}},
		)
	})
	if err != nil {
		panic(err)
	}

	for _, e := range exampleRead(db, 2) {
		fmt.Println(e.Topic, e.Key, string(e.Payload))
	}
	// Output:
	// order.placed o-1 {"cents": 1250}
	// order.paid o-1 {"cents": 1250}
}

// A reader keeps the cursor Read returns and reads after it next time: it
// skips no event and reads none twice, whatever order transactions commit in.
func ExampleRead() {
	ctx := context.Background()
	db := pgtest.ForExample().Pool
	for _, key := range []string{"o-1", "o-2", "o-3"} {
		err := pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
			return outbox.AppendTx(ctx, tx, outbox.Message{Topic: "order.placed", Key: key})
		})
		if err != nil {
			panic(err)
		}
	}

	var cursor outbox.Cursor // the zero cursor: from the start
	for got, deadline := 0, time.Now().Add(time.Minute); got < 3 && time.Now().Before(deadline); {
		events, next, _, err := outbox.Read(ctx, db, outbox.ReadOptions{After: cursor, Limit: 2})
		if err != nil {
			panic(err)
		}
		for _, e := range events {
			fmt.Println(e.Topic, e.Key)
			got++
		}
		cursor = next
		if len(events) == 0 {
			// Caught up, or an older transaction of the cluster is still
			// open (the read waits for it): read again later.
			time.Sleep(10 * time.Millisecond)
		}
	}
	// Output:
	// order.placed o-1
	// order.placed o-2
	// order.placed o-3
}

// exampleRead reads events from the start until it has n, a minute at most.
// A committed event is readable once every older transaction of the cluster
// has ended (see Read), which may take a moment.
func exampleRead(db pg.DBTX, n int) []outbox.Event {
	var out []outbox.Event
	var cursor outbox.Cursor
	for deadline := time.Now().Add(time.Minute); len(out) < n && time.Now().Before(deadline); {
		events, next, _, err := outbox.Read(context.Background(), db, outbox.ReadOptions{After: cursor})
		if err != nil {
			panic(err)
		}
		out, cursor = append(out, events...), next
		if len(events) == 0 {
			time.Sleep(10 * time.Millisecond)
		}
	}
	return out
}
