// Package browsertest drives a real, headless Chromium in tests of the web
// pages (River UI and the workflows pages of serve), and leaves evidence when
// such a test fails.
//
//	b := browsertest.New(t, 2*time.Minute)
//	b.Go(base + "jobs?state=completed&kind=reconcile_resync")
//	b.WaitText("a completed reconcile_resync job", "reconcile_resync")
//	b.Click("open the job", `a[href="/jobs/42"]`)
//
// The browser is found at BETTER_COMPUTE_CHROMIUM, or as chromium,
// chromium-browser, google-chrome or google-chrome-stable on PATH. When there is
// none the test fails (`go tool task deps`, which the test task runs first,
// installs it):
// a browser test that skipped would pass without proving anything.
//
// Each Browser is one Chromium process for one test (about a second to start),
// headless, without the sandbox (the tests run as root in CI), the GPU or
// /dev/shm. It records every page its tab showed, every response it received
// (Responses) and what the pages logged. When the test fails, it writes to
// OutputDir: a full-page screenshot (PNG) and the HTML of the page the tab is
// on, then of every other page it showed (each opened again, so it is that
// page's state at the end), the list of requests with their statuses
// (network.txt) and the console (console.txt), and logs the folder.
package browsertest

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/bettercompute/bettercompute/platform/prereq"
)

// EnvChromium names the browser to use, overriding the search of PATH.
const EnvChromium = prereq.EnvChromium

// EnvOutput is the folder under which a failed test's evidence is written
// (one folder per test); by default <module root>/.better-compute/test-output.
const EnvOutput = "BETTER_COMPUTE_TEST_OUTPUT"

// WaitTimeout bounds one wait (WaitText, WaitJS): generous, since the machine
// may be loaded.
const WaitTimeout = 45 * time.Second

// Find returns the browser's path: EnvChromium, else the first of chromium,
// chromium-browser, google-chrome, google-chrome-stable on PATH (prereq.Chromium).
func Find() (string, error) { return prereq.Find(prereq.Chromium) }

// Response is one HTTP response the tab received.
type Response struct {
	Method string
	URL    string
	Status int
}

// Browser is a headless Chromium with one tab, for one test.
type Browser struct {
	tb      testing.TB
	tab     context.Context // the tab, without a deadline (evidence is taken after it)
	ctx     context.Context // the tab, bounded by New's timeout
	dir     string
	mu      sync.Mutex
	methods map[network.RequestID]string
	pending map[network.RequestID]bool // requests sent, not yet finished or failed
	quiet   time.Time                  // when pending last became empty
	resps   []Response
	pages   []string // every URL the tab's main frame showed, first visit first
	console []string
}

// New starts Chromium for tb, stopped at tb's cleanup. Every action through
// Ctx, Do and the waits must end within timeout of New. It fails tb when no
// browser is found or it does not start.
func New(tb testing.TB, timeout time.Duration) *Browser {
	tb.Helper()
	path, err := Find()
	if err != nil {
		tb.Fatal(err)
	}
	opts := append(slices.Clone(chromedp.DefaultExecAllocatorOptions[:]),
		chromedp.ExecPath(path),
		chromedp.Headless,
		chromedp.NoSandbox, // root in CI
		chromedp.DisableGPU,
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1280, 900),
	)
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	b := &Browser{tb: tb, dir: OutputDir(tb), methods: map[network.RequestID]string{}, pending: map[network.RequestID]bool{}}
	tab, cancelTab := chromedp.NewContext(alloc, chromedp.WithListener(b.record))
	// The first run starts the browser; it must not carry a deadline (the
	// deadline would stop the browser), so starting is bounded separately.
	started := make(chan error, 1)
	go func() { started <- chromedp.Do(tab) }()
	select {
	case err = <-started:
	case <-time.After(60 * time.Second):
		err = errors.New("Chromium did not start within 60 s")
	}
	if err != nil {
		cancelTab()
		cancelAlloc()
		tb.Fatalf("cannot start %s: %v", path, err)
	}
	ctx, cancelCtx := context.WithTimeout(tab, timeout)
	b.tab, b.ctx = tab, ctx
	tb.Cleanup(func() {
		cancelCtx()
		if tb.Failed() {
			b.writeEvidence()
		} else {
			_ = os.RemoveAll(b.dir) // an earlier failure's evidence, now stale
		}
		cancelTab()
		cancelAlloc()
	})
	return b
}

