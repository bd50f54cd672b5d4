package cli_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing/fstest"

	"github.com/bettercompute/bettercompute/cmd/better-compute/cli"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pgtest"
)

// An application's main is cli.Main(app); cli.Run is the same command line
// in-process, with its streams and environment given (clitest.Run wraps it for
// tests). Here the application's module brings a migration, which migrate
// applies after the built-in ones, and its own command reads the table.
func ExampleRun() {
	app := cli.App{
		Name: "shop",
		Modules: []cli.Module{{
			Name: "shop",
			Migrations: fstest.MapFS{"0001_stock.sql": {Data: []byte(`
				CREATE TABLE stock (item text PRIMARY KEY, available int NOT NULL);
				INSERT INTO stock VALUES ('widget', 10);`)}},
		}},
		Commands: []cli.Command{{
			Name:    "stock",
			Summary: "print an item's stock",
			Usage:   "ITEM",
			Run: func(ctx context.Context, c *cli.CommandContext, args []string) error {
				if len(args) != 1 {
					return fault.New(fault.InvalidArgument, "stock takes ITEM, got %q", args)
				}
				var n int
				if err := c.DB.QueryRow(ctx, `SELECT available FROM stock WHERE item = $1`, args[0]).Scan(&n); err != nil {
					return err
				}
				fmt.Fprintf(c.Stdout, "%s: %d available\n", args[0], n)
				return nil
			},
		}},
	}
	ctx := context.Background()
	db := pgtest.ForExample() // a database with the built-in migrations applied
	environ := []string{"BETTER_COMPUTE_DATABASE_URL=" + db.URL, "BETTER_COMPUTE_LOG_LEVEL=warn"}

	// shop migrate: its first line (the last says how long it took).
	var out strings.Builder
	code := cli.Run(ctx, app, []string{"migrate"}, cli.Env{Stdout: &out, Stderr: &out, Environ: environ})
	first, _, _ := strings.Cut(out.String(), "\n")
	fmt.Println(first, code)

	// shop stock widget, then a usage error: the code and the message, on stderr.
	env := cli.Env{Stdout: os.Stdout, Stderr: os.Stdout, Environ: environ}
	fmt.Println(cli.Run(ctx, app, []string{"stock", "widget"}, env))
	fmt.Println(cli.Run(ctx, app, []string{"stock"}, env))
	// Output:
	// applied shop/0001_stock 0
	// widget: 10 available
	// 0
	// INVALID_ARGUMENT: stock takes ITEM, got []
	// 1
}
