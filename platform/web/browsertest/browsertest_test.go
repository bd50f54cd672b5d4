package browsertest

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeTB is the test itself, except for its name, whether it failed and its
// cleanups, which the test runs when it chooses.
type fakeTB struct {
	testing.TB
	name     string
	failed   bool
	cleanups []func()
}

func (f *fakeTB) Name() string        { return f.name }
func (f *fakeTB) Failed() bool        { return f.failed }
func (f *fakeTB) Cleanup(fn func())   { f.cleanups = append(f.cleanups, fn) }
func (f *fakeTB) Logf(string, ...any) {}
func (f *fakeTB) runCleanups() {
	for i := len(f.cleanups) - 1; i >= 0; i-- {
		f.cleanups[i]()
	}
}

// pages serves /one (plain HTML) and /two, whose script moves to /two/app
// with pushState and renders its text there, as a single-page app does.
func pages(t *testing.T) *httptest.Server {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		switch r.URL.Path {
		case "/one":
			_, _ = io.WriteString(w, `<!doctype html><title>one</title><p>page one</p>`)
		case "/two", "/two/app":
			_, _ = io.WriteString(w, `<!doctype html><title>two</title><body><script>
				history.pushState({}, "", "/two/app");
				document.body.append("page two, rendered");
			</script></body>`)
		case "/covered":
			// The link is under a transparent layer that takes clicks at its
			// point, as a row that moved under the pointer does.
			_, _ = io.WriteString(w, `<!doctype html><title>covered</title><div style="position: relative">
				<a id="target" href="/one">open page one</a>
				<div style="position: absolute; inset: 0" onclick="location = '/wrong'"></div>
			</div>`)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(ts.Close)
	return ts
}

// TestFailedTestLeavesScreenshots: a failed test's folder holds a PNG and the
// HTML of the page it failed on and of every other page it showed (a page a
// script moved to included), and the responses it received.
func TestFailedTestLeavesScreenshots(t *testing.T) {
	t.Setenv(EnvOutput, t.TempDir())
	ts := pages(t)
	f := &fakeTB{TB: t, name: "TestSomething/sub case", failed: true}
	b := New(f, time.Minute)
	b.Go(ts.URL + "/one")
	b.WaitText("page one", "page one")
	b.Go(ts.URL + "/two")
	b.WaitText("page two", "page two, rendered")
	f.runCleanups()

	dir := filepath.Join(os.Getenv(EnvOutput), "TestSomething_sub_case")
	if dir != OutputDir(f) {
		t.Fatalf("OutputDir is %s, want %s", OutputDir(f), dir)
	}
	read := func(name string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	list := read("pages.txt")
	for _, want := range []string{"01-page  " + ts.URL + "/one", "02-page  " + ts.URL + "/two", "03-current  " + ts.URL + "/two/app"} {
		if !strings.Contains(list, want) {
			t.Errorf("pages.txt lacks %q:\n%s", want, list)
		}
	}
	for name, want := range map[string]string{
		"03-current.html": "page two, rendered",
		"01-page.html":    "page one",
		"network.txt":     "200 GET " + ts.URL + "/one",
	} {
		if got := read(name); !strings.Contains(got, want) {
			t.Errorf("%s lacks %q:\n%s", name, want, got)
		}
	}
	for _, name := range []string{"01-page.png", "03-current.png"} {
		if png := read(name); !bytes.HasPrefix([]byte(png), []byte("\x89PNG\r\n\x1a\n")) {
			t.Errorf("%s is not a PNG (%d bytes)", name, len(png))
		}
	}
}

// TestClickClicksTheElementNotItsPoint: Click follows the link it names even
// where a click at the link's point would land on something else (here a
// layer over it; in River UI, a row that a live update moved there).
func TestClickClicksTheElementNotItsPoint(t *testing.T) {
	t.Setenv(EnvOutput, t.TempDir())
	ts := pages(t)
	b := New(t, time.Minute)
	b.Go(ts.URL + "/covered")
	b.Click("open page one", "#target")
	b.WaitText("page one", "page one")
	if loc := b.Location(); loc != ts.URL+"/one" {
		t.Fatalf("the click opened %s, not %s/one", loc, ts.URL)
	}
}

// TestPassedTestLeavesNothing: a passing test writes nothing, and removes an
// earlier failure's folder.
func TestPassedTestLeavesNothing(t *testing.T) {
	t.Setenv(EnvOutput, t.TempDir())
	ts := pages(t)
	f := &fakeTB{TB: t, name: "TestPassing"}
	if err := os.MkdirAll(filepath.Join(OutputDir(f), "stale"), 0o755); err != nil {
		t.Fatal(err)
	}
	b := New(f, time.Minute)
	b.Go(ts.URL + "/one")
	f.runCleanups()
	if _, err := os.Stat(OutputDir(f)); !os.IsNotExist(err) {
		t.Fatalf("a passing test left %s (%v)", OutputDir(f), err)
	}
}

// TestNoBrowserSaysHowToInstallOne: without a browser, Find's error (New's
// failure) says to install Chromium.
func TestNoBrowserSaysHowToInstallOne(t *testing.T) {
	t.Setenv(EnvChromium, "")
	t.Setenv("PATH", t.TempDir())
	_, err := Find()
	if err == nil || !strings.Contains(err.Error(), "apt-get install -y chromium") || !strings.Contains(err.Error(), EnvChromium) {
		t.Fatalf("Find without a browser: %v", err)
	}
	t.Setenv(EnvChromium, filepath.Join(t.TempDir(), "no-such-chromium"))
	if _, err := Find(); err == nil || !strings.Contains(err.Error(), EnvChromium) {
		t.Fatalf("Find with %s naming nothing: %v", EnvChromium, err)
	}
}
