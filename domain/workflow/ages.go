package workflow

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/bettercompute/bettercompute/platform/pg"
)

// StepAge is the unfinished workflows of one kind whose current step is due:
// how many, and how long the oldest has been due on that step.
type StepAge struct {
	Kind, Step string
	Workflows  int64
	Oldest     time.Duration
}

// dueStepsSQL groups the unfinished workflows whose step is due by kind and
// step: a running or cancelling one since its step was set (updated_at), a
// sleeping or waiting one since its wake_at passed. A workflow waiting without
// a timeout is not due. Each branch walks its own index (status; wake).
const dueStepsSQL = `
SELECT kind, step, count(*), extract(epoch FROM compute_now() - min(since))::float8
FROM (
    SELECT kind, step, updated_at AS since FROM compute_workflows
    WHERE status IN ('running', 'cancelling')
    UNION ALL
    SELECT kind, step, wake_at FROM compute_workflows
    WHERE status IN ('sleeping', 'waiting') AND wake_at <= compute_now()
) d GROUP BY 1, 2`

// DueSteps reads the unfinished workflows whose step is due, by kind and step,
// with how long the oldest of each has been due: a workflow stuck on a step
// (its step keeps failing, or its job is gone) grows old here.
func DueSteps(ctx context.Context, db pg.DBTX) ([]StepAge, error) {
	rows, err := db.Query(ctx, dueStepsSQL)
	if err != nil {
		return nil, pg.Translate(fmt.Errorf("error reading the workflows' due steps: %w", err))
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (StepAge, error) {
		var a StepAge
		var secs float64
		err := r.Scan(&a.Kind, &a.Step, &a.Workflows, &secs)
		a.Oldest = time.Duration(secs * float64(time.Second))
		return a, err
	})
	return out, pg.Translate(err)
}
