// Package pg is Better Compute's PostgreSQL access: one pgx pool per process that
// is safe behind PgBouncer in transaction mode, a transaction helper that every
// part uses, and the translation of driver errors into fault codes.
//
// # PgBouncer rules
//
// The pool keeps no session state, so any server connection can serve any
// transaction:
//
//   - no startup parameters beyond what the URL names;
//   - the statement timeout is SET LOCAL inside each transaction, sent with BEGIN
//     in one round trip, so it never outlives the transaction;
//   - only unnamed statements by default (pgx QueryExecModeExec; the pgx
//     default and DescribeExec fail through PgBouncer 1.18 in transaction
//     mode), so every statement is parsed and planned at every execution.
//     Options.StatementCache keeps prepared statements on a direct
//     connection instead (see "Statement cache" below);
//   - no LISTEN/NOTIFY and no session-level advisory locks (migrators use
//     pg_advisory_xact_lock, leases are rows).
//
// # Broken connections
//
// An idle connection that errors (a restarted server, pg_terminate_backend) is
// dropped: pgxpool pings a connection idle for more than a second before handing
// it out, and InTx retries a BEGIN that failed on a dead connection with a fresh
// one, since nothing has happened yet. A broken connection never crashes the
// process; at worst the statement in flight returns UNAVAILABLE.
//
// # Cancellation
//
// A cancelled context (SIGINT in the CLI, a job whose lease was lost) closes the
// connection by default; it never sends a PostgreSQL cancel request, because a
// pooler may not survive one (PgBouncer 1.18, what Debian 12 ships, can crash
// with "disconnect_client(): bad client state" on cancel requests in
// transaction mode), and whether a URL points at a pooler cannot be known. Every
// transaction sets client_connection_check_interval (SET LOCAL), so the server
// notices the closed connection within a second even in the middle of a long
// statement or a lock wait, rolls the transaction back and releases its locks.
// The cost is a reconnect for the next checkout. Options.CancelRequests turns
// cancel requests back on for a direct connection: the statement is cancelled
// at once and the connection stays usable.
//
// # Statement cache
//
// Options.StatementCache (BETTER_COMPUTE_DB_STATEMENT_CACHE) switches a pool
// on a direct connection to pgx QueryExecModeCacheStatement: each connection
// prepares a statement (a named server-side prepared statement) the first
// time it runs it and reuses it after, keeping up to statementCacheCapacity
// of them, so a statement is parsed once per connection, and planned once
// when the server settles on a generic plan. Behind PgBouncer in transaction
// mode it must stay off: a prepared statement belongs to one server
// connection, and the next transaction may get another.
//
// In that mode the server, not the Go value, decides each parameter's type
// when the statement is prepared: a statement must give an ambiguous parameter
// a cast ($1::text), and pass a Go value that encodes as the type the server
// inferred (an int64 compared with a text expression does not). The tests run
// in both modes (TEST_DB_STATEMENT_CACHE=1, see platform/pgtest).
package pg

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/bettercompute/bettercompute/platform/config"
	"github.com/bettercompute/bettercompute/platform/fault"
)

// DBTX is what domain functions take: both *Pool and pgx.Tx satisfy it. Domain
// code never begins or commits on its own; it runs in the caller's transaction,
// or opens a savepoint with InTx when given one.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Begin(ctx context.Context) (pgx.Tx, error)
}

// cancelGrace is how long a cancelled statement has to end on the server before
// its connection is dropped, when cancel requests are on.
const cancelGrace = 2 * time.Second

// statementCacheCapacity is how many prepared statements each connection
// keeps with Options.StatementCache (pgx's default): more than the project
// has, so none is evicted and prepared again.
const statementCacheCapacity = 512

// clientCheckInterval is how often a server backend checks, while it runs a
// statement, that its client is still connected (client_connection_check_interval).
const clientCheckInterval = time.Second

// Options configure Open.
type Options struct {
	URL              string        // a postgres:// URL or key=value string
	MaxConns         int32         // default 20
	StatementTimeout time.Duration // default 15 s; 0 keeps the default, negative disables
	// ApplicationName is reported in pg_stat_activity. It is sent with each BEGIN
	// (SET LOCAL), never as a startup parameter.
	ApplicationName string
	// CancelRequests makes a cancelled context send a PostgreSQL cancel request
	// for the running statement (keeping the connection) instead of closing the
	// connection. Only for a direct connection: some poolers crash on cancel
	// requests (see the package doc).
	CancelRequests bool
	// StatementCache makes each connection prepare a statement the first time
	// it runs it and reuse it after (pgx QueryExecModeCacheStatement), instead
	// of sending it unnamed, parsed and planned at every execution. Only for a
	// direct connection: PgBouncer in transaction mode must keep the default
	// (see the package doc).
	StatementCache bool
}

