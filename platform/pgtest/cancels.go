package pgtest

import (
	"encoding/binary"
	"io"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
)

// CancelCounter is a TCP proxy in front of a PostgreSQL server (or a pooler)
// that counts the cancel requests passing through it: connections whose first
// message is the 16-byte CancelRequest (code 80877102). It can also play an
// outage (Down, Up): the server gone for its clients only, not for other tests.
type CancelCounter struct {
	addr    string
	cancels atomic.Int64
	dials   atomic.Int64

	mu    sync.Mutex
	down  bool
	conns map[net.Conn]bool
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
	c := &CancelCounter{addr: l.Addr().String(), conns: map[net.Conn]bool{}}
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
	c.dials.Add(1)
	if !c.track(in) {
		return // down: the connection is refused
	}
	defer c.untrack(in)
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
	if !c.track(out) {
		return
	}
	defer c.untrack(out)
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

// Dials is the number of connections clients opened to the proxy so far.
func (c *CancelCounter) Dials() int64 { return c.dials.Load() }

// Down plays an outage: every connection through the proxy is cut, and new ones
// are closed at once, until Up.
func (c *CancelCounter) Down() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.down = true
	for conn := range c.conns {
		_ = conn.Close()
	}
}

// Up ends the outage: connections go through again.
func (c *CancelCounter) Up() {
	c.mu.Lock()
	c.down = false
	c.mu.Unlock()
}

func (c *CancelCounter) track(conn net.Conn) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.down {
		return false
	}
	c.conns[conn] = true
	return true
}

func (c *CancelCounter) untrack(conn net.Conn) {
	c.mu.Lock()
	delete(c.conns, conn)
	c.mu.Unlock()
}
