package pgtest

import (
	"context"
	"net/url"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/bettercompute/bettercompute/platform/pg"
)

// NewOwned returns a pool on a fresh, empty database owned by a fresh LOGIN role
// that is not a superuser: NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION
// NOBYPASSRLS, member of no role (so not of pg_read_all_stats either). This is
// how a production deployment usually runs: as the database's owner. The pool
// and URL connect as that role, which has the database's name and a random
// password (the embedded cluster trusts local logins and ignores it; a server
// at TEST_DATABASE_URL that checks passwords needs it, and its role needs
// CREATEROLE as well as CREATEDB).
//
// Only MaxConns and StatementTimeout of opts are used: the database is always
// empty, so that the test runs migrate as the owner itself.
//
//	db := pgtest.NewOwned(t)
//	r := clitest.Run(t, ctx, app, []string{"BETTER_COMPUTE_DATABASE_URL=" + db.URL}, "migrate")
//
// At cleanup the pool is closed, and if the test passed the database (first,
// WITH (FORCE)) and the role are dropped; a failed test keeps both and logs
// their name.
func NewOwned(tb testing.TB, opts ...Options) *DB {
	tb.Helper()
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	admin := AdminURL(tb)
	ctx := context.Background()

	name := "bct_" + sanitize(tb.Name()) + "_" + randHex(4)
	password := randHex(16)
	ident := pgx.Identifier{name}.Sanitize()
	// The password is random hex: a literal needs no escaping.
	if err := adminExec(ctx, admin, "CREATE ROLE "+ident+
		" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS PASSWORD '"+password+"'"); err != nil {
		tb.Fatalf("pgtest: cannot create role %s: %v", name, err)
	}
	if err := adminExec(ctx, admin, "CREATE DATABASE "+ident+" OWNER "+ident); err != nil {
		_ = adminExec(ctx, admin, "DROP ROLE IF EXISTS "+ident)
		tb.Fatalf("pgtest: cannot create database %s: %v", name, err)
	}
	u := WithUser(WithDatabase(admin, name), name, password)
	pool, err := pg.Open(ctx, pg.Options{URL: u, MaxConns: o.MaxConns, StatementTimeout: o.StatementTimeout, StatementCache: StatementCache()})
	if err != nil {
		_ = adminExec(ctx, admin, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)")
		_ = adminExec(ctx, admin, "DROP ROLE IF EXISTS "+ident)
		tb.Fatalf("pgtest: cannot open %s as its owner: %v", name, err)
	}
	tb.Cleanup(func() {
		pool.Close()
		if tb.Failed() {
			tb.Logf("pgtest: kept database %s and its owner, role %s, for inspection (%s)", name, name, pg.RedactURL(u))
			return
		}
		ctx := context.Background()
		if err := adminExec(ctx, admin, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)"); err != nil {
			tb.Logf("pgtest: cannot drop database %s: %v", name, err)
			return
		}
		if err := adminExec(ctx, admin, "DROP ROLE IF EXISTS "+ident); err != nil {
			tb.Logf("pgtest: cannot drop role %s: %v", name, err)
		}
	})
	return &DB{Pool: pool, Name: name, URL: u}
}

// WithUser returns u connecting as user with password ("" for none).
func WithUser(u, user, password string) string {
	parsed, err := url.Parse(u)
	if err != nil || parsed.Scheme == "" {
		s := u + " user=" + user
		if password != "" {
			s += " password=" + password
		}
		return s
	}
	if password != "" {
		parsed.User = url.UserPassword(user, password)
	} else {
		parsed.User = url.User(user)
	}
	return parsed.String()
}
