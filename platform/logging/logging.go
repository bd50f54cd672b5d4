// Package logging builds the process's zerolog logger and the *slog.Logger that
// River writes to, so both end up in the same stream with the same level.
//
// Output is console (human) when the writer is a terminal and JSON otherwise,
// unless the configuration says which. Nothing logged here ever holds the
// database password: connection URLs are logged through pg.RedactURL.
package logging

import (
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/term"
)

// New returns a logger writing to w at level ("trace" … "error") in format
// ("json", "console", or "" to choose by whether w is a terminal).
func New(w io.Writer, level, format string) zerolog.Logger {
	lvl, err := zerolog.ParseLevel(level)
	if err != nil || level == "" {
		lvl = zerolog.InfoLevel
	}
	if format == "" {
		format = "json"
		if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
			format = "console"
		}
	}
	out := w
	if format == "console" {
		out = zerolog.ConsoleWriter{Out: w, TimeFormat: "15:04:05.000"}
	}
	return zerolog.New(out).Level(lvl).With().Timestamp().Logger()
}

// Slog returns an *slog.Logger that writes through l (for River and River UI).
// River logs routine job failures at error level; they keep that level.
func Slog(l zerolog.Logger) *slog.Logger {
	return slog.New(zerolog.NewSlogHandler(l))
}

func init() {
	zerolog.TimeFieldFormat = time.RFC3339Nano
	zerolog.DurationFieldUnit = time.Millisecond
	zerolog.DurationFieldInteger = false
}
