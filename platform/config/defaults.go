package config

import "time"

// The default of every setting that has one, defined here once: Load starts from
// them, Help prints them, and the packages that take these settings as options
// (the lease keeper, the worker runtime) fall back to them for a zero value.
const (
	// defaultDBMaxConns is the default of DB_MAX_CONNS: the most connections in
	// one process's pool.
	defaultDBMaxConns = 20
	// DefaultStatementTimeout is the default of STATEMENT_TIMEOUT, SET LOCAL in
	// every transaction.
	DefaultStatementTimeout = 15 * time.Second
	// DefaultLogLevel is the default of LOG_LEVEL.
	DefaultLogLevel = "info"
	// DefaultShardCount is the default of SHARD_COUNT: the number of shards a
	// database gets when it is first migrated.
	DefaultShardCount = 16
	// DefaultShards is the default of SHARDS: a worker serves every shard.
	DefaultShards = "all"
	// DefaultLeaseTTL is the default of LEASE_TTL: how long a shard or sink lease
	// lives without a renewal.
	DefaultLeaseTTL = 15 * time.Second
	// DefaultLeaseRenew is the default of LEASE_RENEW: how often leases are
	// renewed (a third of DefaultLeaseTTL).
	DefaultLeaseRenew = 5 * time.Second
	// DefaultHeartbeat is the default of HEARTBEAT: how often a worker records
	// that it is alive.
	DefaultHeartbeat = 500 * time.Millisecond
	// DefaultMissedBeats is the default of MISSED_BEATS: a worker silent for
	// this many heartbeats (2 s at the default interval) is taken for dead, and
	// any standby takes its shards without waiting for their leases to expire.
	DefaultMissedBeats = 4
	// DefaultStopGrace is the default of STOP_GRACE: on SIGTERM, how long
	// in-flight jobs may finish before they are cancelled and handed back.
	DefaultStopGrace = 10 * time.Second
	// DefaultResyncEvery is the default of RESYNC_INTERVAL: how often every
	// reconciler re-enqueues all it owns.
	DefaultResyncEvery = 10 * time.Minute
	// DefaultWorkersPerShard is the default of WORKERS_PER_SHARD: concurrent
	// jobs per shard queue.
	DefaultWorkersPerShard = 8
	// DefaultMaintenanceWorkers is the default of MAINTENANCE_WORKERS:
	// concurrent jobs of the maintenance queue.
	DefaultMaintenanceWorkers = 8
	// DefaultPollInterval is the default of POLL_INTERVAL: how often River polls
	// a queue for new jobs.
	DefaultPollInterval = 100 * time.Millisecond
	// DefaultListen is the default of LISTEN: serve listens on loopback only.
	DefaultListen = "127.0.0.1:8080"
)

// Defaults returns a Config holding every default and nothing else (no
// DATABASE_URL): what Load returns for an empty environment.
func Defaults() *Config {
	return &Config{
		DBMaxConns:         defaultDBMaxConns,
		StatementTimeout:   DefaultStatementTimeout,
		LogLevel:           DefaultLogLevel,
		ShardCount:         DefaultShardCount,
		Shards:             DefaultShards,
		LeaseTTL:           DefaultLeaseTTL,
		LeaseRenew:         DefaultLeaseRenew,
		Heartbeat:          DefaultHeartbeat,
		MissedBeats:        DefaultMissedBeats,
		StopGrace:          DefaultStopGrace,
		ResyncEvery:        DefaultResyncEvery,
		WorkersPerShard:    DefaultWorkersPerShard,
		MaintenanceWorkers: DefaultMaintenanceWorkers,
		PollInterval:       DefaultPollInterval,
		Listen:             DefaultListen,
	}
}
