package outboxworker

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/domain/outbox"
	"github.com/bettercompute/bettercompute/domain/outbox/outboxtest"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

// A test that needs a real process boundary (kill -9, SIGSTOP) re-executes this
// test binary with childEnv set: TestMain then runs that child instead of the
// tests, against the database named by childDBEnv.
const (
	childEnv   = "OUTBOX_TEST_CHILD"
	childDBEnv = "OUTBOX_TEST_CHILD_DB"
	// childTTLEnv, if set, is the child's lease TTL (a time.Duration).
	childTTLEnv = "OUTBOX_TEST_CHILD_TTL"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		os.Exit(runChild(mode, os.Getenv(childDBEnv)))
	}
	pgtest.Main(m)
}

// childFast are the worker intervals of children (and of workertest).
var childFast = workers.Options{
	LeaseTTL: workertest.Fast.LeaseTTL, LeaseRenew: workertest.Fast.LeaseRenew,
	StopGrace: workertest.Fast.StopGrace, PollInterval: workertest.Fast.PollInterval,
}

// runChild is a worker process that stops at the point a test names:
//
//	sink-die   delivers sink "s" (recording into received), prints HANDLED after
//	           the handler returned and blocks before the cursor moves (the
//	           parent kills it with SIGKILL)
//	sink-pause the same, then waits for a line on stdin, tries to move the
//	           cursor and prints ADVANCE <code> (the parent SIGSTOPs it meanwhile)
//	dispatch-die runs a pass of dispatcher "stock" over inventory.stock_reports,
//	           recording into published, prints PUBLISHED before the batch ends
//	           and blocks (the parent kills it with SIGKILL)
func runChild(mode, url string) int {
	ctx := context.Background()
	db, err := pg.Open(ctx, pg.Options{URL: url, MaxConns: 8})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	log := zerolog.New(os.Stderr).Level(zerolog.WarnLevel)
	say := func(s string) { fmt.Println(s); _ = os.Stdout.Sync() }
	block := func() { select {} }
	switch mode {
	case "sink-die", "sink-pause":
		reg := workers.NewRegistry()
		if err := Register(reg, &Options{PollEvery: 20 * time.Millisecond}); err != nil {
			panic(err)
		}
		if err := AddSink(reg, Sink{Name: "s", Handle: recordReceived(db, "child")}); err != nil {
			panic(err)
		}
		st, _ := stateOf(reg)
		st.afterHandle = func(string, []Event) {
			say("HANDLED")
			if mode == "sink-die" {
				block()
			}
			_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
		}
		st.afterAdvance = func(_ string, err error) {
			code := "OK"
			if err != nil {
				code = string(fault.CodeOf(err))
			}
			say("ADVANCE " + code)
		}
		o := childFast
		if ttl, err := time.ParseDuration(os.Getenv(childTTLEnv)); err == nil {
			o.LeaseTTL = ttl
		}
		o.Pool, o.Registry, o.Work, o.Log = db, reg, true, log
		if _, err := workers.Start(ctx, o); err != nil {
			panic(err)
		}
		block()
	case "dispatch-die":
		d, err := NewDispatcher(DispatcherOptions[report]{
			Name: "stock", Table: "inventory.stock_reports", OrderBy: "item_id", Sequence: "seq",
			ClaimTimeout: 2 * time.Second, Log: log,
			Publish: func(ctx context.Context, r report) error {
				_, err := db.Exec(ctx, `INSERT INTO published (seq, by) VALUES ($1, 'child')`, r.Seq)
				return err
			},
		})
		if err != nil {
			panic(err)
		}
		d.beforeFinish = func(outbox.Outcome) { say("PUBLISHED"); block() }
		_, _ = d.Reconcile(ctx, db)
	}
	return 3
}

// recordReceived is a sink handler that records each event, committed, into
// received(sink_by, event_id).
func recordReceived(db *pg.Pool, by string) func(ctx context.Context, events []Event) error {
	return func(ctx context.Context, events []Event) error {
		ids := make([]string, len(events))
		for i, e := range events {
			ids[i] = e.ID.String()
		}
		_, err := db.Exec(ctx, `INSERT INTO received (by, event_id, pos) SELECT $1, id, pos FROM unnest($2::text[]) WITH ORDINALITY AS u(id, pos)`, by, ids)
		return err
	}
}

