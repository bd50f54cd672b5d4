package main

// Row is one line of the report: a benchmark's figure of ours, the peer it ran
// beside, their ratio and its target. Units are the units the benchmark passes
// to b.ReportMetric ("ns/op" for the time per iteration).
type Row struct {
	// Bench is a regexp on the benchmark's name without "Benchmark" and without
	// the -GOMAXPROCS suffix, matched whole ("Throughput", "Reserve/devices=20").
	// Without a "/" it also matches the benchmark's sub-benchmarks, one line of
	// the report each.
	Bench string
	// Pkg, if set, is the benchmark's package: its import path or the end of it
	// after a "/" ("workers", "domain/outbox").
	Pkg string
	// What says what is measured, and what the ratio divides.
	What string
	// Ours is the unit of our figure.
	Ours string
	// Peer says what ran beside it; PeerUnit, if set, is the unit of the peer's
	// figure, reported by the same benchmark, or by PeerBench (a name like
	// Bench's, literal, in the same package) when the peer is a benchmark of its
	// own.
	Peer, PeerUnit, PeerBench string
	// Ratio is the unit of the ratio the benchmark reports; when it is empty
	// or missing from the output, the ratio is Ours ÷ PeerUnit.
	Ratio string
	// Target is ">= x", "<= x", "> x" or "< x" on the ratio, or on our figure
	// when the row has no ratio; empty for none.
	Target string
}

