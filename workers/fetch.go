package workers

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river/riverdriver"
	"github.com/riverqueue/river/rivershared/uniquestates"
	"github.com/riverqueue/river/rivertype"

	"github.com/bettercompute/bettercompute/jobs"
)

// The fetch of a shard queue's jobs is River's, but for tenants' jobs: where
// tenants' jobs are available, River's producer takes them round-robin across
// tenants, never more of a tenant's than its limit allows across every
// process, and none of a suspended tenant's (compute_fetch_jobs,
// migrations/tenancy/0002_tenant_work.sql). Where none is, the statement is
// River's own. Other queues (maintenance) are fetched by River as ever.

// fetchSQL calls compute_fetch_jobs and reads the river_job columns River's
// driver reads.
const fetchSQL = `SELECT id, args, attempt, attempted_at, attempted_by, created_at, errors, finalized_at, kind,
       max_attempts, metadata, priority, queue, state, scheduled_at, tags, unique_key, unique_states::int
FROM compute_fetch_jobs($1, $2, $3, $4, $5, $6::text[])`

// riverFetch, when set, makes a shard queue's fetch River's own statement, as
// before the tenancy module: only for the benchmark that measures what
// compute_fetch_jobs costs work of no tenant (export_test.go).
var riverFetch atomic.Bool

// JobGetAvailable is River's fetch of a queue's jobs; a shard queue's is
// compute_fetch_jobs.
func (e *settingsExecutor) JobGetAvailable(ctx context.Context, params *riverdriver.JobGetAvailableParams) (*riverdriver.JobGetAvailableResult, error) {
	if !strings.HasPrefix(params.Queue, jobs.ShardQueuePrefix) || e.pool == nil || riverFetch.Load() {
		return e.Executor.JobGetAvailable(ctx, params)
	}
	now := time.Now().UTC()
	if params.Now != nil {
		now = *params.Now
	}
	rows, err := e.pool.Query(ctx, fetchSQL, params.Queue, params.MaxToLock, now, params.ClientID, params.MaxAttemptedBy, params.Kind)
	if err != nil {
		return nil, err
	}
	res := &riverdriver.JobGetAvailableResult{}
	for rows.Next() {
		j, err := scanJob(rows)
		if j != nil {
			res.Jobs = append(res.Jobs, j)
		}
		if err != nil {
			if j == nil {
				rows.Close()
				return nil, err
			}
			if res.DecodeErrors == nil {
				res.DecodeErrors = map[int64]error{}
			}
			res.DecodeErrors[j.ID] = err
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return res, nil
}

// scanJob reads a job row of fetchSQL as River's driver does: a row that does
// not decode whole is returned with the error, its attempt failed by River.
func scanJob(rows pgx.Rows) (*rivertype.JobRow, error) {
	var (
		j      rivertype.JobRow
		errs   [][]byte
		state  string
		unique *int32
	)
	if err := rows.Scan(&j.ID, &j.EncodedArgs, &j.Attempt, &j.AttemptedAt, &j.AttemptedBy, &j.CreatedAt, &errs,
		&j.FinalizedAt, &j.Kind, &j.MaxAttempts, &j.Metadata, &j.Priority, &j.Queue, &state, &j.ScheduledAt,
		&j.Tags, &j.UniqueKey, &unique); err != nil {
		return nil, err
	}
	j.State = rivertype.JobState(state)
	j.CreatedAt, j.ScheduledAt = j.CreatedAt.UTC(), j.ScheduledAt.UTC()
	if j.AttemptedAt != nil {
		t := j.AttemptedAt.UTC()
		j.AttemptedAt = &t
	}
	if j.FinalizedAt != nil {
		t := j.FinalizedAt.UTC()
		j.FinalizedAt = &t
	}
	if unique != nil {
		j.UniqueStates = uniquestates.UniqueBitmaskToStates(byte(*unique))
	}
	j.Errors = make([]rivertype.AttemptError, len(errs))
	for i, raw := range errs {
		if err := riverdriver.UnmarshalAttemptError(raw, &j.Errors[i]); err != nil {
			j.Errors = nil
			return &j, fmt.Errorf("error unmarshaling `errors`: %w", err)
		}
	}
	return &j, nil
}
