package embedded_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/platform/embedded"
)

// BenchmarkStart measures the embedded cluster's start until it accepts
// connections and has its database: cold (initdb, then start, on an empty
// directory) and warm (start on an existing directory, what every dev run after
// the first pays). Stopping is not timed. It reports cold/warm.
func BenchmarkStart(b *testing.B) {
	ctx := context.Background()
	root, err := os.MkdirTemp("", "bc-embedded-bench-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(root)
	if err := os.Chmod(root, 0o755); err != nil {
		b.Fatal(err)
	}
	start := func(b *testing.B, dir string) {
		c, err := embedded.Start(ctx, embedded.Options{Dir: dir, Fast: true})
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := c.Stop(); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	var cold, warm time.Duration

	b.Run("cold", func(b *testing.B) {
		for i := range b.N {
			start(b, filepath.Join(root, "cold-"+strconv.Itoa(i)))
		}
		cold = b.Elapsed() / time.Duration(b.N)
	})

	b.Run("warm", func(b *testing.B) {
		dir := filepath.Join(root, "warm")
		c, err := embedded.Start(ctx, embedded.Options{Dir: dir, Fast: true})
		if err != nil {
			b.Fatal(err)
		}
		if err := c.Stop(); err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		for range b.N {
			start(b, dir)
		}
		warm = b.Elapsed() / time.Duration(b.N)
		if cold > 0 {
			b.ReportMetric(float64(cold)/float64(warm), "cold/warm")
		}
	})
}