// child is a running child process.
type child struct {
	cmd   *exec.Cmd
	lines chan string
	stdin *os.File
}

func startChild(t *testing.T, mode string, db *pgtest.DB, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+mode, childDBEnv+"="+db.URL)
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	r, w, err := os.Pipe()
	require.NoError(t, err)
	cmd.Stdin = r
	cmd.Stderr = zerolog.NewTestWriter(t)
	require.NoError(t, cmd.Start())
	r.Close()
	c := &child{cmd: cmd, lines: make(chan string, 16), stdin: w}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		w.Close()
	})
	return c
}

// expect waits for the child to print a line starting with prefix and returns it.
func (c *child) expect(t *testing.T, prefix string) string {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case l, ok := <-c.lines:
			if !ok {
				t.Fatalf("child exited before printing %s", prefix)
			}
			if strings.HasPrefix(l, prefix) {
				return l
			}
		case <-timeout:
			t.Fatalf("child did not print %s", prefix)
		}
	}
}

// kill9 kills the child with SIGKILL and waits for it.
func (c *child) kill9(t *testing.T) {
	t.Helper()
	require.NoError(t, c.cmd.Process.Signal(syscall.SIGKILL))
	_ = c.cmd.Wait()
}

// report is a row of the example table (testdata/outbox/stock_reports.sql).
type report struct {
	Seq      int64  `json:"seq"`
	ID       string `json:"id"`
	ItemID   string `json:"item_id"`
	Delta    int    `json:"delta"`
	Attempts int    `json:"attempts"`
}

// newDB is a test database with the received table (sinks) and the example
// outbox table with its published log (dispatchers).
func newDB(t testing.TB) *pgtest.DB {
	t.Helper()
	db := pgtest.New(t)
	b, err := os.ReadFile("../../testdata/outbox/stock_reports.sql")
	require.NoError(t, err)
	db.MustExec(t, string(b))
	db.MustExec(t, `CREATE TABLE received (n bigserial PRIMARY KEY, by text NOT NULL, event_id text NOT NULL, pos int NOT NULL)`)
	db.MustExec(t, `CREATE TABLE published (n bigserial PRIMARY KEY, seq bigint NOT NULL, by text NOT NULL)`)
	return db
}

// appendEvents appends n events of topic, one transaction each, and returns
// their IDs in log order once all are readable.
func appendEvents(t testing.TB, db *pg.Pool, topic string, n int) []string {
	t.Helper()
	ctx := context.Background()
	for i := 0; i < n; i++ {
		require.NoError(t, pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
			return outbox.AppendTx(ctx, tx, outbox.Message{Topic: topic, Key: fmt.Sprint(i), Payload: i})
		}))
	}
	ids := storedIDs(t, db, topic)
	// Readable only once every older transaction of the cluster ended (another
	// test's): wait for it, so a test's first delivery sees the whole batch.
	outboxtest.ReadN(t, db, outbox.Cursor{}, len(ids), topic)
	return ids
}

// storedIDs lists the IDs of topic's stored events in log order.
func storedIDs(t testing.TB, db *pg.Pool, topic string) []string {
	t.Helper()
	rows, err := db.Query(context.Background(), `SELECT txid::text || ':' || seq FROM compute_events WHERE topic = $1 ORDER BY txid, seq`, topic)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return ids
}

// receivedBy lists the event IDs sink handlers of by recorded, in order.
func receivedBy(t testing.TB, db *pg.Pool, by string) []string {
	t.Helper()
	rows, err := db.Query(context.Background(), `SELECT event_id FROM received WHERE by = $1 ORDER BY n`, by)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return ids
}

func sinkCursor(t testing.TB, db *pg.Pool, name string) string {
	t.Helper()
	p, err := outbox.SinkCursor(context.Background(), db, name)
	require.NoError(t, err)
	return p.Cursor.String()
}

// mustState is reg's outbox machinery, in a test that registered it already.
func mustState(reg *workers.Registry) *state {
	st, err := stateOf(reg)
	if err != nil {
		panic(err)
	}
	return st
}