// Pool is a pgxpool.Pool whose Begin sets the statement timeout. River and
// anything else that needs the raw pool use the embedded *pgxpool.Pool.
type Pool struct {
	*pgxpool.Pool
	beginSQL string // BEGIN plus SET LOCAL, sent as one simple-protocol message
	timeout  time.Duration
	app      string // application_name, SET LOCAL in each transaction
	check    time.Duration
}

// Open connects a pool. It returns INVALID_CONFIG for a URL that does not parse
// and UNAVAILABLE when the server cannot be reached or refuses the login; no
// error ever contains the password.
func Open(ctx context.Context, o Options) (*Pool, error) {
	cfg, err := pgxpool.ParseConfig(o.URL)
	if err != nil {
		return nil, fault.New(fault.InvalidConfig, "BETTER_COMPUTE_DATABASE_URL does not parse: %s", Redact(err.Error(), o.URL))
	}
	if o.MaxConns <= 0 {
		o.MaxConns = 20
	}
	cfg.MaxConns = o.MaxConns
	cfg.MinConns = 0
	cfg.MaxConnIdleTime = 5 * time.Minute
	cfg.HealthCheckPeriod = 30 * time.Second
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	cfg.ConnConfig.StatementCacheCapacity = 0
	cfg.ConnConfig.DescriptionCacheCapacity = 0
	if o.StatementCache {
		// Prepared statements, named, one cache per connection; the
		// description cache serves only QueryExecModeCacheDescribe, which
		// no statement asks for.
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheStatement
		cfg.ConnConfig.StatementCacheCapacity = statementCacheCapacity
	}
	cfg.AfterConnect = registerJSON
	// AfterCommit's hooks: run at a COMMIT, dropped at a ROLLBACK, at the
	// next BEGIN of a connection whose transaction ended otherwise, or with
	// the connection.
	commits := newCommitTracer()
	cfg.ConnConfig.Tracer = commits
	cfg.BeforeClose = func(c *pgx.Conn) { commits.take(c) }
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = 10 * time.Second
	}
	// A cancelled context interrupts the operation (pgx's default handler: a
	// deadline on the socket), and pgx then closes the connection, first sending
	// a cancel request to the connection's RemoteAddr. noCancels turns that
	// cancel request into closing the socket at once, so none is sent and the
	// server notices the closed connection within clientCheckInterval (see
	// beginSQL). With CancelRequests the statement is cancelled on the server
	// instead, and the connection kept.
	check := clientCheckInterval
	if o.CancelRequests {
		cfg.ConnConfig.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
			return &pgconn.CancelRequestContextWatcherHandler{Conn: c, DeadlineDelay: cancelGrace}
		}
		check = 0
	} else {
		cfg.ConnConfig.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
			return &pgconn.DeadlineContextWatcherHandler{Conn: c.Conn()}
		}
		cfg.ConnConfig.DialFunc = (&noCancels{dial: cfg.ConnConfig.DialFunc}).DialContext
	}

	p := &Pool{timeout: o.StatementTimeout, app: o.ApplicationName, check: check}
	if p.timeout == 0 {
		p.timeout = config.DefaultStatementTimeout
	}
	p.beginSQL = beginSQL("", false, p.timeout, check, o.ApplicationName)

	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fault.New(fault.InvalidConfig, "cannot configure the pool: %s", Redact(err.Error(), o.URL))
	}
	p.Pool = pool
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		if st := SQLState(err); st != "" {
			return nil, Translate(redactErr(fmt.Errorf("cannot connect: %w", err), o.URL))
		}
		return nil, Translate(redactErr(fmt.Errorf("cannot reach the database: %w", err), o.URL))
	}
	return p, nil
}

