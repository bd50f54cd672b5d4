package migrate

import (
	"context"
	"errors"
	"fmt"
	"github.com/bettercompute/bettercompute/platform/pg"
	"io/fs"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/bettercompute/bettercompute/migrations"
	"github.com/bettercompute/bettercompute/platform/fault"
)

// riverOwner is the ledger owner of River's schema.
const riverOwner = "river"

// River returns River's schema as ledger migrations river/nnnn_<name>, one River
// version each. Applying them one version per transaction also splits River's
// versions at 4, which a fresh database needs (an enum value added in 4 is used
// in 6).
func River() (Group, error) {
	m, err := rivermigrate.New(riverpgxv5.New(nil), nil)
	if err != nil {
		return Group{}, fault.Wrap(fault.Internal, err, "cannot load River's migrations")
	}
	g := Group{Owner: riverOwner}
	for _, v := range m.AllVersions() {
		version := v.Version
		slug := strings.ReplaceAll(strings.ToLower(v.Name), " ", "_")
		slug = strings.Map(func(r rune) rune {
			if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' {
				return r
			}
			return '_'
		}, slug)
		g.Migrations = append(g.Migrations, Migration{
			Owner: riverOwner, Number: version, Slug: slug, SQL: v.SQLUp,
			Apply: func(ctx context.Context, tx pgx.Tx) error {
				_, err := m.MigrateTx(ctx, tx, rivermigrate.DirectionUp, &rivermigrate.MigrateOpts{TargetVersion: version})
				return err
			},
		})
	}
	return g, nil
}

// Builtin returns the set of Better Compute's own migrations (core, River, the
// built-in modules), followed by the application's groups in the order given.
func Builtin(app ...Group) (*Set, error) {
	var groups []Group
	for i, owner := range migrations.Owners {
		if _, err := fs.Stat(migrations.FS, owner); err != nil && owner != coreOwner {
			continue // a built-in owner with no migrations yet
		}
		sub, err := fs.Sub(migrations.FS, owner)
		if err != nil {
			return nil, fault.Wrap(fault.Internal, err, "cannot read the %s migrations", owner)
		}
		ms, err := FromFS(owner, sub)
		if err != nil {
			return nil, err
		}
		for from, to := range migrations.Renamed {
			if strings.HasPrefix(from, owner+"/") {
				if ms, err = Rename(ms, from, to); err != nil {
					return nil, err
				}
			}
		}
		groups = append(groups, Group{Owner: owner, Migrations: ms})
		if i == 0 {
			rg, err := River()
			if err != nil {
				return nil, err
			}
			groups = append(groups, rg)
		}
	}
	for _, g := range app {
		if g.Owner == coreOwner || g.Owner == riverOwner || containsOwner(groups, g.Owner) {
			return nil, fault.New(fault.InvalidConfig, "migration owner %q is reserved by Better Compute", g.Owner)
		}
	}
	return NewSet(append(groups, app...)...)
}

func containsOwner(groups []Group, owner string) bool {
	for _, g := range groups {
		if g.Owner == owner {
			return true
		}
	}
	return false
}

// EnsureExtensions creates btree_gist (the capacity guarantee's exclusion
// constraint needs it) if it is missing. Without the privilege to create it, it
// returns INVALID_CONFIG saying that a superuser must run CREATE EXTENSION
// btree_gist once.
func EnsureExtensions(ctx context.Context, db *pg.Pool) error {
	var have bool
	if err := db.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'btree_gist')").Scan(&have); err != nil {
		return pg.Translate(fmt.Errorf("error checking for btree_gist: %w", err))
	}
	if have {
		return nil
	}
	err := pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1, $2)", LockKey1, LockKey2); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS btree_gist")
		return err
	})
	if err != nil {
		if fault.CodeOf(pg.Translate(err)) == fault.Unavailable {
			return pg.Translate(err)
		}
		return fault.Wrap(fault.InvalidConfig, err, "the extension btree_gist is missing and this role cannot create it: a superuser must run CREATE EXTENSION btree_gist once in this database")
	}
	return nil
}

// InitSettings stores the deployment's shard count at the first migrate and
// returns the stored one (which a later migrate never changes).
func InitSettings(ctx context.Context, db pg.DBTX, shardCount int) (int, error) {
	if shardCount < 1 || shardCount > 4096 {
		return 0, fault.New(fault.InvalidConfig, "BETTER_COMPUTE_SHARD_COUNT: %d is out of range (1 to 4096)", shardCount)
	}
	var stored int
	err := db.QueryRow(ctx, `
WITH ins AS (
    INSERT INTO compute_settings (id, shard_count) VALUES (true, $1)
    ON CONFLICT (id) DO NOTHING RETURNING shard_count
)
SELECT shard_count FROM ins UNION ALL SELECT shard_count FROM compute_settings LIMIT 1`, shardCount).Scan(&stored)
	if errors.Is(err, pgx.ErrNoRows) {
		// Another migrator inserted the row after this statement's snapshot was
		// taken: read it again, in a new statement that sees it.
		err = db.QueryRow(ctx, `SELECT shard_count FROM compute_settings`).Scan(&stored)
	}
	if err != nil {
		return 0, pg.Translate(fmt.Errorf("error storing the shard count: %w", err))
	}
	return stored, nil
}

// ShardCount reads the stored shard count: NOT_FOUND before the first migrate.
func ShardCount(ctx context.Context, db pg.DBTX) (int, error) {
	var n int
	err := db.QueryRow(ctx, `SELECT shard_count FROM compute_settings`).Scan(&n)
	if err != nil {
		err = pg.Translate(err)
		if fault.Has(err, fault.NotFound) || pg.SQLState(err) == "42P01" {
			return 0, fault.New(fault.NotFound, "the shard count is not stored yet: run better-compute migrate")
		}
		return 0, err
	}
	return n, nil
}
