package fault_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/platform/fault"
)

// TestCheckText: valid UTF-8 without a NUL byte passes; invalid UTF-8 or a NUL
// byte is INVALID_ARGUMENT naming the field and quoting the value (%q, never
// its raw bytes), a long value cut to its first 64 characters.
func TestCheckText(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"", "k", "héllo/wörld", "日本", strings.Repeat("x", 10000), "\u2028"} {
		require.NoError(t, fault.CheckText("key", ok), "%q", ok)
	}
	for s, want := range map[string]string{
		"a\x00b":       `INVALID_ARGUMENT: dirty item: key "a\x00b" holds a NUL byte (PostgreSQL text takes neither)`,
		"a\xffb":       `INVALID_ARGUMENT: dirty item: key "a\xffb" is not valid UTF-8 (PostgreSQL text takes neither)`,
		"\xc3":         `INVALID_ARGUMENT: dirty item: key "\xc3" is not valid UTF-8 (PostgreSQL text takes neither)`,
		"\xed\xa0\x80": `INVALID_ARGUMENT: dirty item: key "\xed\xa0\x80" is not valid UTF-8 (PostgreSQL text takes neither)`,
	} {
		err := fault.CheckText("dirty item: key", s)
		require.Equal(t, fault.InvalidArgument, fault.CodeOf(err), "%q", s)
		require.Equal(t, want, err.Error())
		require.NotContains(t, err.Error(), "\x00")
	}
	long := strings.Repeat("é", 100) + "\x00"
	err := fault.CheckText("tenant", long)
	require.Equal(t, `INVALID_ARGUMENT: tenant "`+strings.Repeat("é", 64)+`"… holds a NUL byte (PostgreSQL text takes neither)`, err.Error())
}

// TestCheckJSON: JSON that jsonb stores passes (surrogate pairs, escaped
// backslashes before a "u0000" text); invalid UTF-8, a \u0000 escape and a lone
// surrogate's escape are INVALID_ARGUMENT naming the field. (That PostgreSQL
// refuses exactly these is platform/pg's TestCheckTextAgreesWithPostgreSQL.)
func TestCheckJSON(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{
		`null`, `{}`, `"a"`, `{"a":[1,"b",{"c":"\n\t\"\\"}]}`,
		`"\\u0000"`, `"\\\\u0000"`, `"\ud83d\ude00"`, `"\uD83D\uDE00x"`, `"\u0001\u00e9\uffff"`, `"é"`,
	} {
		require.NoError(t, fault.CheckJSON("payload", []byte(ok)), ok)
	}
	for _, bad := range []string{
		`"\u0000"`, `{"a":"x\u0000y"}`, `["\\\u0000"]`, `{"\u0000":1}`,
		`"\ud83d"`, `"\ud83dx"`, `"\ud83d\u0041"`, `"\ude00"`, `"\ude00\ud83d"`, `"\ud83d\n"`,
		"\"\xff\"",
	} {
		err := fault.CheckJSON("the payload of event order.paid", []byte(bad))
		require.Equal(t, fault.InvalidArgument, fault.CodeOf(err), bad)
		require.True(t, strings.HasPrefix(err.Error(), "INVALID_ARGUMENT: the payload of event order.paid "), err.Error())
	}
}

// TestCleanText: text PostgreSQL stores is kept as it is; invalid UTF-8 is
// replaced by U+FFFD and NUL bytes are dropped, so CheckText takes the result.
func TestCleanText(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"":                  "",
		"card declined é":   "card declined é",
		"card \x00declined": "card declined",
		"caf\xe9 \xff\x00!": "caf\uFFFD \uFFFD!",
	} {
		got := fault.CleanText(in)
		require.Equal(t, want, got, "%q", in)
		require.NoError(t, fault.CheckText("cleaned", got))
	}
}
