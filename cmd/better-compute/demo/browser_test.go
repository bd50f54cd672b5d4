package demo

import (
	"context"
	"errors"
	"net"
	"net/http"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/bettercompute/bettercompute/cmd/better-compute/cli"
	"github.com/bettercompute/bettercompute/cmd/better-compute/cli/clitest"
	"github.com/bettercompute/bettercompute/domain/workflow"
	"github.com/bettercompute/bettercompute/domain/workflow/confirmation"
	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/platform/web/browsertest"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

// The browser tests: River UI and the workflows pages of `dev` (serve and a
// worker in one process) and of `serve`, in a real headless Chromium
// (platform/web/browsertest), after the demo application's work of every kind
// has run. A failed test leaves screenshots in .better-compute/test-output.

// browserFailMessage is the error every browserFail job fails with.
const browserFailMessage = "browser test: the printer is on fire (error 4711)"

type browserFailArgs struct {
	Key string `json:"key"`
}

func (browserFailArgs) Kind() string { return "browser_test_fail" }

// browserFailWorker fails every job, so River records browserFailMessage.
type browserFailWorker struct {
	river.WorkerDefaults[browserFailArgs]
}

func (browserFailWorker) Work(context.Context, *river.Job[browserFailArgs]) error {
	return errors.New(browserFailMessage)
}

// browserIdleArgs is a job in a queue nobody works: it stays available, so
// River UI offers to cancel it.
type browserIdleArgs struct{}

func (browserIdleArgs) Kind() string { return "browser_test_idle" }

const browserIdleQueue = "browser_test_idle"

// browserTestModule registers the failing job's worker.
func browserTestModule() cli.Module {
	return cli.Module{
		Name: "browser_test",
		Register: func(r *workers.Registry) error {
			return workers.AddWorker(r, river.Worker[browserFailArgs](browserFailWorker{}))
		},
	}
}

// browserApp is the demo application and the browser test's module.
func browserApp() cli.App {
	return cli.App{Modules: append(Modules(), browserTestModule())}
}

var riverUIURL = regexp.MustCompile(`River UI: (http://\S+/)`)

// runCommand runs `better-compute <command>` of browserApp in-process on db
// with env added, until the test ends, and returns the URL it serves on.
func runCommand(t *testing.T, db *pgtest.DB, command string, env ...string) string {
	t.Helper()
	environ := append([]string{"BETTER_COMPUTE_DATABASE_URL=" + db.URL, "BETTER_COMPUTE_LOG_LEVEL=warn",
		"BETTER_COMPUTE_LISTEN=127.0.0.1:0"}, env...)
	stdout, stderr := &clitest.Buffer{}, &clitest.Buffer{}
	ctx, cancel := context.WithCancel(context.Background())
	code := make(chan int, 1)
	go func() {
		code <- cli.Run(ctx, browserApp(), []string{command}, cli.Env{Stdout: stdout, Stderr: stderr, Environ: clitest.WithStatementCache(environ)})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case c := <-code:
			if c != 0 {
				t.Errorf("%s exited with %d: %s", command, c, stderr.String())
			}
		case <-time.After(60 * time.Second):
			t.Errorf("%s did not stop within 60 s", command)
		}
	})
	var url string
	workertest.WaitFor(t, 60*time.Second, command+" to print River UI's URL", func() bool {
		if m := riverUIURL.FindStringSubmatch(stdout.String()); m != nil {
			url = m[1]
			return true
		}
		select {
		case c := <-code:
			code <- c
			t.Fatalf("%s exited with %d before serving: %s", command, c, stderr.String())
		default:
		}
		return false
	})
	return url
}

