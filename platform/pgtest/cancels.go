package pgtest

import (
	"encoding/binary"
	"io"
	"net"
	"net/url"
	"sync/atomic"
	"testing"
)

// CancelCounter is a TCP proxy in front of a PostgreSQL server (or a pooler)
// that counts the cancel requests passing through it: connections whose first
// message is the 16-byte CancelRequest (code 80877102).
type CancelCounter struct {
	addr    string
	cancels atomic.Int64
}

// StartCancelCounter proxies to the host:port of target, a postgres:// URL, until
// the test ends.
func StartCancelCounter(tb testing.TB, target string) *CancelCounter {
	tb.Helper()
	u, err := url.Parse(target)
	if err != nil {
		tb.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = l.Close() })
	c := &CancelCounter{addr: l.Addr().String()}
	go func() {
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			go c.serve(in, u.Host)
		}
	}()
	return c
}

func (c *CancelCounter) serve(in net.Conn, target string) {
	defer in.Close()
	// The first message whole (PgBouncer refuses a startup packet in pieces).
	head := make([]byte, 8)
	if _, err := io.ReadFull(in, head); err != nil {
		return
	}
	n := binary.BigEndian.Uint32(head[0:4])
	if n == 16 && binary.BigEndian.Uint32(head[4:8]) == 80877102 {
		c.cancels.Add(1)
	}
	if n > 8 && n < 1<<20 {
		rest := make([]byte, n-8)
		if _, err := io.ReadFull(in, rest); err != nil {
			return
		}
		head = append(head, rest...)
	}
	out, err := net.Dial("tcp", target)
	if err != nil {
		return
	}
	defer out.Close()
	if _, err := out.Write(head); err != nil {
		return
	}
	go func() { _, _ = io.Copy(in, out); _ = in.Close() }()
	_, _ = io.Copy(out, in)
}

// URL returns u (a postgres:// URL) pointing at the proxy instead.
func (c *CancelCounter) URL(u string) string {
	parsed, err := url.Parse(u)
	if err != nil {
		return u
	}
	parsed.Host = c.addr
	return parsed.String()
}

// Cancels is the number of cancel requests seen so far.
func (c *CancelCounter) Cancels() int64 { return c.cancels.Load() }
