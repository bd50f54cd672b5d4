package fault

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// CheckText returns INVALID_ARGUMENT naming field when s is not text PostgreSQL
// stores: bytes that are not valid UTF-8, or a NUL byte. Sent as a parameter,
// either fails the statement (SQLSTATE 22021) and so aborts the caller's whole
// transaction; every string an application or an operator hands to a function
// that puts it in SQL is checked with CheckText before the first statement.
// The message quotes s with %q (its first 64 characters), never raw.
func CheckText(field, s string) error {
	why := ""
	switch {
	case !utf8.ValidString(s):
		why = "is not valid UTF-8"
	case strings.IndexByte(s, 0) >= 0:
		why = "holds a NUL byte"
	default:
		return nil
	}
	return New(InvalidArgument, "%s %s %s (PostgreSQL text takes neither)", field, quoted(s), why)
}

// CleanText is s as text PostgreSQL stores: invalid UTF-8 replaced by U+FFFD
// and NUL bytes dropped. It is for text that is recorded rather than refused,
// such as an error's message (a failure whose text the database refused would
// not be recorded at all); an argument is checked with CheckText instead.
func CleanText(s string) string {
	if utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 {
		return s
	}
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "")
}

// CheckJSON returns INVALID_ARGUMENT naming field when b, valid JSON, is JSON
// that encoding/json accepts and PostgreSQL's jsonb refuses (SQLSTATE 22P05 or
// 22021, which abort the caller's transaction): bytes that are not valid UTF-8,
// a \u0000 escape in a string (json.Marshal writes a Go string's NUL byte so),
// or a \u escape of a lone UTF-16 surrogate. It checks nothing else: call it
// after json.Marshal or json.Valid. It reads b once and allocates nothing.
func CheckJSON(field string, b []byte) error {
	if !utf8.Valid(b) {
		return New(InvalidArgument, "%s is not valid UTF-8 (PostgreSQL's jsonb refuses it)", field)
	}
	for i := 0; i < len(b); i++ {
		// In valid JSON a backslash starts an escape, inside a string.
		if b[i] != '\\' {
			continue
		}
		i++
		if i >= len(b) || b[i] != 'u' || i+4 >= len(b) {
			continue
		}
		r := hex4(b[i+1 : i+5])
		i += 4
		switch {
		case r == 0:
			return New(InvalidArgument, `%s holds \u0000 in a string (PostgreSQL's jsonb refuses it)`, field)
		case r >= 0xDC00 && r < 0xE000:
			return loneSurrogate(field)
		case r >= 0xD800 && r < 0xDC00:
			// A high surrogate: a low one's escape must follow.
			if i+6 >= len(b) || b[i+1] != '\\' || b[i+2] != 'u' {
				return loneSurrogate(field)
			}
			if lo := hex4(b[i+3 : i+7]); lo < 0xDC00 || lo >= 0xE000 {
				return loneSurrogate(field)
			}
			i += 6
		}
	}
	return nil
}

func loneSurrogate(field string) error {
	return New(InvalidArgument, `%s holds a \u escape of a lone UTF-16 surrogate (PostgreSQL's jsonb refuses it)`, field)
}

// hex4 is the value of four hex digits (valid JSON has them after \u).
func hex4(b []byte) rune {
	var r rune
	for _, c := range b {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			r |= rune(c - 'A' + 10)
		}
	}
	return r
}

// quoted is s quoted with %q, cut to its first 64 characters.
func quoted(s string) string {
	n := 0
	for i := range s {
		if n == 64 {
			return strconv.Quote(s[:i]) + "…"
		}
		n++
	}
	return strconv.Quote(s)
}
