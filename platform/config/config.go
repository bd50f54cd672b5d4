// Package config is Better Compute's one configuration struct, read from the
// environment (prefix BETTER_COMPUTE_) with caarlos0/env and overridden by
// command-line flags of the same names (DATABASE_URL is --database-url).
//
// Validate returns INVALID_CONFIG naming the variable at fault. Help lists every
// variable of the struct with its default, taken from Defaults (defaults.go), so
// the list cannot go stale and every default is written once.
package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/caarlos0/env/v11"

	"github.com/bettercompute/bettercompute/platform/fault"
)

// Prefix is the environment prefix of every variable.
const Prefix = "BETTER_COMPUTE_"

// Config is every setting of the binary. The env tag is the variable's name
// after the prefix; help is its one-line description. Defaults are in
// defaults.go, not in tags.
type Config struct {
	DatabaseURL      string        `env:"DATABASE_URL" help:"PostgreSQL URL (postgres://…), or embedded:DIR / embedded:memory for a private cluster"`
	DBMaxConns       int           `env:"DB_MAX_CONNS" help:"maximum connections in this process's pool"`
	StatementTimeout time.Duration `env:"STATEMENT_TIMEOUT" help:"statement timeout, SET LOCAL in every transaction"`
	DBCancelRequests bool          `env:"DB_CANCEL_REQUESTS" help:"a cancelled statement sends a PostgreSQL cancel request instead of closing its connection (direct connections only: PgBouncer 1.18 can crash on cancel requests)"`
	DBStatementCache bool          `env:"DB_STATEMENT_CACHE" help:"each connection prepares a statement once and reuses it, instead of parsing and planning it at every execution (direct connections only: PgBouncer in transaction mode cannot keep prepared statements)"`
	LogLevel         string        `env:"LOG_LEVEL" help:"trace, debug, info, warn or error"`
	LogFormat        string        `env:"LOG_FORMAT" help:"json or console (default: console when stderr is a terminal, else json)"`
	PGBin            string        `env:"PG_BIN" help:"directory of initdb and postgres for embedded: URLs (default: PATH, then /usr/lib/postgresql/*/bin)"`

	ShardCount         int           `env:"SHARD_COUNT" help:"number of shards, fixed when the database is first migrated"`
	Shards             string        `env:"SHARDS" help:"worker: shards to serve: all, a range 0-7, a list 1,3,5, or a mix 0-3,8"`
	WorkerID           string        `env:"WORKER_ID" help:"worker: this worker's stable identity; a restart with the same identity takes its shards back at once (default: HOST/SLOT, the lowest slot on this host no running worker holds)"`
	MetricsListen      string        `env:"METRICS_LISTEN" help:"worker: address for /metrics and /healthz (default: off)"`
	LeaseTTL           time.Duration `env:"LEASE_TTL" help:"shard and sink lease lifetime"`
	LeaseRenew         time.Duration `env:"LEASE_RENEW" help:"lease renewal interval (less than a third of LEASE_TTL)"`
	Heartbeat          time.Duration `env:"HEARTBEAT" help:"worker: how often a worker records that it is alive"`
	MissedBeats        int           `env:"MISSED_BEATS" help:"worker: heartbeats a worker may miss before any standby takes its shards (HEARTBEAT × MISSED_BEATS; the lease TTL bounds it)"`
	StopGrace          time.Duration `env:"STOP_GRACE" help:"on SIGTERM, how long in-flight jobs may finish before they are cancelled and handed back"`
	ResyncEvery        time.Duration `env:"RESYNC_INTERVAL" help:"how often every reconciler re-enqueues all it owns"`
	WorkersPerShard    int           `env:"WORKERS_PER_SHARD" help:"concurrent jobs per shard queue"`
	MaintenanceWorkers int           `env:"MAINTENANCE_WORKERS" help:"worker: concurrent jobs of the better_compute queue (sink deliveries, dispatcher passes, resync, retention)"`
	PollInterval       time.Duration `env:"POLL_INTERVAL" help:"how often River polls a queue for new jobs (River runs poll-only)"`

	Listen       string `env:"LISTEN" help:"serve: address to listen on (loopback unless credentials are set)"`
	AuthUser     string `env:"AUTH_USER" help:"serve: basic-auth user for River UI, the API and the event stream"`
	AuthPassword string `env:"AUTH_PASSWORD" help:"serve: basic-auth password" secret:"true"`
	ReadOnly     bool   `env:"READ_ONLY" help:"serve: refuse every state-changing request to River UI"`

	PublicListen         string `env:"PUBLIC_LISTEN" help:"serve: address of the public listener, which serves the confirmation links and nothing else, to anyone (default: off; dev: 127.0.0.1:8081)"`
	PublicURL            string `env:"PUBLIC_URL" help:"the public listener's URL as people reach it (https://confirm.example.com/), the base of confirmation links (default: http://PUBLIC_LISTEN/)"`
	PublicClientIPHeader string `env:"PUBLIC_CLIENT_IP_HEADER" help:"serve: the header your reverse proxy sets to the client's address (X-Forwarded-For: its last entry), which the public listener rate-limits guesses by (default: the connection's address)"`
}

