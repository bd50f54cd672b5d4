// Package inventory is the worked example of docs/backfills.md: an application
// module that adds a column to a table in the four stages expand, backfill, cut
// over, clean up, each tolerating another instance that still runs the stage
// before it.
//
//	release 1  0001_items: the table; the code writes and reads name
//	release 2  0002_expand_normalized_name: a nullable column, a trigger that
//	           fills it for every row written from now on, a partial index;
//	           the backfill inventory_normalized_name fills the rows that exist
//	release 3  cut over: the code writes normalized_name and reads it
//	release 4  0003_normalized_name_not_null: a new file makes it NOT NULL and
//	           drops the trigger and the index
//
// In a real application each release is a new build whose migrations directory
// has the files up to its own; Module(release) and Items{Release} play the
// releases side by side, so a test can run them against one database the way a
// rolling update does.
package inventory

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/bettercompute/bettercompute/cmd/better-compute/cli"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/workers"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Releases is the number of releases of the example.
const Releases = 4

// NormalizeNames is the backfill of release 2: it sets normalized_name on up to
// n rows that have none, in the batch's transaction. It selects only unfinished
// rows and its UPDATE is idempotent, so a retried or repeated batch reaches the
// same final state; FOR UPDATE makes a concurrent rename by release 1 either wait
// for the batch or, having renamed first (its trigger filled the column), drop
// out of it.
var NormalizeNames = workers.Backfill{
	Name:      "inventory_normalized_name",
	BatchSize: 1000,
	Batch: func(ctx context.Context, tx pgx.Tx, n int) (int, error) {
		tag, err := tx.Exec(ctx, `
UPDATE inventory_items SET normalized_name = lower(name)
WHERE id = ANY (ARRAY(
        SELECT id FROM inventory_items WHERE normalized_name IS NULL
        ORDER BY id LIMIT $1 FOR UPDATE))
  AND normalized_name IS NULL`, n)
		return int(tag.RowsAffected()), err
	},
	Estimate: func(ctx context.Context, db pg.DBTX) (int64, error) {
		var n int64 // a count over the partial index: cheap
		err := db.QueryRow(ctx, `SELECT count(*) FROM inventory_items WHERE normalized_name IS NULL`).Scan(&n)
		return n, err
	},
}

// Module is the inventory module as release ships it (1 to Releases): the
// migrations up to that release's, and the backfill from release 2 until the
// clean-up release drops it.
func Module(release int) cli.Module {
	if release < 1 || release > Releases {
		panic(fmt.Sprintf("inventory: no release %d", release))
	}
	last := map[int]int{1: 1, 2: 2, 3: 2, 4: 3}[release]
	sub, _ := fs.Sub(migrationFS, "migrations")
	return cli.Module{
		Name:       "inventory",
		Migrations: upTo{sub, last},
		Register: func(r *workers.Registry) error {
			if release == 2 || release == 3 {
				return workers.AddBackfill(r, NormalizeNames)
			}
			return nil
		},
	}
}

// upTo is a migrations directory with the files numbered up to n only.
type upTo struct {
	fsys fs.FS
	n    int
}

func (u upTo) keep(name string) bool {
	num, _, ok := strings.Cut(name, "_")
	if !ok {
		return name == "."
	}
	i, err := strconv.Atoi(num)
	return err == nil && i <= u.n
}

// Open opens name if it is kept.
func (u upTo) Open(name string) (fs.File, error) {
	if !u.keep(name) {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	}
	return u.fsys.Open(name)
}

// ReadDir lists the kept files of name.
func (u upTo) ReadDir(name string) ([]fs.DirEntry, error) {
	entries, err := fs.ReadDir(u.fsys, name)
	if err != nil {
		return nil, err
	}
	var out []fs.DirEntry
	for _, e := range entries {
		if u.keep(e.Name()) {
			out = append(out, e)
		}
	}
	return out, nil
}

// Items is the application code of one release.
type Items struct{ Release int }

// Add inserts an item and returns its id. Releases 1 and 2 know nothing of
// normalized_name (from release 2 on, the trigger fills it); release 3 on, the
// cut-over, writes it.
func (it Items) Add(ctx context.Context, db pg.DBTX, name string) (int64, error) {
	var id int64
	var err error
	if it.Release < 3 {
		err = db.QueryRow(ctx, `INSERT INTO inventory_items (name) VALUES ($1) RETURNING id`, name).Scan(&id)
	} else {
		err = db.QueryRow(ctx, `INSERT INTO inventory_items (name, normalized_name) VALUES ($1, lower($1)) RETURNING id`, name).Scan(&id)
	}
	return id, err
}

// Rename renames an item, the same way round.
func (it Items) Rename(ctx context.Context, db pg.DBTX, id int64, name string) error {
	var err error
	if it.Release < 3 {
		_, err = db.Exec(ctx, `UPDATE inventory_items SET name = $2 WHERE id = $1`, id, name)
	} else {
		_, err = db.Exec(ctx, `UPDATE inventory_items SET name = $2, normalized_name = lower($2) WHERE id = $1`, id, name)
	}
	return err
}

// Find returns the ids of the items called name, whatever its case, in id
// order. Release 3 on reads normalized_name; before, it computes lower(name).
func (it Items) Find(ctx context.Context, db pg.DBTX, name string) ([]int64, error) {
	q := `SELECT id FROM inventory_items WHERE lower(name) = lower($1) ORDER BY id`
	if it.Release >= 3 {
		q = `SELECT id FROM inventory_items WHERE normalized_name = lower($1) ORDER BY id`
	}
	rows, err := db.Query(ctx, q, name)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}
