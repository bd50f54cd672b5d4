// Command riverapp is a plain River worker process, the peer of the example
// application's worker in workers.BenchmarkPickupThroughKills: one River
// client, one queue, a trivial worker, no shards and no leases. It runs as a
// process of its own so the benchmark can kill -9 it, as it kills ours.
//
//	riverapp migrate   River's migrations, and the table the worker writes
//	riverapp work      work the queue until SIGTERM or SIGINT
//
// Settings, from the environment:
//
//	RIVERAPP_DATABASE_URL  the database (required)
//	RIVERAPP_ID            the River client's id, which River records in a job's
//	                       attempted_by (default: River's own, host and time)
//	RIVERAPP_QUEUE         the queue worked (default kill_river)
//	RIVERAPP_POLL          the fetch poll interval (default 50ms); the client is
//	                       poll-only, with a fetch cooldown of min(poll, 5ms), as
//	                       the Better Compute worker runtime configures its own
//	RIVERAPP_WORKERS       concurrent jobs (default 8)
//
// The worker's job, of kind kill_river, inserts one row into kill_river_runs
// (job id, task id, pid) and returns: River then completes it (its completer,
// asynchronously, as River does). A job whose row is written but whose
// completion was not when the process died stays running until River's
// rescuer (RescueStuckJobsAfter, an hour by default) retries it, and then runs
// twice: River is at least once.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// Args are a kill_river job's arguments.
type Args struct {
	ID string `json:"id"`
}

// Kind is the job's River kind.
func (Args) Kind() string { return "kill_river" }

type worker struct {
	river.WorkerDefaults[Args]
	pool *pgxpool.Pool
	pid  string
}

func (w *worker) Work(ctx context.Context, job *river.Job[Args]) error {
	_, err := w.pool.Exec(ctx, `INSERT INTO kill_river_runs (task_id, job_id, worker) VALUES ($1, $2, $3)`,
		job.Args.ID, job.ID, w.pid)
	return err
}

const runsDDL = `CREATE TABLE IF NOT EXISTS kill_river_runs (
    id      bigserial PRIMARY KEY,
    task_id text NOT NULL,
    job_id  bigint NOT NULL,
    worker  text NOT NULL,
    ran_at  timestamptz NOT NULL DEFAULT clock_timestamp()
)`

func main() {
	if len(os.Args) != 2 || (os.Args[1] != "migrate" && os.Args[1] != "work") {
		fmt.Fprintln(os.Stderr, "usage: riverapp migrate|work (settings from RIVERAPP_* variables)")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	var err error
	if os.Args[1] == "migrate" {
		err = migrate(ctx)
	} else {
		err = work(ctx)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "riverapp:", err)
		os.Exit(1)
	}
}

func open(ctx context.Context) (*pgxpool.Pool, error) {
	url := os.Getenv("RIVERAPP_DATABASE_URL")
	if url == "" {
		return nil, fmt.Errorf("RIVERAPP_DATABASE_URL is not set")
	}
	return pgxpool.New(ctx, url)
}

func migrate(ctx context.Context) error {
	pool, err := open(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	m, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		return err
	}
	if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return err
	}
	_, err = pool.Exec(ctx, runsDDL)
	return err
}

func work(ctx context.Context) error {
	poll, err := envDuration("RIVERAPP_POLL", 50*time.Millisecond)
	if err != nil {
		return err
	}
	n := 8
	if v := os.Getenv("RIVERAPP_WORKERS"); v != "" {
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			return fmt.Errorf("RIVERAPP_WORKERS=%q: want a positive number", v)
		}
	}
	queue := os.Getenv("RIVERAPP_QUEUE")
	if queue == "" {
		queue = "kill_river"
	}
	pool, err := open(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	ws := river.NewWorkers()
	river.AddWorker(ws, &worker{pool: pool, pid: strconv.Itoa(os.Getpid())})
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		ID:                os.Getenv("RIVERAPP_ID"),
		Queues:            map[string]river.QueueConfig{queue: {MaxWorkers: n}},
		Workers:           ws,
		PollOnly:          true,
		FetchPollInterval: poll,
		FetchCooldown:     min(poll, 5*time.Millisecond),
		Logger:            slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		return err
	}
	if err := client.Start(ctx); err != nil {
		return err
	}
	fmt.Printf("riverapp started: id %s, queue %s, poll %s, %d workers\n", client.ID(), queue, poll, n)
	<-ctx.Done()
	stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return client.Stop(stopCtx)
}

func envDuration(name string, def time.Duration) (time.Duration, error) {
	v := os.Getenv(name)
	if v == "" {
		return def, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("%s=%q: want a duration", name, v)
	}
	return d, nil
}
