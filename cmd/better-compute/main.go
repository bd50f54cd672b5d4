// Command better-compute runs durable background work on PostgreSQL: migrate,
// worker, serve, doctor, dev and the operator verbs. It is cli.Main with no
// application modules; an application builds its own binary the same way with
// its modules (see the README).
package main

import "github.com/bettercompute/bettercompute/cmd/better-compute/cli"

func main() { cli.Main(cli.App{}) }
