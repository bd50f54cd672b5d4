package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"os"
	"path/filepath"
	"strings"

	"github.com/bettercompute/bettercompute/platform/embedded"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
)

// DevDatabase is the better-compute binary's dev database when
// BETTER_COMPUTE_DATABASE_URL is not set: App{}.DevDatabase().
const DevDatabase = "embedded:.better-compute/pg"

// devURLFile is the name of the file dev and db start write the database's URL
// to, beside the embedded cluster's data directory (see devURLPath).
const devURLFile = "database-url"

// DevDatabase is dev's database when BETTER_COMPUTE_DATABASE_URL is not set:
// the embedded cluster in .NAME/pg of the working directory, NAME being the
// application's name (DevDatabase for the better-compute binary).
func (a App) DevDatabase() string {
	return embedded.Scheme + "." + a.name() + "/pg"
}

// devOpts are dev's options: --trace, and the configuration's flags; it takes
// no arguments.
type devOpts struct {
	trace bool
}

func (o *devOpts) bind(fs *flag.FlagSet) {
	fs.BoolVar(&o.trace, "trace", false, "print every span to stderr as it ends, one line each (as OTEL_TRACES_EXPORTER=console; OTEL_SDK_DISABLED=true still wins)")
}
func (*devOpts) Validate(args []string) error { return noArgs("dev", args) }

// devCommand is dev, whose database defaults to db.
func devCommand(db string) *command {
	o := &devOpts{}
	return &command{
		name:    "dev",
		summary: "run everything in one process on the embedded PostgreSQL (" + db + " unless BETTER_COMPUTE_DATABASE_URL says otherwise), until interrupted",
		opts:    o,
		run:     o.run,
	}
}

// run migrates, starts a worker on every shard and serve in one process, and
// runs each module's Dev (the application's play), until interrupted. On an
// embedded cluster kept in a directory it writes the database's URL to a file
// for scripts (devURLPath), removed when dev stops the cluster: a cluster it
// found running (started by db start) it leaves running, and the file with it.
func (o *devOpts) run(ctx context.Context, s *Session, _ []string) error {
	s.Dev = true
	s.traceConsole = o.trace
	if s.Config.DatabaseURL == "" {
		s.Config.DatabaseURL = s.App.DevDatabase()
	}
	db, err := s.Pool(ctx)
	if err != nil {
		return err
	}
	rt, err := s.StartWorker(ctx) // migrates first, unless --no-migrate
	if err != nil {
		return err
	}
	defer func() { _ = rt.Stop(context.Background()) }()
	stopServe, err := s.StartServe(ctx, rt)
	if err != nil {
		return err
	}
	defer stopServe()
	devCtx := context.WithValue(ctx, tracerKey{}, rt.TracerProvider())
	for _, m := range s.App.Modules {
		if m.Dev != nil {
			go m.Dev(devCtx, rt.Pool(), s.Log.With().Str("module", m.Name).Logger())
		}
	}
	url := db.Config().ConnString()
	urlFile := ""
	if s.cluster != nil {
		url = s.cluster.URL()
		if urlFile = devURLPath(s.Config.DatabaseURL); urlFile != "" {
			remove, err := writeURLFile(urlFile, url)
			if err != nil {
				return err
			}
			// The file lives as long as the cluster: dev removes it when it
			// stops a cluster it started, and leaves it with one it found
			// running (db start's, or another dev's), which stays up.
			if s.cluster.Owned() {
				defer remove()
			}
		}
	}
	name := s.App.name()
	fmt.Fprintf(s.Env.Stdout, "%s dev: database ready at %s\n", name, pg.RedactURL(url))
	fmt.Fprintf(s.Env.Stdout, "  psql %s\n  BETTER_COMPUTE_DATABASE_URL=%s %s doctor\n", pg.RedactURL(url), pg.RedactURL(url), name)
	if urlFile != "" {
		fmt.Fprintf(s.Env.Stdout, "  database URL written to %s\n", urlFile)
	}
	fmt.Fprintf(s.Env.Stdout, "Press Ctrl-C to stop.\n")
	<-ctx.Done()
	s.Log.Info().Msg("dev: stopping")
	return nil
}

// devURLPath is where dev and db start write the URL of the embedded cluster embeddedURL
// names: devURLFile in the parent of its data directory (the URL's path is the
// data directory itself, PostgreSQL's own), so embedded:.app/pg writes
// .app/database-url. It is "" for embedded:memory, whose temporary directory's
// parent is shared.
func devURLPath(embeddedURL string) string {
	dir := strings.TrimPrefix(embeddedURL, embedded.Scheme)
	if !embedded.IsURL(embeddedURL) || dir == "" || dir == embedded.Memory {
		return ""
	}
	return filepath.Join(filepath.Dir(filepath.Clean(dir)), devURLFile)
}

// writeURLFile writes url and a newline to path, mode 0600, replacing the file
// at once (a script never reads half of it). remove removes the file if it
// still holds url (removeURLFile).
func writeURLFile(path, url string) (remove func(), err error) {
	content := url + "\n"
	f, err := os.CreateTemp(filepath.Dir(path), "."+devURLFile+"-*") // mode 0600
	if err == nil {
		_, err = f.WriteString(content)
		err = errors.Join(err, f.Close())
		if err == nil {
			err = os.Rename(f.Name(), path)
		}
		if err != nil {
			_ = os.Remove(f.Name())
		}
	}
	if err != nil {
		return nil, fault.Wrap(fault.InvalidConfig, err, "cannot write the database URL to %s", path)
	}
	return func() { removeURLFile(path, url) }, nil
}

// removeURLFile removes the URL file at path if it holds url (another cluster
// in the same parent directory may have rewritten it).
func removeURLFile(path, url string) {
	if b, err := os.ReadFile(path); err == nil && string(b) == url+"\n" {
		_ = os.Remove(path)
	}
}

type tracerKey struct{}

// TracerProvider is the tracer provider of the dev process whose Module.Dev
// hook ctx is (a no-op one when tracing is off, and for any other context): a
// Dev hook plays the application, so it starts its "requests" as spans of it,
// and dev --trace shows each one's trace through the reconcile, the workflow
// steps and the outbox delivery it caused.
func TracerProvider(ctx context.Context) trace.TracerProvider {
	if tp, ok := ctx.Value(tracerKey{}).(trace.TracerProvider); ok && tp != nil {
		return tp
	}
	return noop.NewTracerProvider()
}
