package lease_test

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers/internal/lease"
)

// syncBuffer is a log sink the keeper's goroutine writes while the test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestKeeperLogsClockSkewAtRenewal: the keeper re-samples the clock at every
// round and logs CLOCK_SKEW (at error level) when the database's clock and this
// process's are more than 1 s apart; it keeps its leases, since fencing and
// expiry are measured on the database's clock. A schema ahead on the pool's
// search path stands in for a server whose clock jumps: its compute_now() is the
// real one plus an offset the test moves, and its mode reads as system.
func TestKeeperLogsClockSkewAtRenewal(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	skewed, setOffset := db.SkewedClock(t, 0)
	pool, err := pg.Open(ctx, pg.Options{URL: skewed, MaxConns: 4})
	require.NoError(t, err)
	defer pool.Close()

	var logs syncBuffer
	k := lease.NewKeeper(lease.KeeperOptions{DB: pool, Owner: "k", TTL: 9 * time.Second, Renew: time.Second,
		Log: zerolog.New(&logs).Level(zerolog.InfoLevel)})
	k.Want("shard/0")
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	stopped := make(chan struct{})
	go func() { k.Run(runCtx); close(stopped) }()
	defer func() { cancel(); <-stopped }()
	require.Eventually(t, func() bool { _, ok := k.Held("shard/0"); return ok }, 30*time.Second, 10*time.Millisecond)
	skewRecords := func() []string {
		var out []string
		for _, l := range strings.Split(logs.String(), "\n") {
			if strings.Contains(l, "CLOCK_SKEW") {
				out = append(out, l)
			}
		}
		return out
	}
	require.Empty(t, skewRecords(), "no skew logged while the clocks agree")

	setOffset(3 * time.Second)
	require.Eventually(t, func() bool { return len(skewRecords()) > 0 }, 30*time.Second, 10*time.Millisecond,
		"a renewal after the database's clock jumped 3 s logs CLOCK_SKEW")
	rec := skewRecords()[0]
	require.Contains(t, rec, `"level":"error"`)
	_, held := k.Held("shard/0")
	require.True(t, held, "the keeper keeps its lease: expiry is measured on the database's clock")
	n := len(skewRecords())
	require.Eventually(t, func() bool { return len(skewRecords()) > n }, 30*time.Second, 10*time.Millisecond,
		"every renewal while the clocks disagree logs it again")
}
