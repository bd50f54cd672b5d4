package cli_test

import (
	"context"
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/cmd/better-compute/cli/clitest"
	"github.com/bettercompute/bettercompute/domain/workflow/confirmation"
)

const confBase = "https://confirm.example.com/"

// confCreated is create's text output: the binding's id, and the token of
// the link on its last line.
func confCreated(t *testing.T, r clitest.Result) (int64, string) {
	t.Helper()
	require.Equal(t, 0, r.Code, r.Stderr)
	lines := strings.Split(strings.TrimSuffix(r.Stdout, "\n"), "\n")
	require.Len(t, lines, 2, r.Stdout)
	m := regexp.MustCompile(`^confirmation (\d+): signal paid to workflow (\S+) \(wfcli_order\), expires (\S+)$`).FindStringSubmatch(lines[0])
	require.NotNil(t, m, lines[0])
	id, err := strconv.ParseInt(m[1], 10, 64)
	require.NoError(t, err)
	_, err = time.Parse(time.RFC3339, m[3])
	require.NoError(t, err, m[3])
	tok, ok := strings.CutPrefix(lines[1], confBase+"confirm/")
	require.True(t, ok, "the link on the last line: %s", lines[1])
	require.NoError(t, confirmation.CheckToken(tok))
	return id, tok
}