// OutputDir is where tb's evidence goes: EnvOutput, or the module root's
// .better-compute/test-output (git-ignored), then tb's name.
func OutputDir(tb testing.TB) string {
	base := os.Getenv(EnvOutput)
	if base == "" {
		base = filepath.Join(moduleRoot(), ".better-compute", "test-output")
	}
	return filepath.Join(base, safeName(tb.Name()))
}

// moduleRoot is the nearest directory above the working directory (a test's
// is its package's) holding go.mod, or the working directory.
func moduleRoot() string {
	wd, err := os.Getwd()
	if err != nil {
		return "."
	}
	for d := wd; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
		if filepath.Dir(d) == d {
			return wd
		}
	}
}

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

func safeName(s string) string { return strings.Trim(unsafeChars.ReplaceAllString(s, "_"), "_") }

// Ctx is the tab's context, bounded by New's timeout, for chromedp.Run and
// chromedp.Call.
func (b *Browser) Ctx() context.Context { return b.ctx }

// Do runs the actions in the tab, for at most WaitTimeout (a click waits for
// its element to appear), and fails the test on an error, naming what the
// actions were for.
func (b *Browser) Do(what string, actions ...chromedp.Action[chromedp.Void]) {
	b.tb.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, WaitTimeout)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		b.tb.Fatalf("browser: %s: %v\npage text: %s", what, err, b.textOrErr())
	}
}

// Click waits until an element matches the CSS selector, then clicks that
// element, as a user's click on it does (the page's handlers, a link's
// navigation). It clicks the element itself, not the point where it was found:
// a page that updates live (River UI's job lists put new jobs on top) can move
// its rows between the lookup and a mouse event at those coordinates, which
// would then land on another row. Use chromedp.Click through Do where the
// point itself matters.
func (b *Browser) Click(what, selector string) {
	b.tb.Helper()
	el := "document.querySelector(" + jsString(selector) + ")"
	b.WaitJS(what+": "+selector+" on the page", el)
	ctx, cancel := context.WithTimeout(b.ctx, WaitTimeout)
	defer cancel()
	clicked, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`(() => { const e = `+el+`; if (!e) return false; e.click(); return true })()`))
	if err == nil && !clicked {
		err = errors.New("the element went away before the click")
	}
	if err != nil {
		b.tb.Fatalf("browser: %s: click %s: %v\npage text: %s", what, selector, err, b.textOrErr())
	}
}

// Go opens url in the tab and waits for its load event.
func (b *Browser) Go(url string) {
	b.tb.Helper()
	b.Do("open "+url, chromedp.Navigate(url))
}

// Open opens url in the tab and returns the navigation's error (a page that
// could not load, such as one refused with 401), for tests that expect one.
func (b *Browser) Open(url string) error {
	ctx, cancel := context.WithTimeout(b.ctx, WaitTimeout)
	defer cancel()
	return chromedp.Do(ctx, chromedp.Navigate(url))
}

// Fetched is what Fetch got.
type Fetched struct {
	Status int    `json:"status"`
	Body   string `json:"body"`
}

// Fetch runs fetch(path, {method, body}) in the page, as the page's own
// script would (same origin, the tab's headers, SetBasicAuth's too), and
// returns the status and body. body "" sends none; otherwise it is sent as
// JSON. It uses credentials: "omit", so that a 401 asking for basic auth comes
// back as the response instead of waiting for a login dialog headless Chromium
// never shows.
func (b *Browser) Fetch(method, path, body string) Fetched {
	b.tb.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, WaitTimeout)
	defer cancel()
	bodyJS := "null"
	if body != "" {
		bodyJS = jsString(body)
	}
	expr := fmt.Sprintf(`fetch(%s, {method: %s, credentials: "omit", headers: {"Content-Type": "application/json"}, body: %s}).then(async r => ({status: r.status, body: await r.text()}))`,
		jsString(path), jsString(method), bodyJS)
	f, err := chromedp.Run(ctx, chromedp.Evaluate[Fetched](expr, chromedp.EvalAwaitPromise))
	if err != nil {
		b.tb.Fatalf("browser: fetch %s %s: %v", method, path, err)
	}
	return f
}

// SetBasicAuth makes every later request of the tab carry these credentials
// (an Authorization header), as a browser does once its user typed them.
func (b *Browser) SetBasicAuth(user, password string) {
	b.tb.Helper()
	header := "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+password))
	if _, err := chromedp.Call(b.ctx, network.SetExtraHTTPHeaders,
		network.SetExtraHTTPHeadersParams{Headers: network.Headers{"Authorization": header}}); err != nil {
		b.tb.Fatalf("browser: set the Authorization header: %v", err)
	}
}