// registerJSON makes JSON values encode as JSON in every statement of the pool,
// whatever the column: pgx in QueryExecModeExec (the pool's default mode, which
// a transaction-mode pooler needs) has no statement description to learn a
// parameter's type from, so it picks the type from the Go value. pgx already
// maps json.RawMessage (the payloads of events, quorum items) to json; this adds
// map[string]any as jsonb (marshalled with encoding/json), so both go into json
// and jsonb columns as they are. (With StatementCache the prepared statement's
// parameter types decide, and its json and jsonb codecs take both values too.) A plain []byte stays bytea: pass JSON as
// json.RawMessage or string.
func registerJSON(_ context.Context, c *pgx.Conn) error {
	c.TypeMap().RegisterDefaultPgType(map[string]any(nil), "jsonb")
	return nil
}

// noCancels dials server connections whose cancel requests are never sent.
// pgx sends one when it closes a connection after an interrupted operation,
// dialing the connection's RemoteAddr; a noCancelConn's RemoteAddr names the
// connection itself on a network of its own, and dialing it closes that
// connection instead. (pgx would otherwise wait up to 15 s for the server to
// finish the statement before it closes the socket: a server busy in a long
// statement or a lock wait reads nothing until then.)
type noCancels struct {
	dial  pgconn.DialFunc
	next  atomic.Uint64
	conns sync.Map // noCancelAddr -> *noCancelConn
}

// DialContext is the pool's DialFunc.
func (n *noCancels) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	if network == noCancelNetwork {
		if c, ok := n.conns.Load(noCancelAddr(addr)); ok {
			_ = c.(*noCancelConn).Close()
		}
		return nil, errNoCancel
	}
	c, err := n.dial(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	nc := &noCancelConn{Conn: c, addr: noCancelAddr(fmt.Sprintf("conn-%d", n.next.Add(1))), owner: n}
	n.conns.Store(nc.addr, nc)
	return nc, nil
}

// noCancelNetwork is the network of a noCancelConn's RemoteAddr.
const noCancelNetwork = "bettercompute-no-cancel-requests"

var errNoCancel = errors.New("cancel requests are off (BETTER_COMPUTE_DB_CANCEL_REQUESTS): the connection was closed instead")

// noCancelConn is a server connection dialed by noCancels.
type noCancelConn struct {
	net.Conn
	addr  noCancelAddr
	owner *noCancels
}

func (c *noCancelConn) RemoteAddr() net.Addr { return c.addr }

func (c *noCancelConn) Close() error {
	c.owner.conns.Delete(c.addr)
	return c.Conn.Close()
}

type noCancelAddr string

func (noCancelAddr) Network() string  { return noCancelNetwork }
func (a noCancelAddr) String() string { return string(a) }

// redacted is an error whose text has the password removed, keeping the cause
// in the chain so that SQLState and Translate still read it.
type redacted struct {
	msg string
	err error
}

func (r *redacted) Error() string { return r.msg }
func (r *redacted) Unwrap() error { return r.err }

func redactErr(err error, connURL string) error {
	return &redacted{msg: Redact(err.Error(), connURL), err: err}
}

// Sibling returns a new pool of at most maxConns connections to the same
// database with p's settings (statement timeout, application name, cancel
// handling, statement cache). It connects lazily, and the caller closes it. A
// worker's control loops (lease renewals, the identity heartbeat, clock
// samples) use one of their own, so that jobs holding every connection of the
// work pool never delay a renewal past its lease.
func (p *Pool) Sibling(maxConns int32) (*Pool, error) {
	cfg := p.Pool.Config() // a copy
	cfg.MaxConns = max(maxConns, 1)
	cfg.MinConns = 0
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return nil, fault.Wrap(fault.InvalidConfig, err, "cannot configure a pool")
	}
	return &Pool{Pool: pool, beginSQL: p.beginSQL, timeout: p.timeout, app: p.app, check: p.check}, nil
}

// StatementTimeout is the timeout every transaction of this pool sets.
func (p *Pool) StatementTimeout() time.Duration { return p.timeout }

// Begin starts a read committed transaction with the pool's statement timeout,
// in one round trip. It retries on a fresh connection when the pooled one turns
// out to be dead. So pgx.BeginFunc(ctx, pool, fn), for code written against
// pgx alone, gets the same transactions as InTx (and pgx reports a COMMIT the
// server turned into a ROLLBACK as pgx.ErrTxCommitRollback).
func (p *Pool) Begin(ctx context.Context) (pgx.Tx, error) {
	return p.begin(ctx, p.beginSQL)
}