// TestConfirmationCommand: create prints a link (its token confirms, storing
// the signal once), list shows the binding's state and never a token, revoke
// stops a pending one and refuses a confirmed one; bad input is one line
// with its code and writes nothing.
func TestConfirmationCommand(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, env := wfEnv(t)
	env = append(env, "BETTER_COMPUTE_PUBLIC_URL="+confBase)
	wfStart(t, db.Pool, "wfcli_order", `{"order": "o1", "await_paid": true}`, "order-1")
	run := func(args ...string) clitest.Result {
		t.Helper()
		return clitest.Run(t, ctx, wfApp(), env, append([]string{"confirmation"}, args...)...)
	}
	count := func() int { t.Helper(); return db.MustCount(t, `SELECT count(*) FROM compute_confirmations`) }

	// Bad input: one line with its code, nothing written.
	for _, tc := range []struct {
		args []string
		code string
		exit int
	}{
		{[]string{"create", "--workflow", "order-1", "--signal", "paid", "--payload", "{"}, "INVALID_ARGUMENT", 1},
		{[]string{"create", "--workflow", "order-1", "--signal", "paid", "--ttl", "nonsense"}, "INVALID_ARGUMENT", 1},
		{[]string{"create", "--workflow", "order-1", "--signal", "paid", "--ttl", "0s"}, "INVALID_ARGUMENT", 1},
		{[]string{"create", "--workflow", "order-1", "--signal", "paid", "--ttl", "2400h"}, "INVALID_ARGUMENT", 1},
		{[]string{"create", "--signal", "paid"}, "INVALID_ARGUMENT", 1},
		{[]string{"create", "--workflow", "order-1"}, "INVALID_ARGUMENT", 1},
		{[]string{"create", "--workflow", "bad id", "--signal", "paid"}, "INVALID_ARGUMENT", 1},
		{[]string{"create", "--workflow", "order-1", "--signal", "shipped"}, "INVALID_ARGUMENT", 1}, // not declared
		{[]string{"create", "--workflow", "nobody", "--signal", "paid"}, "NOT_FOUND", 1},
		{[]string{"create", "order-1", "--workflow", "order-1", "--signal", "paid"}, "INVALID_ARGUMENT", 1},
		{[]string{"list", "--state", "asleep"}, "INVALID_ARGUMENT", 1},
		{[]string{"list", "--limit", "0"}, "INVALID_ARGUMENT", 1},
		{[]string{"list", "--ttl", "1h"}, "INVALID_ARGUMENT", 1}, // a flag of create's
		{[]string{"revoke"}, "INVALID_ARGUMENT", 1},
		{[]string{"revoke", "abc"}, "INVALID_ARGUMENT", 1},
		{[]string{"revoke", "999999"}, "NOT_FOUND", 1},
		{[]string{"frobnicate"}, "INVALID_ARGUMENT", 1},
		{nil, "INVALID_ARGUMENT", 1},
		{[]string{"list", "--limit", "x"}, "INVALID_ARGUMENT", 2}, // (to the flag parser)
	} {
		r := run(tc.args...)
		require.Equal(t, tc.exit, r.Code, "%v: %s", tc.args, r.Stderr)
		require.True(t, strings.HasPrefix(r.Stderr, tc.code+": "), "%v: %s", tc.args, r.Stderr)
		require.Equal(t, 1, strings.Count(r.Stderr, "\n"), "%v: one line: %s", tc.args, r.Stderr)
		require.Empty(t, r.Stdout, "%v", tc.args)
	}
	require.Zero(t, count(), "bad input wrote nothing")
	r := run("revoke", "999999")
	require.Contains(t, r.Stderr, "NOT_FOUND: no confirmation 999999")

	r = run("list")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Equal(t, "no confirmations\n", r.Stdout)

	// create: the first line says what the link does, the last is the link.
	r = run("create", "--workflow", "order-1", "--signal", "paid", "--payload", `{"amount": 30}`, "--ttl", "2h")
	id, tok := confCreated(t, r)
	require.Equal(t, 1, count())
	b, err := confirmation.Get(ctx, db.Pool, id)
	require.NoError(t, err)
	require.Equal(t, confirmation.Pending, b.State)
	require.JSONEq(t, `{"amount": 30}`, string(b.Payload))
	require.InDelta(t, 2*time.Hour, b.ExpiresAt.Sub(b.CreatedAt), float64(time.Second))

	// list: the binding, pending, and no token.
	r = run("list")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Regexp(t, `(?m)^ID\s+WORKFLOW\s+KIND\s+SIGNAL\s+STATE\s+CREATED\s+EXPIRES$`, r.Stdout)
	require.Regexp(t, `(?m)^`+strconv.FormatInt(id, 10)+`\s+order-1\s+wfcli_order\s+paid\s+pending\s`, r.Stdout)
	require.NotContains(t, r.Stdout, tok)
	require.NotContains(t, r.Stdout, confirmation.TokenPrefix)
	r = run("list", "--json", "--workflow", "order-1")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.NotContains(t, r.Stdout, confirmation.TokenPrefix)
	var bs []confirmation.Binding
	require.NoError(t, json.Unmarshal([]byte(r.Stdout), &bs))
	require.Len(t, bs, 1)
	require.Equal(t, id, bs[0].ID)
	require.Equal(t, confirmation.Pending, bs[0].State)

	// The link confirms, once: one signal stored.
	cb, err := confirmation.Confirm(ctx, db.Pool, tok)
	require.NoError(t, err)
	require.Equal(t, id, cb.ID)
	_, err = confirmation.Confirm(ctx, db.Pool, tok)
	require.ErrorIs(t, err, confirmation.ErrAlreadyConfirmed)
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM compute_workflow_signals
		WHERE workflow_id = 'order-1' AND name = 'paid' AND payload = '{"amount": 30}'`))
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM compute_workflow_signals`))
	r = run("list", "--state", "confirmed")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Regexp(t, `(?m)^`+strconv.FormatInt(id, 10)+`\s+order-1\s+wfcli_order\s+paid\s+confirmed\s`, r.Stdout)
	require.NotContains(t, r.Stdout, tok)
	r = run("list", "--state", "pending", "--workflow", "order-1")
	require.Equal(t, "no pending confirmations of workflow order-1\n", r.Stdout)

	// revoke of a confirmed one: CONFLICT, nothing changes.
	r = run("revoke", strconv.FormatInt(id, 10))
	require.Equal(t, 1, r.Code)
	require.Regexp(t, `^CONFLICT: confirmation \d+ is already confirmed: its signal was delivered \(signal paid to workflow order-1 at \S+\); revoking changes nothing\n$`, r.Stderr)
	b, err = confirmation.Get(ctx, db.Pool, id)
	require.NoError(t, err)
	require.Equal(t, confirmation.Confirmed, b.State)
	require.Nil(t, b.RevokedAt)

	// create --json: the binding and its link; revoke stops it.
	r = run("create", "--workflow", "order-1", "--signal", "paid", "--json")
	require.Equal(t, 0, r.Code, r.Stderr)
	var created struct {
		confirmation.Binding
		URL string `json:"url"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.Stdout), &created))
	require.Equal(t, confirmation.Pending, created.State)
	require.Equal(t, "order-1", created.WorkflowID)
	require.Equal(t, "wfcli_order", created.Kind)
	require.Empty(t, created.Payload)
	require.InDelta(t, confirmation.DefaultTTL, created.ExpiresAt.Sub(created.CreatedAt), float64(time.Second))
	tok2, ok := strings.CutPrefix(created.URL, confBase+"confirm/")
	require.True(t, ok, created.URL)
	require.NoError(t, confirmation.CheckToken(tok2))
	id2 := strconv.FormatInt(created.ID, 10)

	r = run("revoke", id2)
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Equal(t, "confirmation "+id2+" revoked: its link no longer works\n", r.Stdout)
	_, err = confirmation.Confirm(ctx, db.Pool, tok2)
	require.ErrorIs(t, err, confirmation.ErrNotValid)
	r = run("revoke", id2)
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "already revoked")
	r = run("list")
	require.Regexp(t, `(?m)^`+id2+`\s+order-1\s+wfcli_order\s+paid\s+revoked\s`, r.Stdout)
	require.NotContains(t, r.Stdout, confirmation.TokenPrefix)
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM compute_workflow_signals`), "still the one signal")

	// Help says what each verb takes.
	r = run("--help")
	require.Equal(t, 0, r.Code, r.Stderr)
	for _, s := range []string{"create --workflow ID --signal NAME", "revoke ID", "--payload", "--ttl", "--state", "--limit", "--json", "once"} {
		require.Contains(t, r.Stdout, s)
	}
}
