package cli_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/domain/workflow"
	"github.com/bettercompute/bettercompute/platform/web/browsertest"
)

// TestConfirmLinkInABrowser: a person opens a confirmation link in Chromium,
// sees what will happen (nothing has yet), clicks Confirm (the form posts
// under the page's Content-Security-Policy), sees "Confirmed", and the
// workflow resumes; reloading the link then says it was used.
func TestConfirmLinkInABrowser(t *testing.T) {
	t.Parallel()
	db, env := wfEnv(t)
	s := startPublic(t, env, "serve")
	wfWorker(t, db)
	id, tok := awaitingOrder(t, db, "o-browser", time.Hour)
	wfWait(t, db, id, workflow.Waiting)

	b := browsertest.New(t, 90*time.Second)
	link := s.pub + "confirm/" + string(tok)
	b.Go(link)
	b.WaitText("the confirmation page", "Confirm?", "paid", id, "Nothing has happened yet")
	require.Equal(t, 0, signalCount(t, db, id), "opening the link stored a signal")

	b.Click("the Confirm button", "#confirm")
	b.WaitText("the confirmed page", "Confirmed: paid was sent to "+id)
	require.Equal(t, 1, signalCount(t, db, id))
	out := wfWait(t, db, id, workflow.Completed)
	require.JSONEq(t, `{"order":"o-browser","paid":true,"amount":30}`, string(out.Result))

	b.Go(link)
	b.WaitText("the used link's page", "Already confirmed", "already used")
	require.Equal(t, 1, signalCount(t, db, id))
}
