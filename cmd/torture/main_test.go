package main

import (
	"bytes"
	"flag"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestFlags(t *testing.T) {
	var out bytes.Buffer
	o, err := parse([]string{"-runs", "50", "-parallel", "3", "-burn", "0", "-until-fail"}, &out)
	require.NoError(t, err)
	require.Equal(t, 50, o.runs)
	require.Equal(t, 3, o.parallel)
	require.Zero(t, o.burners)
	require.True(t, o.untilFail)
	require.Equal(t, "large", o.size)
	require.True(t, strings.HasPrefix(o.dir, ".better-compute/torture/"), o.dir)

	_, err = parse([]string{"-runs", "0"}, &out)
	require.ErrorContains(t, err, "-runs and -parallel must be at least 1")
	out.Reset()
	_, err = parse([]string{"-h"}, &out)
	require.ErrorIs(t, err, flag.ErrHelp)
	require.Contains(t, out.String(), "Usage: go tool task torture -- [flags]")
	require.Contains(t, out.String(), "-until-fail")
}

// TestResultLine: the line the harness reads is the one the torture test
// logs, pass or fail.
func TestResultLine(t *testing.T) {
	src, err := os.ReadFile("../../domain/capacity/torture_test.go")
	require.NoError(t, err)
	require.Contains(t, string(src), `"torture result: reservations=%d violations=%d"`)
	m := resultLine.FindStringSubmatch("    torture_test.go:71: torture result: reservations=1470 violations=2")
	require.Equal(t, []string{"torture result: reservations=1470 violations=2", "1470", "2"}, m)

	r := result{n: 3, pass: false, reservations: 1470, violations: 2, load: 20.7, peak: 27.2, log: "run-003.log"}
	require.Equal(t, "run 3/60: FAIL (log run-003.log) in 0s, load 20.7 (peak 27.2), 1470 reservations, 2 violations", r.line(60))
	s := summary([]result{r, {pass: true, reservations: 30, load: 10.7, peak: 12}}, &options{parallel: 4, burners: 2})
	require.Contains(t, s, "2 runs (1 passed, 1 failed), 4 at once, 2 CPU burners")
	require.Contains(t, s, "load 15.7 on average (peak 27.2), 1500 reservations, 2 violations")
}
