package pgtest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/bettercompute/bettercompute/platform/embedded"
)

// PasswordServer is a PostgreSQL cluster of its own that asks for passwords
// (the shared test cluster trusts every login), with one role that logs in with
// Password.
type PasswordServer struct {
	User     string
	Password string
	Port     int
}

// URL is the server's postgres database as User with password pw (pass
// Password for a login that succeeds).
func (s *PasswordServer) URL(pw string) string {
	return fmt.Sprintf("postgres://%s:%s@127.0.0.1:%d/postgres?sslmode=disable", s.User, pw, s.Port)
}

// NewPasswordServer starts a cluster whose role user logs in with password pw
// (scram-sha-256); it is stopped at cleanup. It fails the test when the
// PostgreSQL binaries are missing.
func NewPasswordServer(tb testing.TB, user, pw string) *PasswordServer {
	tb.Helper()
	ctx := context.Background()
	// The server runs as an unprivileged user when the tests run as root, so its
	// files live in a directory others can enter.
	root, err := os.MkdirTemp("", "bc-pg-password-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(root) })
	if err := os.Chmod(root, 0o755); err != nil {
		tb.Fatal(err)
	}
	hba := filepath.Join(root, "pg_hba.conf")
	if err := os.WriteFile(hba, []byte("host all postgres 127.0.0.1/32 trust\nhost all all 127.0.0.1/32 scram-sha-256\n"), 0o644); err != nil {
		tb.Fatal(err)
	}
	c, err := embedded.Start(ctx, embedded.Options{Dir: filepath.Join(root, "data"), Fast: true,
		Settings: map[string]string{"hba_file": hba}})
	if err != nil {
		tb.Fatalf("pgtest: cannot start a password cluster: %v", err)
	}
	tb.Cleanup(func() { _ = c.Stop() })
	admin, err := pgx.Connect(ctx, c.DatabaseURL("postgres"))
	if err != nil {
		tb.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE ROLE "+pgx.Identifier{user}.Sanitize()+" LOGIN PASSWORD "+quote(pw)); err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	return &PasswordServer{User: user, Password: pw, Port: c.Port()}
}

func quote(s string) string {
	out := []byte{'\''}
	for i := 0; i < len(s); i++ {
		if s[i] == '\'' {
			out = append(out, '\'')
		}
		out = append(out, s[i])
	}
	return string(append(out, '\''))
}