// beginWith begins a top-level transaction with opts (nil for the defaults).
// InTx finds it through the txBeginner interface, so a type that embeds *Pool
// (a test database, an application's wrapper) gets the same transactions.
func (p *Pool) beginWith(ctx context.Context, opts *TxOptions) (pgx.Tx, error) {
	sql := p.beginSQL
	if opts != nil && (opts.Isolation != "" || opts.ReadOnly) {
		sql = beginSQL(opts.Isolation, opts.ReadOnly, p.timeout, p.check, p.app)
	}
	return p.begin(ctx, sql)
}

// txBeginner is *Pool, or any type that embeds it.
type txBeginner interface {
	beginWith(ctx context.Context, opts *TxOptions) (pgx.Tx, error)
}

func (p *Pool) begin(ctx context.Context, sql string) (pgx.Tx, error) {
	var err error
	// Every pooled connection may be dead after a server restart; each failed
	// attempt destroys one, so MaxConns+1 attempts always reach a fresh one.
	for attempt := 0; attempt <= int(p.Config().MaxConns); attempt++ {
		var tx pgx.Tx
		tx, err = p.Pool.BeginTx(ctx, pgx.TxOptions{BeginQuery: sql})
		if err == nil {
			return tx, nil
		}
		if ctx.Err() != nil || !isBrokenConn(err) {
			break
		}
	}
	return nil, Translate(fmt.Errorf("error beginning transaction: %w", err))
}

// Disconnected reports whether err says the connection failed, not the
// statement: it was lost (the server restarted or ended the session, a socket
// closed) or could not be made. A transaction that failed so may be retried as a
// whole; a statement timeout is not such an error.
func Disconnected(err error) bool {
	if err == nil {
		return false
	}
	return isBrokenConn(err) || strings.Contains(err.Error(), "failed to connect") ||
		strings.Contains(err.Error(), "connection refused")
}

// isBrokenConn reports whether err says the connection, not the statement, failed:
// nothing reached the server, or the server ended the session.
func isBrokenConn(err error) bool {
	if pgconn.SafeToRetry(err) {
		return true
	}
	switch SQLState(err) {
	case "57P01", "57P02", "57P03", "08000", "08003", "08006":
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return false
	}
	// A closed socket surfaces as a plain network error (EOF, reset).
	return errors.Is(err, pgx.ErrTxClosed) || strings.Contains(err.Error(), "conn closed") ||
		strings.Contains(err.Error(), "unexpected EOF") || strings.Contains(err.Error(), "broken pipe") ||
		strings.Contains(err.Error(), "connection reset")
}

// Isolation levels for TxOptions.
const (
	ReadCommitted  = pgx.ReadCommitted
	RepeatableRead = pgx.RepeatableRead
	Serializable   = pgx.Serializable
)

// TxOptions choose the isolation level and access mode of a top-level
// transaction. They are ignored for a nested transaction (a savepoint).
type TxOptions struct {
	Isolation pgx.TxIsoLevel // default read committed
	ReadOnly  bool
}

// InTx runs fn in a transaction and commits it when fn returns nil: a read
// committed transaction with the statement timeout, or, given a pgx.Tx, a
// savepoint in it (so a failure inside rolls back only fn's work). It is
// InTxWith with the default options.
//
// The naming rule, River's: a function that takes the caller's pgx.Tx ends in
// Tx (workers.DirtyTx, outbox.AppendTx); InTx opens the transaction itself and
// hands it to fn, as workers.InTx does for a job's fenced transaction. Both
// callbacks have the one shape func(ctx, tx) error.
func InTx(ctx context.Context, db DBTX, fn func(ctx context.Context, tx pgx.Tx) error) error {
	return InTxWith(ctx, db, TxOptions{}, fn)
}

