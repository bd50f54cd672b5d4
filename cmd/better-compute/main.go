// Command better-compute runs durable background work on PostgreSQL: migrate,
// worker, serve, doctor, dev and the operator verbs, with the demo application
// (package demo) that dev shows. An application builds its own binary the same
// way with its own modules, and none of the demo's (see docs/applications.md).
package main

import (
	"github.com/bettercompute/bettercompute/cmd/better-compute/cli"
	"github.com/bettercompute/bettercompute/cmd/better-compute/demo"
)

func main() { cli.Main(cli.App{Modules: demo.Modules()}) }
