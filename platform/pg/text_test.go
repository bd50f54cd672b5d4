package pg_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
)

// TestCheckTextAgreesWithPostgreSQL: fault.CheckText refuses exactly the
// strings PostgreSQL refuses as a text parameter, and fault.CheckJSON exactly
// the JSON (that encoding/json accepts) PostgreSQL refuses as jsonb. What
// they refuse would fail the statement and abort the caller's transaction, so
// the functions that take an application's strings check them first.
func TestCheckTextAgreesWithPostgreSQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{Empty: true})

	for _, s := range []string{"", "k", "héllo", "日本\u2028", "\U0001F600", "a\x00b", "\x00", "a\xffb", "\xc3", "\xed\xa0\x80", "\xf4\x90\x80\x80"} {
		_, err := db.Exec(ctx, `SELECT $1::text`, s)
		if fault.CheckText("s", s) == nil {
			require.NoError(t, err, "%q", s)
		} else {
			require.Equal(t, "22021", pg.SQLState(err), "%q: %v", s, err)
		}
	}
	for _, doc := range []string{
		`null`, `{"a":[1,"b",{"c":"\n\t\"\\"}]}`, `"\\u0000"`, `"\ud83d\ude00"`, `"\u0001\u00e9\uffff"`, `"é"`,
		`"\u0000"`, `{"a":"x\u0000y"}`, `["\\\u0000"]`, `{"\u0000":1}`,
		`"\ud83d"`, `"\ud83dx"`, `"\ud83d\u0041"`, `"\ude00"`, `"\ude00\ud83d"`, "\"\xff\"",
	} {
		require.True(t, json.Valid([]byte(doc)), "encoding/json takes %s", doc)
		_, err := db.Exec(ctx, `SELECT $1::text::jsonb`, doc)
		if fault.CheckJSON("doc", []byte(doc)) == nil {
			require.NoError(t, err, doc)
		} else {
			require.Error(t, err, doc)
			require.Contains(t, []string{"22P05", "22P02", "22021"}, pg.SQLState(err), "%s: %v", doc, err)
		}
	}
}