// InTxWith is InTx with an isolation level or a read-only transaction.
//
// Given a *Pool (or a type that embeds one) it begins a transaction as opts say
// (read committed by default, with the statement timeout). Given a pgx.Tx it
// opens a savepoint and ignores opts; rolling the savepoint back also releases
// it, so a failure leaves the transaction at the depth it had (see
// beginSavepoint). It rolls back when fn returns an error or panics (and
// re-panics). A COMMIT that the server turned into a ROLLBACK, because a
// statement failed and fn swallowed the error, returns INTERNAL_ERROR, never
// success.
func InTxWith(ctx context.Context, db DBTX, opts TxOptions, fn func(ctx context.Context, tx pgx.Tx) error) (err error) {
	var tx pgx.Tx
	switch d := db.(type) {
	case txBeginner:
		tx, err = d.beginWith(ctx, &opts)
	case pgx.Tx:
		tx, err = beginSavepoint(ctx, d)
	default:
		tx, err = db.Begin(ctx)
		if err != nil {
			err = Translate(fmt.Errorf("error beginning transaction: %w", err))
		}
	}
	if err != nil {
		return err
	}

	defer func() {
		if p := recover(); p != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
			panic(p)
		}
	}()

	if err := fn(ctx, tx); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		if errors.Is(err, pgx.ErrTxCommitRollback) {
			return fault.Wrap(fault.Internal, err, "the transaction was rolled back by the server at COMMIT (a statement in it failed)")
		}
		return Translate(fmt.Errorf("error committing transaction: %w", err))
	}
	return nil
}

// beginSavepoint opens a savepoint in tx and returns it as a pgx.Tx: its Commit
// releases the savepoint, its Rollback rolls back to it and releases it, and
// its Begin opens a savepoint inside it.
//
// pgx's own nested transaction (tx.Begin) rolls back with ROLLBACK TO SAVEPOINT
// alone, which keeps the savepoint open on the server: every statement after a
// rolled-back attempt then runs one subtransaction deeper, and a chain of
// failures in one transaction piles the levels up (each a subtransaction the
// server tracks until the end, and past 64 of them a suboverflowed snapshot
// for every other session). A rolled-back savepoint of ours leaves none behind.
func beginSavepoint(ctx context.Context, tx pgx.Tx) (pgx.Tx, error) {
	depth := 1
	if p, ok := tx.(*savepoint); ok {
		depth = p.depth + 1
	}
	s := &savepoint{Tx: tx, name: "bc_savepoint_" + strconv.Itoa(depth), depth: depth}
	if _, err := tx.Exec(ctx, "SAVEPOINT "+s.name); err != nil {
		return nil, Translate(fmt.Errorf("error opening a savepoint: %w", err))
	}
	return s, nil
}

// savepoint is a savepoint of the enclosing transaction Tx, which serves
// every statement. Savepoints of one transaction are named by depth: only
// one is open at each depth.
type savepoint struct {
	pgx.Tx
	name   string
	depth  int
	closed bool
}

func (s *savepoint) Begin(ctx context.Context) (pgx.Tx, error) {
	if s.closed {
		return nil, pgx.ErrTxClosed
	}
	return beginSavepoint(ctx, s)
}

func (s *savepoint) Commit(ctx context.Context) error {
	if s.closed {
		return pgx.ErrTxClosed
	}
	s.closed = true
	_, err := s.Tx.Exec(ctx, "RELEASE SAVEPOINT "+s.name)
	return err
}

func (s *savepoint) Rollback(ctx context.Context) error {
	if s.closed {
		return pgx.ErrTxClosed
	}
	s.closed = true
	_, err := s.Tx.Exec(ctx, "ROLLBACK TO SAVEPOINT "+s.name+"; RELEASE SAVEPOINT "+s.name)
	return err
}