// insertBrowserJobs inserts the job that fails (once: it is discarded with
// browserFailMessage) and the idle one; it returns their ids.
func insertBrowserJobs(t *testing.T, db *pg.Pool) (failing, idle int64) {
	t.Helper()
	err := pg.InTx(context.Background(), db, func(ctx context.Context, tx pgx.Tx) error {
		r, err := workers.InsertForKeyTx(ctx, tx, "browser-fail", browserFailArgs{Key: "browser-fail"}, &river.InsertOpts{MaxAttempts: 1})
		if err != nil {
			return err
		}
		failing = r.Job.ID
		r, err = jobs.InsertTx(ctx, tx, browserIdleArgs{}, &river.InsertOpts{Queue: browserIdleQueue})
		if err != nil {
			return err
		}
		idle = r.Job.ID
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return failing, idle
}

// browserKinds are the job kinds the demo application (and the test's
// failing job) produce within seconds of dev's start, each with a state its
// jobs stay listed in: completed (final), scheduled for the expiry jobs (each
// new hold and batch schedules one), discarded for the failing job. The
// built-in periodic jobs of long periods (capacity_expiry_sweep,
// outbox_retention, workflow_prune) and reconcile (a key retried on its own
// after its batch failed) do not run in that time; a reconcile batch that
// commits writes no River job.
func browserKinds() [][2]string {
	return [][2]string{
		{jobs.ResyncKind, "completed"},
		{jobs.WorkflowStepKind, "completed"},
		{jobs.OutboxDeliverKind, "completed"},
		{jobs.OutboxDispatchKind, "completed"},
		{jobs.BackfillKindPrefix + DemoBackfill, "completed"},
		{jobs.CapacityHoldExpiryKind, "scheduled"},
		{jobs.QuorumApplyKind, "completed"},
		{jobs.QuorumExpiryKind, "scheduled"},
		{browserFailArgs{}.Kind(), "discarded"},
	}
}

// missingKinds are the kinds of browserKinds with no job in their state yet.
func missingKinds(t *testing.T, db *pgtest.DB) []string {
	t.Helper()
	var missing []string
	for _, ks := range browserKinds() {
		if db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = $1 AND state = $2::river_job_state`, ks[0], ks[1]) == 0 {
			missing = append(missing, ks[1]+" "+ks[0])
		}
	}
	return missing
}

// jobRow is what the tests compare of a river_job row.
type jobRow struct {
	State      string
	Attempt    int
	Finalized  *time.Time
	ErrorCount int
}

func readJob(t *testing.T, db *pgtest.DB, id int64) jobRow {
	t.Helper()
	var r jobRow
	err := db.QueryRow(context.Background(), `SELECT state::text, attempt, finalized_at, coalesce(array_length(errors, 1), 0)
		FROM river_job WHERE id = $1`, id).Scan(&r.State, &r.Attempt, &r.Finalized, &r.ErrorCount)
	if err != nil {
		t.Fatalf("job %d: %v", id, err)
	}
	return r
}

// jobLinksJS lists River UI's links to jobs on the page: [href, text].
const jobLinksJS = `[...document.querySelectorAll('a[href^="/jobs/"]')]
	.filter(a => /^\/jobs\/\d+$/.test(a.getAttribute('href')))
	.map(a => [a.getAttribute('href').slice(6), a.innerText.trim()])`

func jobLinks(t *testing.T, b *browsertest.Browser) [][2]string {
	t.Helper()
	links, err := chromedp.Run(b.Ctx(), chromedp.Evaluate[[][2]string](jobLinksJS))
	if err != nil {
		t.Fatalf("reading the job links: %v", err)
	}
	return links
}

// TestBrowser runs the demo application's dev (River UI, the workflows pages
// and a worker in one process) until work of every kind has run, then checks
// its pages in Chromium, and those of a serve with credentials and of a
// read-only serve on the same database.
func TestBrowser(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	failing, idle := insertBrowserJobs(t, db.Pool)
	// The public listener on a port of its own, not dev's default, which
	// another test's dev may hold: the mailbox's links name it.
	public := "http://" + freeAddr(t) + "/"
	dev := runCommand(t, db, "dev", "BETTER_COMPUTE_POLL_INTERVAL=20ms", "BETTER_COMPUTE_RESYNC_INTERVAL=1s",
		"BETTER_COMPUTE_PUBLIC_LISTEN="+strings.TrimSuffix(strings.TrimPrefix(public, "http://"), "/"))

	start := time.Now()
	deadline := time.Now().Add(90 * time.Second)
	for {
		missing := missingKinds(t, db)
		if db.MustCount(t, `SELECT count(*) FROM compute_workflows WHERE status = 'completed'`) == 0 {
			missing = append(missing, "a completed workflow")
		}
		if db.MustCount(t, `SELECT count(*) FROM demo_workflow_mailbox`) == 0 {
			missing = append(missing, "a payment link in the demo mailbox")
		}
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited 90 s for the demo's work of every kind; still none of: %v", missing)
		}
		time.Sleep(100 * time.Millisecond) // polling the database
	}
	t.Logf("the demo's work of every kind ran within %s", time.Since(start).Round(time.Millisecond))

	t.Run("RiverUIListsEveryKind", func(t *testing.T) {
		t.Parallel()
		b := browsertest.New(t, 2*time.Minute)
		for _, ks := range browserKinds() {
			kind, state := ks[0], ks[1]
			b.Go(dev + "jobs?state=" + state + "&kind=" + kind)
			b.WaitJS("River UI's list of "+state+" "+kind+" jobs", `(() => { const l = `+jobLinksJS+`;
				return l.length > 0 && l.every(([id, text]) => text === `+strconv.Quote(kind)+`) })()`)
			for _, l := range jobLinks(t, b) {
				id, err := strconv.ParseInt(l[0], 10, 64)
				if err != nil {
					t.Fatalf("link %v: %v", l, err)
				}
				if n := db.MustCount(t, `SELECT count(*) FROM river_job WHERE id = $1 AND kind = $2`, id, kind); n != 1 {
					t.Errorf("River UI lists job %d as %s; the database has no such job", id, kind)
				}
			}
		}
		// A job's page, opened from the list as a user does.
		b.Go(dev + "jobs?state=completed&kind=" + jobs.WorkflowStepKind)
		b.WaitJS("a completed workflow_step job listed", `(`+jobLinksJS+`).length > 0`)
		id := jobLinks(t, b)[0][0]
		b.Click("open job "+id+" from the list", `a[href="/jobs/`+id+`"]`)
		b.WaitText("job "+id+"'s page", idLine(id), jobs.WorkflowStepKind, "Completed", "Attempts")
		if loc := b.Location(); !strings.HasSuffix(loc, "/jobs/"+id) {
			t.Errorf("the job's page is at %s", loc)
		}
	})

	t.Run("RiverUIShowsAFailedJobsError", func(t *testing.T) {
		t.Parallel()
		b := browsertest.New(t, 2*time.Minute)
		id := strconv.FormatInt(failing, 10)
		b.Go(dev + "jobs?state=discarded&kind=" + browserFailArgs{}.Kind())
		b.WaitJS("the discarded job listed", `(`+jobLinksJS+`).some(([id]) => id === `+strconv.Quote(id)+`)`)
		b.Click("open the failed job", `a[href="/jobs/`+id+`"]`)
		b.WaitText("the failed job's page with its error", idLine(id), "Discarded", "Failed", "Attempt 1", browserFailMessage)
		if loc := b.Location(); !strings.HasSuffix(loc, "/jobs/"+id) {
			t.Errorf("the job's page is at %s", loc)
		}
	})

	t.Run("WorkflowsPageFiltersAndLinksStepsToRiverUI", func(t *testing.T) {
		t.Parallel()
		b := browsertest.New(t, 2*time.Minute)
		completed, err := workflow.List(context.Background(), db.Pool, workflow.ListOpts{Status: workflow.Completed, Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}

		// The list: every workflow of the database (newest first), some of them
		// not completed.
		b.Go(dev + "workflows")
		b.WaitText("the workflows page", "Workflows", OrderKind)
		rows := workflowRows(t, b)
		listed := map[string]string{}
		for _, r := range rows {
			listed[r[0]] = r[1]
		}
		for _, w := range completed {
			if listed[w.ID] != string(workflow.Completed) {
				t.Errorf("completed workflow %s is listed as %q", w.ID, listed[w.ID])
			}
		}
		if !slices.ContainsFunc(rows, func(r [2]string) bool { return r[1] != string(workflow.Completed) }) {
			t.Fatalf("the unfiltered list shows only completed workflows (%v): the filter below would prove nothing", rows)
		}

		// The status filter, as a user sets it.
		b.Do("filter by status completed",
			chromedp.SetValue(chromedp.CSS(`select[name="status"]`), string(workflow.Completed)),
			chromedp.Click(chromedp.CSS(`form button[type="submit"]`)))
		b.WaitJS("the filtered list", `location.search.includes("status=completed") && document.readyState === "complete"`)
		b.WaitText("the filtered list", "Workflows")
		rows = workflowRows(t, b)
		if len(rows) == 0 {
			t.Fatal("the filtered list is empty")
		}
		listed = map[string]string{}
		for _, r := range rows {
			listed[r[0]] = r[1]
			if r[1] != string(workflow.Completed) {
				t.Errorf("the list filtered by status completed shows %s, %s", r[0], r[1])
			}
		}
		for _, w := range completed {
			if _, ok := listed[w.ID]; !ok {
				t.Errorf("completed workflow %s is missing from the filtered list", w.ID)
			}
		}

		// One workflow: its timeline has a row per committed step, each linked
		// to that step's River job.
		id := rows[len(rows)-1][0]
		b.Click("open workflow "+id, `td a[href="/workflows/`+id+`"]`)
		b.WaitText("workflow "+id+"'s page", id, "Timeline")
		history, err := workflow.History(context.Background(), db.Pool, id)
		if err != nil {
			t.Fatal(err)
		}
		timeline, err := chromedp.Run(b.Ctx(), chromedp.Evaluate[[][3]string](`[...document.querySelectorAll('h2 + table tbody tr')].map(tr => {
			const a = tr.cells[5].querySelector('a');
			return [tr.cells[0].innerText.trim(), tr.cells[1].innerText.trim(), a ? a.getAttribute('href') : ''];
		})`))
		if err != nil {
			t.Fatal(err)
		}
		if len(timeline) != len(history) || len(history) == 0 {
			t.Fatalf("the timeline shows %v; the history has %d rows", timeline, len(history))
		}
		for i, h := range history {
			want := [3]string{strconv.FormatInt(h.Seq, 10), h.Step, ""}
			if h.JobID != nil {
				want[2] = "/jobs/" + strconv.FormatInt(*h.JobID, 10)
			}
			if timeline[i] != want {
				t.Errorf("timeline row %d: %v, want %v", i, timeline[i], want)
			}
		}
		// Each step's link, followed: River UI shows that job.
		for _, h := range history {
			if h.JobID == nil {
				continue
			}
			jobID := strconv.FormatInt(*h.JobID, 10)
			b.Go(dev + "workflows/" + id)
			b.WaitText("workflow "+id+"'s page", "Timeline")
			b.Click("follow step "+h.Step+"'s link", `h2 + table a[href="/jobs/`+jobID+`"]`)
			b.WaitText("River UI's page of step "+h.Step+"'s job", idLine(jobID), jobs.WorkflowStepKind, `"`+id+`"`)
			if loc := b.Location(); loc != dev+"jobs/"+jobID {
				t.Errorf("step %s's link led to %s", h.Step, loc)
			}
		}
	})

	t.Run("MailboxLinksOpenTheConfirmationPage", func(t *testing.T) {
		t.Parallel()
		b := browsertest.New(t, 2*time.Minute)
		b.Go(dev + "demo/mailbox")
		b.WaitText("the demo mailbox", "Demo mailbox", "Payment link")
		links, err := chromedp.Run(b.Ctx(), chromedp.Evaluate[[]string](`[...document.querySelectorAll('a.pay')].map(a => a.href)`))
		if err != nil {
			t.Fatal(err)
		}
		if len(links) == 0 || len(links) > mailboxPageSize {
			t.Fatalf("the mailbox lists %d links", len(links))
		}
		// Each link is a mail's, under the public listener's URL.
		used := ""
		for _, l := range links {
			tok, ok := strings.CutPrefix(l, public+"confirm/")
			if !ok {
				t.Errorf("a payment link is not under the public listener's URL %s: %.40s…", public, l)
				continue
			}
			if n := db.MustCount(t, `SELECT count(*) FROM demo_workflow_mailbox WHERE link_token = $1`, tok); n != 1 {
				t.Errorf("the mailbox page lists a link (%.40s…) no mail holds", l)
			}
			// Peek changes nothing: a link a demo customer confirmed stays so.
			if _, err := confirmation.Peek(context.Background(), db.Pool, tok); used == "" && errors.Is(err, confirmation.ErrAlreadyConfirmed) {
				used = l
			}
		}
		if used == "" {
			t.Fatal("no link on the mailbox page was confirmed by the demo's customers")
		}
		// Clicked, a paid order's link opens dev's public confirmation page,
		// which knows it: the link reaches the listener that serves it.
		b.Click("a paid order's payment link", `a.pay[href="`+used+`"]`)
		b.WaitText("the confirmation page of a used link", "Already confirmed", "already used")
		if loc := b.Location(); loc != used {
			t.Errorf("the link led to %.40s…", loc)
		}
	})

	t.Run("CredentialsGuardEverything", func(t *testing.T) {
		t.Parallel()
		const user, password = "ann", "correct horse battery"
		srv := runCommand(t, db, "serve", "BETTER_COMPUTE_AUTH_USER="+user, "BETTER_COMPUTE_AUTH_PASSWORD="+password)
		b := browsertest.New(t, 2*time.Minute)
		idleID := strconv.FormatInt(idle, 10)

		// Without credentials: the page is refused, nothing of River UI loads.
		page := srv + "jobs?state=available"
		if err := b.Open(page); err == nil {
			t.Fatalf("River UI loaded without credentials: %s", b.Text())
		}
		if got := statuses(b.ResponsesTo(page)); !slices.Equal(got, []int{http.StatusUnauthorized}) {
			t.Errorf("River UI's page without credentials answered %v, want [401]", got)
		}
		if strings.Contains(b.HTML(), browserIdleArgs{}.Kind()) {
			t.Errorf("job data in the page without credentials")
		}
		// River UI's API and the workflows pages, fetched from a page of the
		// same origin (/healthz needs no credentials), as River UI's script
		// would: 401 with no job data, the cancel refused too.
		b.Go(srv + "healthz")
		for _, r := range [][3]string{
			{"GET", "/api/jobs?state=available", ""},
			{"GET", "/api/jobs/" + idleID, ""},
			{"GET", "/api/queues", ""},
			{"GET", "/api/states", ""},
			{"POST", "/api/jobs/cancel", `{"ids":["` + idleID + `"]}`},
			{"GET", "/workflows", ""},
			{"GET", "/v1/workflows", ""},
			{"GET", "/demo/mailbox", ""},
		} {
			f := b.Fetch(r[0], r[1], r[2])
			if f.Status != http.StatusUnauthorized || strings.Contains(f.Body, browserIdleArgs{}.Kind()) || strings.Contains(f.Body, OrderKind) ||
				strings.Contains(f.Body, "/confirm/") {
				t.Errorf("%s %s without credentials: %d %s", r[0], r[1], f.Status, f.Body)
			}
		}
		// A wrong password is refused alike.
		b.SetBasicAuth(user, password+"x")
		if err := b.Open(page); err == nil {
			t.Fatalf("River UI loaded with a wrong password: %s", b.Text())
		}
		if got := readJob(t, db, idle); got.State != "available" {
			t.Fatalf("the idle job is %s after the refused cancel", got.State)
		}

		// With them, everything loads: River UI lists the idle job, every API
		// call it made succeeded, and the workflows page lists workflows.
		b.SetBasicAuth(user, password)
		before := len(b.Responses())
		b.Go(page)
		b.WaitJS("River UI's list with the idle job", `(`+jobLinksJS+`).some(([id]) => id === `+strconv.Quote(idleID)+`)`)
		api := 0
		for _, r := range b.Responses()[before:] {
			if strings.HasPrefix(r.URL, srv) {
				if r.Status != http.StatusOK && r.Status != http.StatusNotModified {
					t.Errorf("with credentials %s %s answered %d", r.Method, r.URL, r.Status)
				}
				if strings.Contains(r.URL, "/api/") {
					api++
				}
			}
		}
		if api == 0 {
			t.Errorf("River UI made no API request")
		}
		b.Go(srv + "workflows")
		b.WaitText("the workflows page", "Workflows", OrderKind)
		b.Go(srv + "demo/mailbox")
		b.WaitText("the demo mailbox", "Demo mailbox", "Payment link")
	})

	t.Run("ReadOnlyRefusesActions", func(t *testing.T) {
		t.Parallel()
		srv := runCommand(t, db, "serve", "BETTER_COMPUTE_READ_ONLY=true")
		b := browsertest.New(t, 2*time.Minute)
		failedBefore, idleBefore := readJob(t, db, failing), readJob(t, db, idle)
		const refused = "read-only mode (BETTER_COMPUTE_READ_ONLY=true)"
		button := func(text string) chromedp.Action[chromedp.Void] {
			return chromedp.Click(chromedp.Search(`//button[normalize-space()="` + text + `"]`))
		}

		// Retry the discarded job: River UI says the retry failed, with our message.
		b.Go(srv + "jobs/" + strconv.FormatInt(failing, 10))
		b.WaitText("the failed job's page", idLine(strconv.FormatInt(failing, 10)), "Discarded")
		b.Do("click Retry", button("Retry"))
		b.WaitText("River UI's notice that the retry failed", "Job retry failed", refused+": POST /api/jobs/retry is refused")
		requireRefused(t, b, srv+"api/jobs/retry")

		// Cancel the idle job: River UI's job page shows its error, and ours.
		b.Go(srv + "jobs/" + strconv.FormatInt(idle, 10))
		b.WaitText("the idle job's page", idLine(strconv.FormatInt(idle, 10)), "Available")
		b.Do("click Cancel", button("Cancel"))
		b.WaitText("River UI's error page", "Something went wrong!")
		b.Do("click Show Error", button("Show Error"))
		b.WaitText("the refusal in River UI's error", refused+": POST /api/jobs/cancel is refused")
		requireRefused(t, b, srv+"api/jobs/cancel")

		// Delete the discarded job, confirming in River UI's dialog.
		b.Go(srv + "jobs/" + strconv.FormatInt(failing, 10))
		b.WaitText("the failed job's page", idLine(strconv.FormatInt(failing, 10)), "Discarded")
		b.Do("click Delete", button("Delete"))
		b.WaitText("River UI's delete dialog", "Delete job")
		b.Do("confirm the delete", button("Delete job"))
		b.WaitText("River UI's error page", "Something went wrong!")
		b.Do("click Show Error", button("Show Error"))
		b.WaitText("the refusal in River UI's error", refused+": POST /api/jobs/delete is refused")
		requireRefused(t, b, srv+"api/jobs/delete")

		if got := readJob(t, db, failing); !reflect.DeepEqual(got, failedBefore) {
			t.Errorf("the failed job changed in read-only mode: %+v, was %+v", got, failedBefore)
		}
		if got := readJob(t, db, idle); !reflect.DeepEqual(got, idleBefore) {
			t.Errorf("the idle job changed in read-only mode: %+v, was %+v", got, idleBefore)
		}
	})
}

