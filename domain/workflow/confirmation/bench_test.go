package confirmation_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/bettercompute/bettercompute/domain/workflow"
	"github.com/bettercompute/bettercompute/domain/workflow/confirmation"
	"github.com/bettercompute/bettercompute/platform/pg"
)

// BenchmarkConfirm measures what a confirmation costs over the signal it
// delivers: signal is workflow.SignalTx in a transaction of its own (the
// peer: what an application's own web handler would do), confirm is
// confirmation.Confirm of a fresh link (the hash lookup, the row's update and
// the same signal, in one transaction). Each op targets a workflow of its
// own, made before the timer runs.
//
//	go test -run '^$' -bench BenchmarkConfirm -benchtime 2000x ./domain/workflow/confirmation/
func BenchmarkConfirm(b *testing.B) {
	ctx := context.Background()
	db := setup(b)
	n := 0
	prepare := func(count int) ([]string, []confirmation.Token) {
		ids := make([]string, count)
		toks := make([]confirmation.Token, count)
		err := pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
			for i := range ids {
				n++
				id, err := refund.StartTx(ctx, tx, "r", &workflow.StartOpts{ID: fmt.Sprintf("bench-%d", n)})
				if err != nil {
					return err
				}
				ids[i] = id
				if toks[i], _, err = confirmation.CreateTx(ctx, tx, id, "approved", nil); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
		return ids, toks
	}
	b.Run("signal", func(b *testing.B) {
		ids, _ := prepare(b.N)
		b.ResetTimer()
		for i := range b.N {
			err := pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
				_, err := workflow.SignalTx(ctx, tx, ids[i], "approved", nil, nil)
				return err
			})
			if err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("confirm", func(b *testing.B) {
		_, toks := prepare(b.N)
		b.ResetTimer()
		for i := range b.N {
			if _, err := confirmation.Confirm(ctx, db, string(toks[i])); err != nil {
				b.Fatal(err)
			}
		}
	})
}
