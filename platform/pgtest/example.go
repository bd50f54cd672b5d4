package pgtest

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
)

// ForExample returns a fresh migrated database, as New does, for an Example
// function, which has no *testing.T to fail or to clean up after: a database
// that cannot be made panics (which fails the test binary), and every database
// it made is closed and dropped when Main ends.
//
//	func ExampleSomething() {
//		db := pgtest.ForExample().Pool
//		…
//		// Output: …
//	}
func ForExample(opts ...Options) *DB {
	return New(&exampleTB{name: fmt.Sprintf("example%d", exampleSeq.Add(1))}, opts...)
}

var (
	exampleSeq        atomic.Int64
	exampleCleanupsMu sync.Mutex
	exampleCleanups   []func()
)

// runExampleCleanups runs the cleanups of ForExample's databases, last first.
func runExampleCleanups() {
	exampleCleanupsMu.Lock()
	fs := exampleCleanups
	exampleCleanups = nil
	exampleCleanupsMu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
}

// exampleTB is the testing.TB that ForExample hands New: only the methods New
// calls are implemented (the embedded nil TB panics on any other).
type exampleTB struct {
	testing.TB
	name string
}

func (e *exampleTB) Helper()                   {}
func (e *exampleTB) Name() string              { return e.name }
func (e *exampleTB) Failed() bool              { return false }
func (e *exampleTB) Logf(string, ...any)       {}
func (e *exampleTB) Fatalf(f string, a ...any) { panic(fmt.Sprintf(f, a...)) }
func (e *exampleTB) Cleanup(f func()) {
	exampleCleanupsMu.Lock()
	defer exampleCleanupsMu.Unlock()
	exampleCleanups = append(exampleCleanups, f)
}
