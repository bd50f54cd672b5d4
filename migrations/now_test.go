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

// bareNow matches the server clock read directly: now() and every synonym of
// it (the transaction's and the statement's clocks, with or without time zone),
// and clock_timestamp(), the wall clock. Our SQL reads time through compute_now()
// only (core/0001_clock defines it), so that the sim clock moves all of it.
// (The names are spelled in pieces so that this file passes its own check.)
var bareNow = regexp.MustCompile(`(?i)(^|[^a-z0-9_.])(` +
	`now\s*\(\s*\)` + // not "now (see …)" in a message
	`|(transaction_` + `timestamp|statement_` + `timestamp|clock_` + `timestamp)\s*\(` +
	`|(current_` + `timestamp|current_` + `time|local` + `timestamp|local` + `time)($|[^a-z0-9_])` +
	`)`)

// wallClock matches clock_timestamp(), the one bare clock a test may read: a test
// that times something measures real time, which compute_now() (fixed for the
// transaction, and the sim clock's when that is on) cannot give it.
var wallClock = regexp.MustCompile(`(?i)(^|[^a-z0-9_.])clock_` + `timestamp\s*\(`)

// bareClockMark on a line (in a comment) allows a bare clock there in code that
// is not a test: it says why the real server clock is meant, e.g. ages of
// pg_stat_activity's transactions, which the server stamps with its own clock.
const bareClockMark = "bare clock:"

// allowed is the one file that may name the server clock.
const allowed = "migrations/core/0001_clock.sql"

// generated is the schema dump that TestSchemaIsCheckedIn (platform/migrate)
// writes: it restates what the migrations left live, so it holds the server
// clock where core/0001_clock (allowed) names it, and River's column defaults,
// which are River's SQL, not ours. Every line of ours in it comes from a file
// this check reads at its source.
const generated = "migrations/schema.sql"

// isTestCode: tests and the applications they build (testdata/) may read the
// wall clock.
func isTestCode(rel string) bool {
	return strings.HasSuffix(rel, "_test.go") || strings.HasPrefix(rel, "testdata/") || strings.Contains(rel, "/testdata/")
}

// offends says whether sql, found in file rel, reads a clock it must not.
func offends(rel, sql string) bool {
	if !bareNow.MatchString(sql) {
		return false
	}
	if isTestCode(rel) {
		// Only the wall clock is allowed: strip it and look again.
		return bareNow.MatchString(wallClock.ReplaceAllString(sql, "$1"))
	}
	return true
}

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
		if rel == allowed || rel == generated {
			return nil
		}
		switch filepath.Ext(path) {
		case ".sql":
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for i, line := range strings.Split(string(b), "\n") {
				sql, comment, _ := strings.Cut(line, "--")
				if offends(rel, sql) && !strings.Contains(comment, bareClockMark) {
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
			s.Init(file, src, nil, scanner.ScanComments) // comments are not SQL: prose may say now()
			type hit struct {
				first, last int
				text        string
			}
			var hits []hit
			marked := map[int]bool{} // lines with a bareClockMark comment
			for {
				pos, tok, lit := s.Scan()
				if tok == token.EOF {
					break
				}
				switch {
				case tok == token.COMMENT && strings.Contains(lit, bareClockMark):
					marked[fset.Position(pos).Line] = true
				case tok == token.STRING && offends(rel, lit):
					first := fset.Position(pos).Line
					hits = append(hits, hit{first, first + strings.Count(lit, "\n"), firstLine(lit)})
				}
			}
			for _, h := range hits {
				if !marked[h.first] && !marked[h.last] {
					found = append(found, rel+":"+strconv.Itoa(h.first)+": "+h.text)
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
// string literal of every Go file (tests included), except core/0001_clock and
// the generated schema.sql.
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
		body = strings.ReplaceAll(body, "WALL_FN", "clock_"+"timestamp()")
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
	write("wall.go", "package x\n\nconst q = `SELECT WALL_FN`\nconst r = `SELECT WALL_FN` // bare clock: why\n")
	write("wall_test.go", "package x\n\nconst q = `SELECT WALL_FN`\nconst r = `SELECT WALL_FN, NOW_FN`\n")
	write("good.go", "package x\n\nconst q = `SELECT compute_now(), time.Now()`\nfunc f() { _ = NOW_FN }\nconst m = \"cannot be read now (see the log)\"\n")
	write("migrations/app/0003_good.sql", "CREATE TABLE u (at timestamptz DEFAULT compute_now());\n")
	write("migrations/core/0001_clock.sql", "SELECT NOW_FN;\n")
	write("migrations/schema.sql", "CREATE FUNCTION compute_now() RETURNS timestamptz AS $$ SELECT NOW_FN $$;\n")

	found := findBareNow(t, dir)
	want := []string{"bad.go:4", "migrations/app/0001_bad.sql:2", "migrations/app/0002_synonym.sql:1", "wall.go:3", "wall_test.go:4"}
	if len(found) != len(want) {
		t.Fatalf("found %d, want %d: %q", len(found), len(want), found)
	}
	for i, w := range want {
		if !strings.HasPrefix(found[i], w+":") {
			t.Errorf("finding %d = %q, want it at %s", i, found[i], w)
		}
	}
}

// TestNoBareNowPatterns: every spelling of the server clock is caught, in any case
// and with space before its parenthesis, and compute_now(), columns and
// functions whose names merely contain a clock's name, and prose, are not.
func TestNoBareNowPatterns(t *testing.T) {
	// Spelled in pieces so that this file passes its own check.
	caught := []string{
		"SELECT no" + "w()",
		"SELECT NO" + "W ( )",
		"DEFAULT no" + "w()",
		"SELECT current_" + "timestamp",
		"SELECT current_" + "timestamp(3)",
		"SELECT CURRENT_" + "TIMESTAMP",
		"SELECT current_" + "time",
		"SELECT local" + "timestamp",
		"SELECT local" + "timestamp(0)",
		"SELECT local" + "time",
		"SELECT transaction_" + "timestamp()",
		"SELECT statement_" + "timestamp()",
		"SELECT clock_" + "timestamp()",
		"SELECT Clock_" + "Timestamp ()",
		"at > no" + "w()-interval '1 s'",
		"(no" + "w())",
	}
	for _, sql := range caught {
		if !bareNow.MatchString(sql) {
			t.Errorf("not caught: %q", sql)
		}
		if !offends("x.go", sql) {
			t.Errorf("allowed in code: %q", sql)
		}
	}
	for _, sql := range caught {
		wall := strings.Contains(strings.ToLower(sql), "clock_"+"timestamp")
		if got := offends("x_test.go", sql); got == wall {
			t.Errorf("in a test, offends(%q) = %v: only the wall clock is allowed there", sql, got)
		}
	}
	passed := []string{
		"SELECT compute_now()",
		"SELECT created_no" + "w()",
		"SELECT created_now, x.now_at FROM t",
		"SELECT my_current_" + "timestamp()",
		"SELECT current_" + "timestamps FROM t",
		"SELECT local" + "timestamp_col FROM t",
		"SELECT t.local" + "time FROM t",
		"time.No" + "w()",
		"the workflows cannot be read " + "now (see serve's log)",
		"SELECT compute_clock_" + "skew()",
	}
	for _, sql := range passed {
		if bareNow.MatchString(sql) {
			t.Errorf("caught, but is no clock read: %q", sql)
		}
	}
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}
