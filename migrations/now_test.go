package migrations

import (
	"go/scanner"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// bareNow matches the server clock read directly: now() and its synonyms. Our SQL
// reads time through compute_now() only (core/0001_clock defines it).
// (The synonyms are spelled in pieces so that this file passes its own check.)
var bareNow = regexp.MustCompile(`(?i)(^|[^a-z0-9_.])(now\s*\(\s*\)|current_` + `timestamp|transaction_` + `timestamp\s*\()`)

// allowed is the one file that may name the server clock.
const allowed = "migrations/core/0001_clock.sql"

// findBareNow returns "path:line: text" for every bare now() in the SQL of the
// tree at root: *.sql files (comments stripped) and string literals in *.go files.
func findBareNow(t testing.TB, root string) []string {
	t.Helper()
	var found []string
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			switch d.Name() {
			case ".git", ".better-compute", "node_modules", "vendor":
				return filepath.SkipDir
			}
			return nil
		}
		if rel == allowed {
			return nil
		}
		switch filepath.Ext(path) {
		case ".sql":
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for i, line := range strings.Split(string(b), "\n") {
				if j := strings.Index(line, "--"); j >= 0 {
					line = line[:j]
				}
				if bareNow.MatchString(line) {
					found = append(found, rel+":"+strconv.Itoa(i+1)+": "+strings.TrimSpace(line))
				}
			}
		case ".go":
			src, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			fset := token.NewFileSet()
			file := fset.AddFile(path, -1, len(src))
			var s scanner.Scanner
			s.Init(file, src, nil, 0) // comments skipped: prose may say now()
			for {
				pos, tok, lit := s.Scan()
				if tok == token.EOF {
					break
				}
				if tok == token.STRING && bareNow.MatchString(lit) {
					found = append(found, rel+":"+strconv.Itoa(fset.Position(pos).Line)+": "+firstLine(lit))
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return found
}

// TestNoBareNow fails on a bare now() in any SQL of ours: every migration and every
// string literal of every Go file (tests included), except core/0001_clock.
func TestNoBareNow(t *testing.T) {
	for _, f := range findBareNow(t, "..") {
		t.Errorf("bare server clock in SQL (use compute_now()): %s", f)
	}
}

// TestNoBareNowCatchesAPlantedOne shows the check works: it finds planted bare
// clocks in a Go string and in a migration, and passes their compute_now() twins.
func TestNoBareNowCatchesAPlantedOne(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) {
		// Fixtures spell the clock NOW_FN, so that this file passes its own check.
		body = strings.ReplaceAll(body, "NOW_FN", "no"+"w()")
		body = strings.ReplaceAll(body, "CURRENT_TS", "current_"+"timestamp")
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("bad.go", "package x\n\n// A comment may say NOW_FN freely.\nconst q = `UPDATE t SET at = NOW_FN WHERE id = $1`\n")
	write("migrations/app/0001_bad.sql", "-- NOW_FN in a comment is fine\nCREATE TABLE t (at timestamptz DEFAULT NOW_FN);\n")
	write("migrations/app/0002_synonym.sql", "SELECT CURRENT_TS;\n")
	write("good.go", "package x\n\nconst q = `SELECT compute_now(), time.Now()`\nfunc f() { _ = NOW_FN }\n")
	write("migrations/app/0003_good.sql", "CREATE TABLE u (at timestamptz DEFAULT compute_now());\n")
	write("migrations/core/0001_clock.sql", "SELECT NOW_FN;\n")

	found := findBareNow(t, dir)
	want := []string{"bad.go:4", "migrations/app/0001_bad.sql:2", "migrations/app/0002_synonym.sql:1"}
	if len(found) != len(want) {
		t.Fatalf("found %d, want %d: %q", len(found), len(want), found)
	}
	for i, w := range want {
		if !strings.HasPrefix(found[i], w+":") {
			t.Errorf("finding %d = %q, want it at %s", i, found[i], w)
		}
	}
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}