// freeAddr is a loopback address with a port that was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// idLine is how River UI's page of job id names it, in its text ("ID: 12"
// on a line of its own, so job 1 is not job 12).
func idLine(id string) string { return "ID: " + id + "\n" }

// workflowRows are the workflows page's rows: [id, status].
func workflowRows(t *testing.T, b *browsertest.Browser) [][2]string {
	t.Helper()
	rows, err := chromedp.Run(b.Ctx(), chromedp.Evaluate[[][2]string](`(() => {
		const status = [...document.querySelectorAll('table thead th')].findIndex(th => th.innerText.trim() === 'Status');
		return [...document.querySelectorAll('table tbody tr')]
			.map(tr => [tr.cells[0].innerText.trim(), status < 0 ? '' : tr.cells[status].innerText.trim()]);
	})()`))
	if err != nil {
		t.Fatalf("reading the workflows list: %v", err)
	}
	return rows
}

func statuses(rs []browsertest.Response) []int {
	var out []int
	for _, r := range rs {
		out = append(out, r.Status)
	}
	return out
}

// requireRefused: the browser posted to url once, and got 403.
func requireRefused(t *testing.T, b *browsertest.Browser, url string) {
	t.Helper()
	got := b.ResponsesTo(url)
	if len(got) != 1 || got[0].Method != http.MethodPost || got[0].Status != http.StatusForbidden {
		t.Errorf("River UI's requests to %s: %+v, want one POST answered 403", url, got)
	}
}