// workerIDRe is lease.ValidIdentity's pattern (config does not import domain).
var workerIDRe = regexp.MustCompile(`^[A-Za-z0-9._:@/-]{1,200}$`)

// headerRe is an HTTP header's name.
var headerRe = regexp.MustCompile(`^[A-Za-z0-9-]{1,64}$`)

// Load reads the environment into a Config with defaults applied. environ is a
// list of KEY=VALUE (os.Environ()).
func Load(environ []string) (*Config, error) {
	m := map[string]string{}
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	// Start from the defaults: caarlos0/env leaves a field alone when its
	// variable is unset or empty.
	c := Defaults()
	if err := env.ParseWithOptions(c, env.Options{Prefix: Prefix, Environment: m}); err != nil {
		// Name the variable, not the Go field that caarlos0/env reports.
		var pe env.ParseError
		if errors.As(err, &pe) {
			if f, ok := reflect.TypeOf(Config{}).FieldByName(pe.Name); ok && f.Tag.Get("env") != "" {
				return nil, fault.Wrap(fault.InvalidConfig, pe.Err, "%s%s: not a valid %s", Prefix, f.Tag.Get("env"), pe.Type)
			}
		}
		return nil, fault.Wrap(fault.InvalidConfig, err, "cannot read the configuration from the environment")
	}
	return c, nil
}

// Validate checks every field and returns INVALID_CONFIG naming the first bad one.
func (c *Config) Validate() error {
	bad := func(field, format string, args ...any) error {
		return fault.New(fault.InvalidConfig, "%s%s: %s", Prefix, field, fmt.Sprintf(format, args...))
	}
	switch {
	case c.DatabaseURL == "":
		return bad("DATABASE_URL", "not set (a postgres:// URL, or embedded:DIR for development)")
	case c.DBMaxConns < 1 || c.DBMaxConns > 10000:
		return bad("DB_MAX_CONNS", "%d is out of range (1 to 10000)", c.DBMaxConns)
	case c.StatementTimeout < 0:
		return bad("STATEMENT_TIMEOUT", "%s is negative", c.StatementTimeout)
	case c.ShardCount < 1 || c.ShardCount > 4096:
		return bad("SHARD_COUNT", "%d is out of range (1 to 4096)", c.ShardCount)
	case c.LeaseTTL < 100*time.Millisecond:
		return bad("LEASE_TTL", "%s is too short (at least 100ms)", c.LeaseTTL)
	case c.LeaseRenew <= 0 || c.LeaseRenew*3 > c.LeaseTTL:
		return bad("LEASE_RENEW", "%s must be positive and at most a third of LEASE_TTL (%s)", c.LeaseRenew, c.LeaseTTL)
	case c.Heartbeat < 10*time.Millisecond || c.Heartbeat > time.Minute:
		return bad("HEARTBEAT", "%s is out of range (10ms to 1m)", c.Heartbeat)
	case c.MissedBeats < 2 || c.MissedBeats > 1000:
		return bad("MISSED_BEATS", "%d is out of range (2 to 1000): one late beat is no sign of death", c.MissedBeats)
	case c.StopGrace < 0:
		return bad("STOP_GRACE", "%s is negative", c.StopGrace)
	case c.ResyncEvery < time.Second:
		return bad("RESYNC_INTERVAL", "%s is too short (at least 1s)", c.ResyncEvery)
	case c.WorkersPerShard < 1 || c.WorkersPerShard > 10000:
		return bad("WORKERS_PER_SHARD", "%d is out of range (1 to 10000)", c.WorkersPerShard)
	case c.MaintenanceWorkers < 1 || c.MaintenanceWorkers > 10000:
		return bad("MAINTENANCE_WORKERS", "%d is out of range (1 to 10000)", c.MaintenanceWorkers)
	case c.WorkerID != "" && !workerIDRe.MatchString(c.WorkerID):
		return bad("WORKER_ID", "%q: want 1 to 200 letters, digits and . _ : @ / -", c.WorkerID)
	case c.PollInterval < time.Millisecond:
		return bad("POLL_INTERVAL", "%s is too short (at least 1ms)", c.PollInterval)
	case c.AuthPassword != "" && c.AuthUser == "" || c.AuthUser != "" && c.AuthPassword == "":
		return bad("AUTH_USER", "AUTH_USER and AUTH_PASSWORD go together")
	}
	switch c.LogLevel {
	case "trace", "debug", "info", "warn", "error":
	default:
		return bad("LOG_LEVEL", "%q is not one of trace, debug, info, warn, error", c.LogLevel)
	}
	switch c.LogFormat {
	case "", "json", "console":
	default:
		return bad("LOG_FORMAT", "%q is not json or console", c.LogFormat)
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return bad("LISTEN", "%q is not host:port", c.Listen)
	}
	if c.PublicListen != "" {
		if _, _, err := net.SplitHostPort(c.PublicListen); err != nil {
			return bad("PUBLIC_LISTEN", "%q is not host:port", c.PublicListen)
		}
	}
	if c.PublicURL != "" {
		u, err := url.Parse(c.PublicURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
			return bad("PUBLIC_URL", "%q is not an http:// or https:// URL without query or fragment", c.PublicURL)
		}
	}
	if h := c.PublicClientIPHeader; h != "" && !headerRe.MatchString(h) {
		return bad("PUBLIC_CLIENT_IP_HEADER", "%q is not a header name", c.PublicClientIPHeader)
	}
	return nil
}