// Text is the page's visible text (document.body.innerText).
func (b *Browser) Text() string {
	b.tb.Helper()
	s, err := chromedp.Run(b.ctx, chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`))
	if err != nil {
		b.tb.Fatalf("browser: read the page's text: %v", err)
	}
	return s
}

// HTML is the page's whole DOM as HTML.
func (b *Browser) HTML() string {
	b.tb.Helper()
	s, err := chromedp.Run(b.ctx, chromedp.Evaluate[string](`document.documentElement ? document.documentElement.outerHTML : ""`))
	if err != nil {
		b.tb.Fatalf("browser: read the page's HTML: %v", err)
	}
	return s
}

func (b *Browser) textOrErr() string {
	ctx, cancel := context.WithTimeout(b.tab, 5*time.Second)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`))
	if err != nil {
		return "(cannot read it: " + err.Error() + ")"
	}
	if len(s) > 2000 {
		s = s[:2000] + "…"
	}
	return s
}

// WaitJS waits until the JavaScript expression is truthy in the page the tab
// shows, evaluated every 100 ms for at most WaitTimeout (across navigations:
// an evaluation that fails because the page is changing is tried again), and
// fails the test naming what was awaited, the last error and what the page
// showed.
func (b *Browser) WaitJS(what, expr string) {
	b.tb.Helper()
	deadline := time.Now().Add(WaitTimeout)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool]("!!("+expr+")"))
		cancel()
		if err == nil && ok {
			return
		}
		if err != nil {
			last = err
		}
		if b.ctx.Err() != nil || time.Now().After(deadline) {
			b.tb.Fatalf("browser: waited %s for %s (%s), last error: %v\nat %s\npage text: %s",
				WaitTimeout, what, expr, last, b.location(), b.textOrErr())
		}
		select {
		case <-tick.C:
		case <-b.ctx.Done():
		}
	}
}

// WaitText waits until the page's visible text contains every one of texts.
func (b *Browser) WaitText(what string, texts ...string) {
	b.tb.Helper()
	conds := make([]string, len(texts))
	for i, t := range texts {
		conds[i] = fmt.Sprintf("document.body.innerText.includes(%s)", jsString(t))
	}
	b.WaitJS(what, "document.body && "+strings.Join(conds, " && "))
}

func (b *Browser) location() string {
	ctx, cancel := context.WithTimeout(b.tab, 5*time.Second)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Location())
	if err != nil {
		return "(unknown location: " + err.Error() + ")"
	}
	return s
}

// Location is the tab's URL.
func (b *Browser) Location() string {
	b.tb.Helper()
	s, err := chromedp.Run(b.ctx, chromedp.Location())
	if err != nil {
		b.tb.Fatalf("browser: read the location: %v", err)
	}
	return s
}

// Responses are the responses the tab received so far, in order.
func (b *Browser) Responses() []Response {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]Response(nil), b.resps...)
}

// ResponsesTo are the responses whose URL contains part, in order.
func (b *Browser) ResponsesTo(part string) []Response {
	var out []Response
	for _, r := range b.Responses() {
		if strings.Contains(r.URL, part) {
			out = append(out, r)
		}
	}
	return out
}

// Pages are the URLs the tab's main frame showed, each once, first visit first.
func (b *Browser) Pages() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.pages...)
}

// record is the tab's event listener: it runs on the tab's reading goroutine,
// so it only appends under the lock.
func (b *Browser) record(ev any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch e := ev.(type) {
	case *network.EventRequestWillBeSent:
		if e.Request != nil {
			b.methods[e.RequestID] = e.Request.Method
		}
		b.pending[e.RequestID] = true
	case *network.EventLoadingFinished:
		b.done(e.RequestID)
	case *network.EventResponseReceived:
		if e.Response != nil {
			b.resps = append(b.resps, Response{Method: b.methods[e.RequestID], URL: e.Response.URL, Status: int(e.Response.Status)})
		}
	case *network.EventLoadingFailed:
		b.done(e.RequestID)
		b.console = append(b.console, fmt.Sprintf("network: %s request %s failed: %s", b.methods[e.RequestID], e.RequestID, e.ErrorText))
	case *page.EventFrameNavigated:
		if e.Frame != nil && e.Frame.ParentID == "" {
			b.visit(e.Frame.URL + e.Frame.URLFragment)
		}
	case *page.EventNavigatedWithinDocument:
		b.visit(e.URL)
	case *runtime.EventConsoleAPICalled:
		var parts []string
		for _, a := range e.Args {
			if a.Description != "" {
				parts = append(parts, a.Description)
			} else {
				parts = append(parts, strings.Trim(string(a.Value), `"`))
			}
		}
		b.console = append(b.console, fmt.Sprintf("console.%s: %s", e.Type, strings.Join(parts, " ")))
	case *runtime.EventExceptionThrown:
		if d := e.ExceptionDetails; d != nil {
			msg := d.Text
			if d.Exception != nil && d.Exception.Description != "" {
				msg += " " + d.Exception.Description
			}
			b.console = append(b.console, "exception: "+msg)
		}
	}
}