func beginSQL(iso pgx.TxIsoLevel, readOnly bool, timeout, check time.Duration, app string) string {
	var b strings.Builder
	b.WriteString("BEGIN")
	if iso != "" {
		b.WriteString(" ISOLATION LEVEL ")
		b.WriteString(string(iso))
	}
	if readOnly {
		b.WriteString(" READ ONLY")
	}
	if timeout > 0 {
		// The same bound on a transaction left idle: a paused process (SIGSTOP, a
		// long GC) must not hold its locks, and so a lease takeover, for ever.
		fmt.Fprintf(&b, "; SET LOCAL statement_timeout = %d; SET LOCAL idle_in_transaction_session_timeout = %d",
			timeout.Milliseconds(), timeout.Milliseconds())
	}
	if check > 0 {
		// A closed connection (a cancelled context) ends the statement in flight.
		fmt.Fprintf(&b, "; SET LOCAL client_connection_check_interval = %d", check.Milliseconds())
	}
	if app != "" {
		fmt.Fprintf(&b, "; SET LOCAL application_name = %s", quoteLiteral(app))
	}
	return b.String()
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// SQLState returns the SQLSTATE of the PostgreSQL error in err's chain, or "".
// Common ones: 23P01 exclusion violation, 23505 unique violation, 40001
// serialization failure, 40P01 deadlock, 57014 statement timeout.
func SQLState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// Translate gives a driver error a fault code, keeping it as the cause:
// pgx.ErrNoRows is NOT_FOUND; exclusion, unique, serialization and deadlock
// failures, and a deleted tenant's new work (BC010), are CONFLICT; invalid_parameter_value (22023, raised by our SQL
// for bad input) is INVALID_ARGUMENT; a dead connection or an unreachable server is
// UNAVAILABLE; a refused login, a missing database or a missing table (not
// migrated) is INVALID_CONFIG. An error that already carries a code, or nil,
// is returned as is.
func Translate(err error) error {
	if err == nil {
		return nil
	}
	var fe *fault.Error
	if errors.As(err, &fe) {
		return err
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return &fault.Error{Code: fault.NotFound, Err: err}
	}
	switch st := SQLState(err); {
	case st == "23P01" || st == "23505" || st == "40001" || st == "40P01" || st == "BC010":
		// (BC010: a deleted tenant's new work, migrations/tenancy.)
		return &fault.Error{Code: fault.Conflict, Err: err}
	case st == "22023":
		// invalid_parameter_value: raised by our SQL for bad input (a fenced job
		// kind inserted outside the shard queues).
		return &fault.Error{Code: fault.InvalidArgument, Err: err}
	case st == "57014":
		return &fault.Error{Code: fault.Unavailable, Message: "statement timeout", Err: err}
	case st == "28P01" || st == "28000":
		// Wrong credentials are the deployment's configuration, not an outage.
		return &fault.Error{Code: fault.InvalidConfig, Message: "the database refused the login (check the user and password of BETTER_COMPUTE_DATABASE_URL)", Err: err}
	case st == "42P01":
		// A table this build needs is missing: the database is not migrated.
		return &fault.Error{Code: fault.InvalidConfig, Message: "a table is missing: run better-compute migrate", Err: err}
	case st == "3D000":
		return &fault.Error{Code: fault.InvalidConfig, Message: "the database does not exist", Err: err}
	case strings.HasPrefix(st, "08") || strings.HasPrefix(st, "57P") || st == "53300":
		return &fault.Error{Code: fault.Unavailable, Err: err}
	case st != "":
		return &fault.Error{Code: fault.Internal, Err: err}
	}
	if isBrokenConn(err) || pgconn.Timeout(err) || strings.Contains(err.Error(), "failed to connect") ||
		strings.Contains(err.Error(), "cannot reach") {
		return &fault.Error{Code: fault.Unavailable, Err: err}
	}
	return err
}

// Redact removes the password of connURL (and any password= value) from s.
func Redact(s, connURL string) string {
	if u, err := url.Parse(connURL); err == nil && u.User != nil {
		if pw, ok := u.User.Password(); ok && pw != "" {
			s = strings.ReplaceAll(s, pw, "xxxxx")
			if esc := url.QueryEscape(pw); esc != pw {
				s = strings.ReplaceAll(s, esc, "xxxxx")
			}
			if esc := url.PathEscape(pw); esc != pw {
				s = strings.ReplaceAll(s, esc, "xxxxx")
			}
		}
	}
	if i := strings.Index(connURL, "password="); i >= 0 {
		pw := connURL[i+len("password="):]
		if j := strings.IndexAny(pw, " &"); j >= 0 {
			pw = pw[:j]
		}
		pw = strings.Trim(pw, "'")
		if pw != "" {
			s = strings.ReplaceAll(s, pw, "xxxxx")
		}
	}
	return s
}

// Secrets are the forms in which the password of connString (a URL or
// key=value pairs, as pgx reads it, PGPASSWORD included) can appear in an
// error or a log line: as it is, and URL-escaped. None when it has no password.
func Secrets(connString string) []string {
	cfg, err := pgconn.ParseConfig(connString)
	if err != nil || cfg.Password == "" {
		return nil
	}
	pw := cfg.Password
	out := []string{pw}
	for _, esc := range []string{url.QueryEscape(pw), url.PathEscape(pw)} {
		if !slices.Contains(out, esc) {
			out = append(out, esc)
		}
	}
	return out
}

// RedactURL returns connURL with its password replaced by xxxxx, for display.
func RedactURL(connURL string) string {
	if u, err := url.Parse(connURL); err == nil && u.User != nil {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
			return u.String()
		}
		return connURL
	}
	return Redact(connURL, connURL)
}