// Field describes one variable, for help and flags.
type Field struct {
	Env     string // BETTER_COMPUTE_…
	Flag    string // --…
	Default string
	Help    string
	Secret  bool
	value   reflect.Value
}

// Fields lists every variable of c in declaration order. Default is the
// variable's value in Defaults ("" for none), whatever c holds.
func (c *Config) Fields() []Field {
	v := reflect.ValueOf(c).Elem()
	defaults := reflect.ValueOf(Defaults()).Elem()
	t := v.Type()
	out := make([]Field, 0, t.NumField())
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		key := f.Tag.Get("env")
		if key == "" {
			continue
		}
		out = append(out, Field{
			Env:     Prefix + key,
			Flag:    strings.ReplaceAll(strings.ToLower(key), "_", "-"),
			Default: formatDefault(defaults.Field(i)),
			Help:    f.Tag.Get("help"),
			Secret:  f.Tag.Get("secret") == "true",
			value:   v.Field(i),
		})
	}
	return out
}

// RegisterFlags adds a flag for every variable to fs; a flag given on the command
// line overrides the environment. Call after Load, before fs.Parse.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	for _, f := range c.Fields() {
		fs.Var(fieldValue{f.value}, f.Flag, f.Help+" (env "+f.Env+")")
	}
}

// PrintHelp writes every variable with its flag and default.
func (c *Config) PrintHelp(w io.Writer) {
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "  VARIABLE\tFLAG\tDEFAULT\tMEANING")
	for _, f := range c.Fields() {
		def := f.Default
		if def == "" {
			def = "-"
		}
		fmt.Fprintf(tw, "  %s\t--%s\t%s\t%s\n", f.Env, f.Flag, def, f.Help)
	}
	_ = tw.Flush()
}

// formatDefault writes a default the way a user would set it: 10m rather than
// time.Duration's 10m0s.
func formatDefault(v reflect.Value) string {
	d, ok := v.Interface().(time.Duration)
	if !ok {
		return fmt.Sprint(v.Interface())
	}
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

type fieldValue struct{ v reflect.Value }

func (f fieldValue) String() string {
	if !f.v.IsValid() {
		return ""
	}
	return fmt.Sprint(f.v.Interface())
}

func (f fieldValue) IsBoolFlag() bool { return f.v.IsValid() && f.v.Kind() == reflect.Bool }

func (f fieldValue) Set(s string) error {
	switch f.v.Interface().(type) {
	case time.Duration:
		d, err := time.ParseDuration(s)
		if err != nil {
			return err
		}
		f.v.SetInt(int64(d))
	case string:
		f.v.SetString(s)
	case int:
		n, err := strconv.Atoi(s)
		if err != nil {
			return err
		}
		f.v.SetInt(int64(n))
	case bool:
		b, err := strconv.ParseBool(s)
		if err != nil {
			return err
		}
		f.v.SetBool(b)
	default:
		return fmt.Errorf("unsupported type %s", f.v.Type())
	}
	return nil
}
