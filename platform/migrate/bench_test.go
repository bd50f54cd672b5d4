package migrate_test

import (
	"context"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/platform/migrate"
	"github.com/bettercompute/bettercompute/platform/pgtest"
)

// BenchmarkMigrate applies the built-in set (core, River, the built-in modules)
// to a fresh empty database, and to a database that is already up to date (what
// every worker, serve and dev start pays). Each iteration is what the migrate
// command does: EnsureExtensions, then Apply. It reports each one's time and
// their ratio.
func BenchmarkMigrate(b *testing.B) {
	ctx := context.Background()
	set, err := migrate.Builtin()
	if err != nil {
		b.Fatal(err)
	}
	apply := func(db *pgtest.DB) (*migrate.Result, error) {
		if err := migrate.EnsureExtensions(ctx, db.Pool); err != nil {
			return nil, err
		}
		return set.Apply(ctx, db.Pool, nil)
	}
	var fresh, current time.Duration

	b.Run("fresh", func(b *testing.B) {
		var total time.Duration
		for range b.N {
			b.StopTimer()
			db := pgtest.New(b, pgtest.Options{Empty: true, MaxConns: 2})
			b.StartTimer()
			t0 := time.Now()
			res, err := apply(db)
			total += time.Since(t0)
			if err != nil {
				b.Fatal(err)
			}
			if len(res.Applied) != len(set.Migrations()) {
				b.Fatalf("applied %d of %d", len(res.Applied), len(set.Migrations()))
			}
		}
		fresh = total / time.Duration(b.N)
		b.ReportMetric(float64(len(set.Migrations())), "migrations")
	})

	b.Run("current", func(b *testing.B) {
		db := pgtest.New(b, pgtest.Options{Empty: true, MaxConns: 2})
		if _, err := apply(db); err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		t0 := time.Now()
		for range b.N {
			res, err := apply(db)
			if err != nil {
				b.Fatal(err)
			}
			if len(res.Applied) != 0 {
				b.Fatalf("applied %d on an up-to-date database", len(res.Applied))
			}
		}
		current = time.Since(t0) / time.Duration(b.N)
		if fresh > 0 {
			b.ReportMetric(float64(fresh)/float64(current), "fresh/current")
		}
	})
}