// rows is the report, in order. One line a row: when a benchmark renames a
// metric, change its unit here (a missing metric shows as "—").
var rows = []Row{
	{Bench: "Throughput", Pkg: "workers", What: "end to end: 8 writers' DirtyTx and the reconciles, ÷ `pgbench -N`", Ours: "e2e_dirty+reconcile/s", Peer: "`pgbench -N -c 16`", PeerUnit: "pgbench_N_tps", Ratio: "e2e/pgbench", Target: ">= 0.5"},
	{Bench: "Throughput", Pkg: "workers", What: "end to end, batched (32 keys per commit), ÷ raw River doing the same write with `InsertTx` (64 workers, 100 ms polling both)", Ours: "e2e_dirty+reconcile/s", Peer: "raw River, `InsertTx` per transaction", PeerUnit: "raw_river_e2e_jobs/s", Ratio: "e2e/raw_e2e", Target: ">= 2"},
	{Bench: "Throughput", Pkg: "workers", What: "end to end, unbatched (`Batch: 1`), ÷ the same raw River", Ours: "e2e_unbatched_dirty+reconcile/s", Peer: "raw River, `InsertTx` per transaction", PeerUnit: "raw_river_e2e_jobs/s", Ratio: "e2e_unbatched/raw_e2e"},
	{Bench: "Throughput", Pkg: "workers", What: "fenced reconciles drained with 16 sessions, ÷ `pgbench -N`", Ours: "fenced_reconciles/s", Peer: "`pgbench -N -c 16`", PeerUnit: "pgbench_N_tps", Ratio: "fenced/pgbench"},
	{Bench: "Throughput", Pkg: "workers", What: "fenced reconciles drained, batched, ÷ raw River draining the same write (`InsertMany`, 16 workers, 100 ms polling both)", Ours: "fenced_reconciles/s", Peer: "raw River", PeerUnit: "raw_river_jobs/s", Ratio: "fenced/raw"},
	{Bench: "Throughput", Pkg: "workers", What: "fenced reconciles drained, unbatched (`Batch: 1`), ÷ the same raw River", Ours: "fenced_unbatched_reconciles/s", Peer: "raw River", PeerUnit: "raw_river_jobs/s", Ratio: "fenced_unbatched/raw"},
	{Bench: "Throughput", Pkg: "workers", What: "worker RSS under that load (MB)", Ours: "rss_load_MB"},
	{Bench: "Pickup", Pkg: "workers", What: "pickup latency p50, insert → `Work`, 120 jobs/s behind PgBouncer, ÷ River's", Ours: "ours_p50_ms", Peer: "raw River", PeerUnit: "river_p50_ms", Ratio: "ours/river_p50"},
	{Bench: "Pickup", Pkg: "workers", What: "pickup latency p99, ÷ River's", Ours: "ours_p99_ms", Peer: "raw River", PeerUnit: "river_p99_ms", Ratio: "ours/river_p99"},
	{Bench: "PickupPostgresRestart", Pkg: "workers", What: "pickup p99 in the 5 s after a PostgreSQL restart, ÷ before it", Ours: "after5s_p99_ms", Peer: "before the restart", PeerUnit: "before_p99_ms"},
	{Bench: "PickupThroughKills/standby", Pkg: "workers", What: "pickup p99, insert → fetch, 50 jobs/s, through `kill -9` of the shard holder every 8 s: a standby of another identity takes over, a fresh standby starts under a new one; ÷ River's, two River processes, one killed and replaced the same way", Ours: "ours_p99_ms", Peer: "raw River, killed the same way", PeerUnit: "river_p99_ms", Ratio: "ours/river_p99"},
	{Bench: "PickupThroughKills/replacement", Pkg: "workers", What: "pickup p99 through `kill -9` of the only worker every 8 s, its replacement started at once under a new identity; ÷ River's, its one process killed and replaced the same way", Ours: "ours_p99_ms", Peer: "raw River, killed the same way", PeerUnit: "river_p99_ms", Ratio: "ours/river_p99"},
	{Bench: "PickupThroughKills", Pkg: "workers", What: "takeover after `kill -9` by a new identity (the kill → all 16 shard leases held by the new owner; the lease TTL is 15 s), p50 (ms)", Ours: "takeover_p50_ms"},
	{Bench: "PickupThroughKills", Pkg: "workers", What: "takeover after `kill -9` by a new identity, the worst of the run (ms)", Ours: "takeover_max_ms", Target: "<= 3000"},
	{Bench: "PickupThroughKills", Pkg: "workers", What: "most jobs available but not fetched at once through the kills, ÷ River's", Ours: "ours_backlog_max", Peer: "raw River, killed the same way", PeerUnit: "river_backlog_max"},
	{Bench: "DirtyVsInsertTx/Dirty", Pkg: "workers", What: "`DirtyTx` in a caller's transaction, ÷ River's `InsertTx`", Ours: "ns/op", Peer: "River `InsertTx`", PeerUnit: "ns/op", PeerBench: "DirtyVsInsertTx/InsertTx", Ratio: "dirty/inserttx"},
	{Bench: "DirtyVsInsertTx/InsertForKeyTx", Pkg: "workers", What: "`InsertForKeyTx`, ÷ River's `InsertTx`", Ours: "ns/op", Peer: "River `InsertTx`", PeerUnit: "ns/op", PeerBench: "DirtyVsInsertTx/InsertTx", Ratio: "forkey/inserttx"},
	{Bench: "GrowthClaim", Pkg: "workers", What: "claim of 32 due keys with 1,000,000 waiting in the shard (µs), ÷ with 1,000", Ours: "µs/claim_1000000_due", Peer: "1,000 waiting", PeerUnit: "µs/claim_1000_due", Ratio: "claim_1M/1k", Target: "<= 1.5"},
	{Bench: "GrowthRiverFetch", Pkg: "workers", What: "River's fetch beside 1,000,000 completed jobs (µs), ÷ beside none", Ours: "µs/fetch_1000000_completed", Peer: "no completed jobs", PeerUnit: "µs/fetch_0_completed", Ratio: "fetch_1M/empty", Target: "<= 1.5"},
	{Bench: "GrowthShards", Pkg: "workers", What: "worker RSS under load with 256 shards (MB), ÷ with 16", Ours: "rss_load_MB_256", Peer: "16 shards", PeerUnit: "rss_load_MB_16"},
	{Bench: "GrowthShards", Pkg: "workers", What: "TPS an idle worker costs with 256 shards, ÷ with 16", Ours: "idle_tps_256", Peer: "16 shards", PeerUnit: "idle_tps_16", Target: "<= 2"},
	{Bench: "TenantFairness", Pkg: "workers", What: "tenant B's pickup p99 (its enqueue's commit → its work, 40/s) beside tenant A's backlog of 100,000 at A's limit (`jobs`: fenced jobs; `reconciles`; `workflows`: workflow steps), ÷ B's p99 alone", Ours: "busy_p99_ms", Peer: "B alone", PeerUnit: "idle_p99_ms", Ratio: "busy/idle_p99", Target: "<= 2"},
	{Bench: "TenantFairness", Pkg: "workers", What: "tenant B's pickup p50 beside A's backlog, ÷ B's p50 alone", Ours: "busy_p50_ms", Peer: "B alone", PeerUnit: "idle_p50_ms", Ratio: "busy/idle_p50"},
	{Bench: "TenantOverhead/(jobs|reconciles)", Pkg: "workers", What: "work of no tenant drained (`jobs`: fenced jobs, fetched by `compute_fetch_jobs`; `reconciles`: batches taking keys by `compute_take_fair`), ÷ the same through the statement before tenancy (River's own fetch; `compute_take_dirty`)", Ours: "units/s", Peer: "the statement before tenancy", PeerUnit: "old_units/s", Ratio: "ours/old", Target: ">= 0.95"},
	{Bench: "TenantOverhead/(jobs|reconciles)", Pkg: "workers", What: "CPU per unit of work of no tenant (ms, the process + the server's backends), ÷ through the statement before tenancy", Ours: "cpu_ms/unit", Peer: "the statement before tenancy", PeerUnit: "old_cpu_ms/unit", Ratio: "cpu/old_cpu", Target: "<= 1.05"},
	{Bench: "TenantOverhead/statements", Pkg: "workers", What: "a shard queue's fetch of 8 jobs of no tenant, 100,000 available (µs), ÷ River's own fetch statement", Ours: "fetch_µs", Peer: "River's fetch", PeerUnit: "river_fetch_µs", Ratio: "fetch/river_fetch", Target: "<= 1.05"},
	{Bench: "TenantOverhead/statements", Pkg: "workers", What: "a batch's take of 32 keys of no tenant, 100,000 waiting (µs), ÷ `compute_take_dirty`", Ours: "take_µs", Peer: "`compute_take_dirty`", PeerUnit: "take_dirty_µs", Ratio: "take/take_dirty", Target: "<= 1.05"},
	{Bench: "Append", Pkg: "domain/outbox", What: "event log: a transaction with one `AppendTx`, ÷ the same without it", Ours: "append-µs/tx", Peer: "the transaction without it", PeerUnit: "peer-µs/tx", Ratio: "ratio", Target: "<= 1.2"},
	{Bench: "Append", Pkg: "domain/outbox", What: "event log: the floor of any one more statement (an empty `SELECT 1`), ÷ the transaction without it", Ours: "floor-ratio"},
	{Bench: "Claim", Pkg: "domain/outbox", What: "dispatcher: one claim with 1,000,000 pending rows, ÷ with 1,000", Ours: "claim-1M-µs", Peer: "1,000 pending rows", PeerUnit: "claim-1k-µs", Ratio: "ratio", Target: "<= 1.5"},
	{Bench: "SinkThroughput", Pkg: "workers/outboxworker", What: "event log: events/s to a no-op sink, ÷ a bare read loop", Ours: "delivered-events/s", Peer: "a bare read loop", PeerUnit: "peer-read-events/s", Ratio: "ratio"},
	{Bench: "CommitToDelivery", Pkg: "workers/outboxworker", What: "event log: commit to delivery p50 (ms) at 1,000 events/s", Ours: "p50-ms", Target: "<= 250"},
	{Bench: "CommitToDelivery", Pkg: "workers/outboxworker", What: "event log: commit to delivery p99 (ms)", Ours: "p99-ms", Target: "<= 1000"},
	{Bench: "CommitToDelivery", Pkg: "workers/outboxworker", What: "event log: commit to delivery p50, ÷ a bare 50 ms poll loop on the same log beside it", Ours: "p50-ms", Peer: "a bare poll loop", PeerUnit: "peer-p50-ms", Ratio: "p50-ratio"},
	{Bench: "CommitToDelivery", Pkg: "workers/outboxworker", What: "event log: commit to delivery p99, ÷ the bare poll loop's", Ours: "p99-ms", Peer: "a bare poll loop", PeerUnit: "peer-p99-ms", Ratio: "p99-ratio"},
	{Bench: "Dispatcher", Pkg: "workers/outboxworker", What: "dispatcher: rows/s, no-op publish, 1,000 keys, ÷ a `SELECT … FOR UPDATE SKIP LOCKED` + `DELETE` loop", Ours: "rows/s", Peer: "a `SKIP LOCKED` + `DELETE` loop", PeerUnit: "peer-rows/s", Ratio: "ratio"},
	{Bench: "Reserve", Pkg: "domain/capacity", What: "reservations/s, 32 clients, ÷ `pgbench -N`", Ours: "reservations/s", Peer: "`pgbench -N -c 32`", PeerUnit: "pgbench_tps", Ratio: "reservations_per_pgbench_tx", Target: ">= 0.3"},
	{Bench: "Vote", Pkg: "domain/quorum", What: "quorum votes/s, 32 voters, ÷ `pgbench -N`", Ours: "votes/s", Peer: "`pgbench -N -c 32`", PeerUnit: "pgbench_tps", Ratio: "votes_per_pgbench_tx"},
	{Bench: "WorkflowSteps", Pkg: "workers/workflowworker", What: "workflow steps/s, ÷ the same steps hand-chained as River jobs", Ours: "wf_steps/s", Peer: "hand-chained River jobs", PeerUnit: "handchained_steps/s", Ratio: "wf/handchained"},
	{Bench: "WorkflowSteps", Pkg: "workers/workflowworker", What: "workflow steps/s (3-step workflows), ÷ `pgbench -N`", Ours: "wf_steps/s", Peer: "`pgbench -N`", PeerUnit: "pgbench_N_tps", Ratio: "wf/pgbench", Target: ">= 0.3"},
	{Bench: "WorkflowSteps", Pkg: "workers/workflowworker", What: "workflow CPU per step (ms), ÷ hand-chained", Ours: "wf_cpu_ms/step", Peer: "hand-chained River jobs", PeerUnit: "handchained_cpu_ms/step"},
	{Bench: "WorkflowLatency", Pkg: "workers/workflowworker", What: "workflow start to finish p99 (ms), 3 steps, 100 workflows/s", Ours: "p99_ms"},
	{Bench: "WorkflowSignalLatency", Pkg: "workers/workflowworker", What: "workflow signal to resume p99 (ms)", Ours: "resume_p99_ms", Target: "<= 100"},
	{Bench: "WorkflowVsDBOS/throughput", Pkg: "workers/workflowworker", What: "workflows/s of 3 transactional steps, 16 callers starting them as fast as they can, ÷ DBOS Transact Go running the same workflow in process on the same server", Ours: "wf/s", Peer: "DBOS Transact Go", PeerUnit: "dbos_wf/s", Ratio: "wf/dbos", Target: ">= 1.0"},
	{Bench: "WorkflowVsDBOS", Pkg: "workers/workflowworker", What: "CPU per workflow (ms, the process + the server's backends), ours ÷ DBOS's", Ours: "cpu_ms/wf", Peer: "DBOS Transact Go", PeerUnit: "dbos_cpu_ms/wf", Ratio: "cpu/dbos_cpu", Target: "<= 1.0"},
	{Bench: "WorkflowVsDBOS/latency(_queue)?", Pkg: "workers/workflowworker", What: "workflow start to its last step committed p50 (ms), 100 workflows/s, ÷ DBOS's (in process; `_queue`: through a DBOS queue polled every 100 ms)", Ours: "p50_ms", Peer: "DBOS Transact Go", PeerUnit: "dbos_p50_ms"},
	{Bench: "WorkflowVsDBOS/latency(_queue)?", Pkg: "workers/workflowworker", What: "workflow start to its last step committed p50 (ms), ours", Ours: "p50_ms", Target: "<= 30"},
	{Bench: "WorkflowVsDBOS/latency(_queue)?", Pkg: "workers/workflowworker", What: "workflow start to its last step committed p99 (ms), ÷ DBOS's", Ours: "p99_ms", Peer: "DBOS Transact Go", PeerUnit: "dbos_p99_ms"},
	{Bench: "WorkflowVsDBOS/latency(_queue)?", Pkg: "workers/workflowworker", What: "workflow start to its last step committed p99 (ms), ours", Ours: "p99_ms", Target: "<= 150"},
	{Bench: "WorkflowVsDBOS", Pkg: "workers/workflowworker", What: "gap between a workflow's consecutive steps' commits p50 (ms), ÷ DBOS's", Ours: "step_gap_p50_ms", Peer: "DBOS Transact Go", PeerUnit: "dbos_step_gap_p50_ms"},
	{Bench: "WorkflowVsDBOS", Pkg: "workers/workflowworker", What: "gap between a workflow's consecutive steps' commits p50 (ms), ours", Ours: "step_gap_p50_ms", Target: "<= 5"},
	{Bench: "BackfillMillion", Pkg: "workers/backfillworker", What: "backfill of 1,000,000 rows, ÷ one `UPDATE` of all rows", Ours: "backfill_rows/s", Peer: "one `UPDATE`", PeerUnit: "update_rows/s", Ratio: "backfill/update", Target: ">= 0.5"},
	{Bench: "BackfillMillion", Pkg: "workers/backfillworker", What: "the batches' own `UPDATE`s alone (rows/s), ÷ one `UPDATE` of all rows: the ceiling of any backfill with this batch function", Ours: "batch_sql_rows/s", Peer: "one `UPDATE`", PeerUnit: "update_rows/s"},
	{Bench: "BackfillMillion", Pkg: "workers/backfillworker", What: "a one-row write's p50 (ms) during the backfill, ÷ on the idle table", Ours: "write_p50_backfill_ms", Peer: "the idle table", PeerUnit: "write_p50_idle_ms", Ratio: "write_p50_backfill/idle"},
	{Bench: "BackfillMillion", Pkg: "workers/backfillworker", What: "the batch size the sizing by time chose (median rows)", Ours: "batch_size_p50"},
	{Bench: "BackfillMillion", Pkg: "workers/backfillworker", What: "a one-row write's p99 (ms) during the backfill, ÷ on the idle table", Ours: "write_p99_backfill_ms", Peer: "the idle table", PeerUnit: "write_p99_idle_ms", Ratio: "write_p99_backfill/idle", Target: "<= 2"},
	{Bench: "Tx", Pkg: "platform/pg", What: "the transaction helper, ÷ a raw pgx transaction", Ours: "helper-ns/tx", Peer: "raw pgx", PeerUnit: "raw-ns/tx", Ratio: "helper/raw"},
	{Bench: "Migrate/fresh", Pkg: "platform/migrate", What: "`migrate` on a fresh database", Ours: "ns/op"},
	{Bench: "Migrate/current", Pkg: "platform/migrate", What: "`migrate` on an up-to-date database", Ours: "ns/op"},
	{Bench: "Start/cold", Pkg: "platform/embedded", What: "embedded cluster start, cold (initdb)", Ours: "ns/op"},
	{Bench: "Start/warm", Pkg: "platform/embedded", What: "embedded cluster start, warm", Ours: "ns/op"},
}