func (b *Browser) done(id network.RequestID) {
	if b.pending[id] {
		delete(b.pending, id)
		if len(b.pending) == 0 {
			b.quiet = time.Now()
		}
	}
}

// waitIdle waits, at most max, until the tab has had no request in flight for
// 300 ms.
func (b *Browser) waitIdle(max time.Duration) {
	deadline := time.Now().Add(max)
	for time.Now().Before(deadline) {
		b.mu.Lock()
		idle := len(b.pending) == 0 && time.Since(b.quiet) >= 300*time.Millisecond
		b.mu.Unlock()
		if idle {
			return
		}
		time.Sleep(50 * time.Millisecond) // polling the recorded events
	}
}

func (b *Browser) visit(url string) {
	if url == "" || url == "about:blank" {
		return
	}
	for _, p := range b.pages {
		if p == url {
			return
		}
	}
	b.pages = append(b.pages, url)
}

// writeEvidence writes the failed test's screenshots, HTML, network and
// console to b.dir, replacing an earlier run's.
func (b *Browser) writeEvidence() {
	tb := b.tb
	if err := os.RemoveAll(b.dir); err != nil {
		tb.Logf("browser: cannot clear %s: %v", b.dir, err)
	}
	if err := os.MkdirAll(b.dir, 0o755); err != nil {
		tb.Logf("browser: cannot write the evidence to %s: %v", b.dir, err)
		return
	}
	var notes []string
	shoot := func(n int, label string) {
		ctx, cancel := context.WithTimeout(b.tab, 20*time.Second)
		defer cancel()
		name := fmt.Sprintf("%02d-%s", n, label)
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err == nil {
			err = os.WriteFile(filepath.Join(b.dir, name+".png"), png, 0o644)
		}
		if err != nil {
			notes = append(notes, name+".png: "+err.Error())
		}
		html, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.documentElement ? document.documentElement.outerHTML : ""`))
		if err == nil {
			err = os.WriteFile(filepath.Join(b.dir, name+".html"), []byte(html), 0o644)
		}
		if err != nil {
			notes = append(notes, name+".html: "+err.Error())
		}
	}
	current := b.location()
	pages := b.Pages()
	index := func(u string) int {
		for i, p := range pages {
			if p == u {
				return i + 1
			}
		}
		return 0
	}
	list := []string{fmt.Sprintf("%02d-current  %s  (as it was when the test failed)", index(current), current)}
	shoot(index(current), "current")
	for i, p := range pages {
		if p == current || i >= 30 {
			continue
		}
		ctx, cancel := context.WithTimeout(b.tab, 20*time.Second)
		err := chromedp.Do(ctx, chromedp.Navigate(p))
		cancel()
		if err != nil {
			notes = append(notes, p+": "+err.Error())
			continue
		}
		// A single-page app renders after its load event, from what it fetches.
		b.waitIdle(5 * time.Second)
		shoot(i+1, "page")
		list = append(list, fmt.Sprintf("%02d-page  %s  (opened again after the failure)", i+1, p))
	}
	list = append(list, notes...)
	write := func(name string, lines []string) {
		if err := os.WriteFile(filepath.Join(b.dir, name), []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
			tb.Logf("browser: %s: %v", name, err)
		}
	}
	write("pages.txt", list)
	var net []string
	for _, r := range b.Responses() {
		net = append(net, fmt.Sprintf("%d %s %s", r.Status, r.Method, r.URL))
	}
	write("network.txt", net)
	b.mu.Lock()
	console := append([]string(nil), b.console...)
	b.mu.Unlock()
	write("console.txt", console)
	tb.Logf("browser: screenshots and HTML of the %d page(s) this test visited are in %s", len(pages), b.dir)
}

// jsString is s as a JavaScript string literal.
func jsString(s string) string {
	b, _ := json.Marshal(s) // a string always marshals
	return string(b)
}
